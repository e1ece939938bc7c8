//! The `roce-agent` command line: the clap types of the whole command, the exit codes,
//! and one file per subcommand, each owning its `Args` and what it does. The `run`
//! daemon itself is `crate::daemon`: `run.rs` only turns its flags into a
//! [`crate::daemon::Launch`].
//!
//! Exit codes: 0 success, 1 runtime error (no BPF permission, no agent answering at a
//! well-formed address, an attach refused, ...), 2 usage or configuration error (a bad
//! flag or file, an interface the host does not have, an address that is not one).
//!
//! May import every module of the crate; nothing imports it.

pub mod analyze;
pub mod api_args;
pub mod check;
pub mod detach;
pub mod events;
pub mod flows;
pub mod qps;
pub mod run;
pub mod top;

use clap::{Parser, Subcommand};

use crate::api::client::ClientError;
use crate::config::{ConfigError, LogFormat};
pub use crate::daemon::error_text;
use crate::daemon::RunError;

use analyze::AnalyzeArgs;
use check::CheckArgs;
use detach::DetachArgs;
use events::EventsArgs;
use flows::FlowsArgs;
use qps::QpsArgs;
use run::RunArgs;

/// Exit code of a runtime error.
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code of a usage or configuration error (clap uses it too).
pub const EXIT_USAGE: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "roce-agent",
    version,
    about = "eBPF host dataplane agent for RoCEv2 fabrics: per-queue-pair flow visibility",
    long_about = "eBPF host dataplane agent for RoCEv2 fabrics.\n\n\
        `run` attaches an XDP classifier to interfaces and counts every RoCEv2 queue pair \
        it sees (plain or in VXLAN): packets, bytes, ECN marks, CNPs, ACK/NAK/RNR NAKs and \
        PSN gaps; tc programs apply the host DSCP policy on egress (audit or enforce) and \
        carry inner DSCP/ECN to the outer header on VTEP underlays. `flows` shows what a \
        running agent counted and did; `qps` the host's queue pairs (RDMA netlink) with \
        their owners and what the wire showed of them.\n\n\
        Exit status: 0 success, 1 runtime error, 2 usage or configuration error."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach the classifier to interfaces and serve the flow table over HTTP
    #[command(after_help = "Examples:\n  \
        roce-agent run --iface eth1\n  \
        roce-agent run --iface eth1 --iface eth2 --listen 127.0.0.1:9473\n  \
        roce-agent run --config /etc/roce-agent/host.toml\n  \
        roce-agent run --iface eth1 --mode enforce          # rewrite DSCPs, set skb->priority\n  \
        roce-agent run --iface eth1 --vtep eth0             # VXLAN outer DSCP/ECN from the inner\n  \
        roce-agent run --iface eth1 --peer 198.18.0.2       # the path to it must carry the MTU\n  \
        roce-agent run --iface eth1 --listen :9473 --log-format json   # every address; JSON logs\n\n\
        Flags override the config file; with no file, defaults apply. The datapath (maps, \
        programs, links) is pinned under --pin-dir: it goes on classifying and enforcing when \
        the agent exits or is killed, and a restarted agent adopts it with its counters \
        (`roce-agent detach` removes it; --no-pin detaches at exit instead). SIGHUP reads the \
        config file again: validated in full, then applied at once (the DSCP policy switches \
        atomically; interfaces added or removed are attached or detached); a bad file is \
        refused with FILE:LINE:COLUMN and the configuration in force stays (without --config \
        there is nothing to reload, and the reload metrics stay as they are). SIGINT or \
        SIGTERM end the agent (exit 0). Needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (root \
        has them).\n\n\
        Logs go to stderr: --log-format text (for people), json (an object a line: ts, level, \
        target, msg, then the fields) or logfmt (the same keys as key=value, a value with a \
        space, = or \" quoted). Every record is one line in json and logfmt (a refused \
        file's caret block is its excerpt field); with stderr on the systemd journal \
        (JOURNAL_STREAM), text and logfmt have no timestamp. RUST_LOG sets the level \
        (default info).\n\n\
        Exit status: 0 after SIGINT or SIGTERM, 1 runtime error, 2 usage or configuration \
        error (a missing interface included).")]
    Run(RunArgs),
    /// Remove the pinned datapath: every program, link and pin that `run` left behind
    #[command(after_help = "Examples:\n  \
        roce-agent detach\n  \
        roce-agent detach --pin-dir /sys/fs/bpf/roce-agent-test\n\n\
        Detaches the XDP and TCX links pinned under --pin-dir (classification and enforcement \
        stop), then removes the program and map pins (the counters go with them) and the \
        directory. Refuses while an agent runs with that directory: stop it first. Nothing \
        else is touched: other programs, qdiscs, the bpffs mount. Exit 0 also when nothing \
        was pinned.")]
    Detach(DetachArgs),
    /// Print the flow table of a running agent (GET /flows)
    #[command(after_help = flows::AFTER_HELP)]
    Flows(FlowsArgs),
    /// Analyze a pcap or pcapng capture: the flow table, ICRC checks and findings
    #[command(after_help = "Examples:\n  \
        roce-agent analyze mirror.pcap\n  \
        roce-agent analyze fabric.pcapng --json | jq '.findings[]'\n  \
        roce-agent analyze big.pcap --lossless-dscp 24,26 --cnp-dscp 56\n  \
        roce-agent analyze mirror.pcap --engine kernel\n  \
        tcpdump -i any -w - udp port 4791 | roce-agent analyze -\n\n\
        Classifies every frame with the live agent's classifier and counting rules: by default \
        the reference classifier (the same code the XDP program runs), on every CPU; \
        `--engine kernel` runs each frame through the real XDP program with BPF_PROG_TEST_RUN \
        (root needed, slower). Both print the same report. Reads Ethernet captures and Linux \
        cooked captures (`tcpdump -i any`: link types 113 and 276); `-` reads standard input.\n\n\
        Exit status: 1 when a finding is at the --fail-on level or above (default error) or \
        the capture is truncated or corrupt (the flows read until then are still printed), \
        2 usage or configuration error.")]
    Analyze(AnalyzeArgs),
    /// Audit this host for RoCE: MTU, VXLAN headroom, path MTU to peers, DCB app table and PFC, RNIC ECN knobs
    #[command(after_help = "Examples:\n  \
        roce-agent check                              # the interfaces that carry RoCE\n  \
        roce-agent check --iface eth1 --mtu 9000\n  \
        roce-agent check --iface eth1 --peer 198.18.0.2 --peer 2001:db8::2\n  \
        roce-agent check --config /etc/roce-agent/host.toml --json | jq '.findings[]'\n  \
        roce-agent check --iface eth1 --dry-run       # the commands --fix would run\n  \
        roce-agent check --iface eth1 --fix           # set what can be set, then audit again\n\n\
        Checks: mtu, vxlan_overhead (50 bytes over IPv4, 70 over IPv6), mtu_path (DF probes \
        to --peer; the path MTU learnt from ICMP), dcb_app and pfc (the NIC's DSCP -> priority \
        app table and PFC against the policy; dcb_unsupported on devices without DCB), ecn_np, \
        ecn_rp, cnp_dscp (RNIC ECN knobs in sysfs), roce_tos (rdma_cm default ToS).\n\n\
        Without --iface it audits the config file's interfaces and VTEPs, else the interfaces \
        that carry RoCE: the netdevs of RDMA devices (/sys/class/infiniband), VXLAN devices \
        and their underlays; the first line says which and why. The policy (DSCPs, lossless \
        set, DSCP -> priority) is the config's [qos] table or the defaults (RoCE 26, CNP 48, \
        lossless {26}, priority = DSCP >> 3). Reading needs no privilege. --fix changes only \
        interfaces named by --iface or the config (without them it is refused, exit 2) and \
        needs CAP_NET_ADMIN (MTU, DCB) and write access to sysfs; --dry-run prints the \
        commands --fix would run and changes nothing. --json is compact; --pretty indents it.\n\n\
        Exit status: 0 no finding at error level, 1 at least one, 2 the audit could not run \
        or a usage error (--fix without named interfaces included).")]
    Check(CheckArgs),
    /// Follow a running agent's sampled events (CE, CNP, NAK, RNR NAK, PSN gap): lines, JSON lines or pcapng
    #[command(after_help = events::AFTER_HELP)]
    Events(EventsArgs),
    /// Live view of a running agent's flows, worst first, refreshed every interval (like top)
    #[command(after_help = top::AFTER_HELP)]
    Top(top::TopArgs),
    /// Print the QP table of a running agent (GET /qps): each queue pair with its owner and what the wire showed of it
    #[command(after_help = qps::AFTER_HELP)]
    Qps(QpsArgs),
}

/// The exit code for an error: 2 when it is a usage or configuration error (a bad
/// file or flag, an interface the host does not have, an agent address that is not
/// one), 1 otherwise.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    let usage = e.chain().any(|c| {
        c.downcast_ref::<ConfigError>().is_some()
            || c.downcast_ref::<crate::audit::AuditError>().is_some()
            || matches!(c.downcast_ref(), Some(RunError::NoInterface(_)))
            || c.downcast_ref::<ClientError>()
                .is_some_and(ClientError::is_usage)
    });
    if usage {
        EXIT_USAGE
    } else {
        EXIT_RUNTIME
    }
}

/// Says why the command failed, on stderr: `roce-agent: error: ...`, or, while `run`
/// logs as JSON or logfmt, one error record (`error`, `excerpt` for a refused file's
/// caret block, `exit_code`).
pub fn report(e: &anyhow::Error) {
    let code = exit_code(e);
    match crate::daemon::log::in_force() {
        LogFormat::Text => eprintln!("roce-agent: error: {}", error_text(e)),
        LogFormat::Json | LogFormat::Logfmt => {
            let (error, excerpt) = crate::daemon::error_parts(e);
            tracing::error!(
                error = %error,
                excerpt = excerpt.as_deref().map(tracing::field::display),
                exit_code = code,
                "roce-agent: error"
            );
        }
    }
}

/// Runs one parsed command line.
pub fn execute(cli: Cli) -> anyhow::Result<()> {
    // `run` starts its log itself, once it knows the format its config file asks for.
    if !matches!(cli.command, Command::Run(_)) {
        crate::daemon::log::init(LogFormat::Text);
    }
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Flows(args) => flows::flows(args),
        Command::Analyze(args) => analyze::analyze(args),
        Command::Check(args) => check::check(args),
        Command::Events(args) => events::events(args),
        Command::Top(args) => top::top(args),
        Command::Qps(args) => qps::qps(args),
        Command::Detach(args) => detach::detach(args),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    #[test]
    fn top_is_a_subcommand_with_the_documented_defaults() {
        use clap::Parser as _;
        let cli = Cli::try_parse_from(["roce-agent", "top"]).unwrap();
        match cli.command {
            Command::Top(t) => {
                assert_eq!(t.api.addr, "127.0.0.1:9473");
                assert_eq!(t.interval, 1.0);
            }
            other => panic!("{other:?}"),
        }
    }

    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_repeated_ifaces() {
        let cli = Cli::try_parse_from([
            "roce-agent",
            "run",
            "--iface",
            "a",
            "--iface",
            "b",
            "--listen",
            "127.0.0.1:1",
            "--interval",
            "0.5",
        ])
        .unwrap();
        match cli.command {
            Command::Run(r) => {
                assert_eq!(r.iface, vec!["a", "b"]);
                assert_eq!(r.listen.as_deref(), Some("127.0.0.1:1"));
                assert_eq!(r.interval, Some(0.5));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flows_defaults_to_the_documented_port() {
        let cli = Cli::try_parse_from(["roce-agent", "flows"]).unwrap();
        match cli.command {
            Command::Flows(f) => {
                assert_eq!(f.api.addr, "127.0.0.1:9473");
                assert!(!f.json);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn config_errors_exit_2_and_others_1() {
        let e: anyhow::Error = ConfigError::Invalid {
            origin: crate::config::Origin::Missing,
            field: "interfaces",
            message: "x".into(),
        }
        .into();
        assert_eq!(exit_code(&e.context("outer")), EXIT_USAGE);
        let e: anyhow::Error = RunError::NoInterface(vec!["x".into()]).into();
        assert_eq!(exit_code(&e.context("starting")), EXIT_USAGE);
        let e: anyhow::Error = crate::audit::AuditError::NoInterface(vec!["x".into()]).into();
        assert_eq!(exit_code(&e), EXIT_USAGE);
        let address = crate::api::client::get_body("9473", "/flows", Duration::from_secs(1));
        let e: anyhow::Error = address.unwrap_err().into();
        assert_eq!(exit_code(&e), EXIT_USAGE, "{e}");
        let e: anyhow::Error = ClientError::Connect {
            addr: "127.0.0.1:1".into(),
            error: std::io::ErrorKind::ConnectionRefused.into(),
        }
        .into();
        assert_eq!(exit_code(&e), EXIT_RUNTIME);
        assert_eq!(exit_code(&anyhow::anyhow!("attach refused")), EXIT_RUNTIME);
    }

    #[test]
    fn client_addresses_are_checked_when_parsed_and_colon_port_is_this_host() {
        let cli = Cli::try_parse_from(["roce-agent", "flows", "--api", ":9474"]).unwrap();
        match cli.command {
            Command::Flows(f) => assert_eq!(f.api.addr, "127.0.0.1:9474"),
            other => panic!("{other:?}"),
        }
        for sub in ["flows", "events", "top", "qps"] {
            let e = Cli::try_parse_from(["roce-agent", sub, "--api", "9473"]).unwrap_err();
            assert_eq!(e.exit_code(), i32::from(EXIT_USAGE), "{sub}: {e}");
            assert!(e.to_string().contains("is not HOST:PORT"), "{sub}: {e}");
        }
    }

    #[test]
    fn run_takes_peers_and_a_log_format() {
        let cli = Cli::try_parse_from([
            "roce-agent",
            "run",
            "--iface",
            "a",
            "--peer",
            "198.18.0.2",
            "--peer",
            "2001:db8::2",
            "--log-format",
            "logfmt",
        ])
        .unwrap();
        match cli.command {
            Command::Run(r) => {
                assert_eq!(r.peer.len(), 2);
                assert_eq!(r.log_format, Some(LogFormat::Logfmt));
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["roce-agent", "run", "--peer", "host"]).is_err());
        assert!(Cli::try_parse_from(["roce-agent", "run", "--log-format", "xml"]).is_err());
    }
}
