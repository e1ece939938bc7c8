//! `roce-agent events`: follows a running agent's sampled events (`GET /events`) as
//! human lines, JSON lines or pcapng.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use super::api_args::{api_help, ApiClientArgs};
use crate::config::ConfigError;

/// The text after `roce-agent events --help`'s options.
pub const AFTER_HELP: &str = concat!(
    "Examples:\n  \
    roce-agent events                                  # human lines until Ctrl-C\n  \
    roce-agent events --kind ce,cnp --duration 60\n  \
    roce-agent events --json | jq 'select(.kind == \"nak\")'\n  \
    roce-agent events --pcapng ce.pcapng --kind ce --duration 30 && wireshark ce.pcapng\n  \
    roce-agent events --api https://agent1:9473 --ca-file ca.pem --cert-file me.crt --key-file me.key\n\n\
    Follows GET /events of the agent at --api. The agent samples 1 in N events of each \
    kind (run --events-sample N) and rate-limits them per CPU; each event carries its \
    packet's headers up to the last transport header (BTH and its extended headers; \
    the inner ones in VXLAN), without payload unless the agent's config sets \
    events_payload_bytes. With --pcapng the packets go to the file (one \
    interface block per interface, nanosecond timestamps, a comment naming the kind) \
    and a count to stderr. A reader too slow for the event rate loses the oldest events \
    and is told how many.\n\n",
    api_help!()
);

#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub api: ApiClientArgs,
    /// Print each event as a JSON line, as GET /events serves it
    #[arg(long, conflicts_with = "pcapng")]
    pub json: bool,
    /// Write the events' packets to this pcapng file instead of printing them
    #[arg(long, value_name = "FILE")]
    pub pcapng: Option<PathBuf>,
    /// Stop after this many seconds [default: follow until Ctrl-C or the agent stops]
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Only these kinds, comma-separated: ce, cnp, nak, rnr_nak, psn_gap
    #[arg(long, value_name = "KIND,...", value_delimiter = ',', value_parser = parse_kind)]
    pub kind: Vec<crate::doc::event::EventKind>,
}

fn parse_kind(s: &str) -> Result<crate::doc::event::EventKind, String> {
    crate::doc::event::EventKind::from_name(s).ok_or_else(|| {
        format!(
            "unknown event kind {s:?}: use {}",
            crate::doc::event::EventKind::ALL
                .map(crate::doc::event::EventKind::name)
                .join(", ")
        )
    })
}

/// `roce-agent events`.
pub fn events(args: EventsArgs) -> anyhow::Result<()> {
    use crate::api::client::Line;
    use crate::doc::event;
    use std::io::Write as _;

    let duration = match args.duration {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => {
            return Err(ConfigError::Invalid {
                origin: crate::config::Origin::Flag("--duration"),
                field: "duration",
                message: format!("{s} is out of range (more than 0, at most 86400 seconds)"),
            }
            .into())
        }
    };
    let kinds = args.kind;
    let client = args.api.client()?;
    let mut pcap = match &args.pcapng {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            Some(crate::doc::pcapng::EventPcapng::new(
                std::io::BufWriter::new(file),
            )?)
        }
        None => None,
    };
    let mut out = std::io::stdout().lock();
    let mut written = 0u64;
    let mut lost = 0u64;
    let mut failure: Option<anyhow::Error> = None;
    client.follow(&kinds, duration, |line| {
        let result = match line {
            Line::Lagged(n) => {
                lost += n;
                eprintln!("roce-agent events: {n} events lost (this reader was too slow)");
                Ok(())
            }
            Line::Event(ev) => {
                written += 1;
                if let Some(p) = pcap.as_mut() {
                    p.write(&ev).map_err(anyhow::Error::from)
                } else if args.json {
                    serde_json::to_string(&ev)
                        .map_err(anyhow::Error::from)
                        .and_then(|t| writeln!(out, "{t}").map_err(anyhow::Error::from))
                } else {
                    writeln!(out, "{}", event::human_line(&ev)).map_err(anyhow::Error::from)
                }
            }
        };
        match result {
            Ok(()) => true,
            Err(e) => {
                failure = Some(e);
                false
            }
        }
    })?;
    if let Some(p) = pcap {
        p.into_inner().flush().with_context(|| {
            format!(
                "writing {}",
                args.pcapng
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            )
        })?;
        eprintln!(
            "roce-agent events: {written} events written to {}{}",
            args.pcapng
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display(),
            if lost > 0 {
                format!(" ({lost} lost)")
            } else {
                String::new()
            }
        );
    }
    match failure {
        // `| head` closed the pipe: done, not an error.
        Some(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        Some(e) => Err(e),
        None => Ok(()),
    }
}
