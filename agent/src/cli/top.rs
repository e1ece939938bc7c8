//! `roce-agent top`: its flags and keys' help; the view itself is `crate::top`.

use std::time::Duration;

use super::api_args::{api_help, ApiClientArgs};

/// Shortest and longest refresh interval accepted.
const MIN_INTERVAL_S: f64 = 0.1;
const MAX_INTERVAL_S: f64 = 3600.0;

/// The text after `roce-agent top --help`'s options.
pub const AFTER_HELP: &str = concat!(
    "Examples:\n  \
    roce-agent top\n  \
    roce-agent top --api 127.0.0.1:9473 --interval 2\n  \
    roce-agent top --api https://agent1:9473 --ca-file ca.pem --auth-file ~/.roce-agent-auth\n\n\
    Keys:\n  \
    p            sort by problems: CE + CNPs + NAKs + RNR NAKs + PSN gaps (default)\n  \
    c            sort by CE ratio\n  \
    n            sort by CNPs/s\n  \
    b            sort by bits/s\n  \
    r            reverse the order\n  \
    /            filter rows: interface, address, VNI, QP or owner (Enter keeps, Esc clears)\n  \
    o            the hardware-only QPs (the agent's QP table, never seen on the wire), and back\n  \
    Up/Down      scroll one line (also k/j)\n  \
    PgUp/PgDn    scroll one page\n  \
    Home/End     first/last flow (also g/G)\n  \
    q, Esc, Ctrl-C  quit\n\n\
    Every sort looks at the rates over the agent's last interval first and then at the \
    totals since the flow was first seen, so flows with problems now come first. A rate \
    the agent has not computed (yet) shows as \"-\". When the agent stops answering, the \
    header says so and the last answer stays on screen; the view keeps trying. The \
    owner column names the local process of each flow's queue pair (command, and pod UID \
    in a pod); a header line says what the agent sees of RoCE on each interface \
    (kernel_path, offloaded, mirror, none). An agent without GET /qps shows no owners.\n\n",
    api_help!(),
    "\n\n\
    Exit status: 0 on quit, 1 when stdout is not a terminal or the terminal fails, 2 usage \
    error (an unreadable or invalid --ca-file, --cert-file, --key-file or --auth-file)."
);

/// `roce-agent top`'s options.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub api: ApiClientArgs,
    /// Seconds between two refreshes
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&secs) {
        Ok(secs)
    } else {
        Err(format!(
            "the interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} seconds"
        ))
    }
}

/// `roce-agent top`.
pub fn top(args: TopArgs) -> anyhow::Result<()> {
    crate::top::top(args.api.client()?, Duration::from_secs_f64(args.interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_must_be_sane() {
        assert_eq!(parse_interval("0.5"), Ok(0.5));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("-1").is_err());
        assert!(parse_interval("NaN").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
