//! `roce-agent analyze`: a capture's flow table, ICRC checks and findings.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::config::{ConfigFile, Overrides, Settings};
use crate::datapath::loader;

use super::check::FindingsAtErrorLevel;
use crate::doc::finding::Severity;

/// The finding level at which `analyze` exits 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailOn {
    /// A finding at error level
    Error,
    /// A finding at warning or error level
    Warning,
    /// Never (a truncated or corrupt capture still exits 1)
    Never,
}

impl FailOn {
    /// Whether a finding of `severity` fails the run.
    pub fn fails(self, severity: Severity) -> bool {
        match self {
            FailOn::Error => severity >= Severity::Error,
            FailOn::Warning => severity >= Severity::Warning,
            FailOn::Never => false,
        }
    }
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// The capture (pcap or pcapng; Ethernet or Linux cooked, `tcpdump -i any`), `-` for standard input
    #[arg(value_name = "CAPTURE")]
    pub capture: PathBuf,
    /// Print the JSON document (the flow document plus `capture`, `icrc_errors` and `findings`), on one line
    #[arg(long)]
    pub json: bool,
    /// Indent the JSON document (with --json)
    #[arg(long, requires = "json")]
    pub pretty: bool,
    /// Exit 1 when a finding is at this level or above
    #[arg(long, value_enum, value_name = "LEVEL", default_value_t = FailOn::Error)]
    pub fail_on: FailOn,
    /// TOML configuration file: roce_port, vxlan_port, default_pmtu, flows_map_size apply
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Classifier engine [default: reference; kernel: the XDP program through BPF_PROG_TEST_RUN, needs root]
    #[arg(long, value_enum)]
    pub engine: Option<crate::analyze::Engine>,
    /// Worker threads, the flows split between them by hash [default: one per CPU]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub workers: Option<u16>,
    /// DSCPs of the lossless (PFC) class, comma-separated [default: the config's [qos] lossless_dscps, else 26]
    #[arg(long, value_name = "DSCP[,DSCP...]", value_delimiter = ',',
          value_parser = clap::value_parser!(u8).range(0..64))]
    pub lossless_dscp: Vec<u8>,
    /// The DSCP CNPs should carry [default: the config's [qos] cnp_dscp, else 48]
    #[arg(long, value_name = "DSCP",
          value_parser = clap::value_parser!(u8).range(0..64))]
    pub cnp_dscp: Option<u8>,
}

/// `roce-agent analyze`.
pub fn analyze(args: AnalyzeArgs) -> anyhow::Result<()> {
    use crate::analyze::{self, AnalyzeOptions};
    use std::io::Write as _;

    let file = args.config.as_deref().map(ConfigFile::load).transpose()?;
    let settings = Settings::resolve(file.as_ref(), &Overrides::default(), false)?;
    // The config's [qos] policy (or the defaults), the flags over it.
    let mut policy = settings.policy;
    if !args.lossless_dscp.is_empty() {
        policy.set_lossless(&args.lossless_dscp);
    }
    if let Some(d) = args.cnp_dscp {
        policy.qos.cnp_dscp = d;
    }
    let opts = AnalyzeOptions {
        engine: args.engine,
        load: loader::LoadOptions::for_settings(&settings),
        policy,
        verdicts: settings.verdicts,
        progress: true,
        workers: args.workers.map(usize::from),
    };
    let input = analyze::Input::from_arg(&args.capture);
    let analysis = analyze::analyze_input(&input, &opts)?;
    tracing::debug!(engine = %analysis.engine, frames = analysis.report.capture.frames, "analyzed");
    let text = if args.json {
        let mut t = if args.pretty {
            serde_json::to_string_pretty(&analysis.report)
        } else {
            serde_json::to_string(&analysis.report)
        }
        .context("encoding JSON")?;
        t.push('\n');
        t
    } else {
        analyze::render(&analysis.report, analysis.engine)
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(e).context("writing to stdout"),
    }
    // A capture that could not be read to its end fails whatever --fail-on says.
    if let Some(e) = analysis.error {
        return Err(e.into());
    }
    // The output names the findings: exit 1 without a second message (main.rs).
    let failing = analysis
        .report
        .findings
        .iter()
        .filter(|f| args.fail_on.fails(f.severity))
        .count();
    if failing > 0 {
        return Err(FindingsAtErrorLevel { errors: failing }.into());
    }
    Ok(())
}
