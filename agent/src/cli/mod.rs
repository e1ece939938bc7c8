//! The `roce-agent` command line: its arguments (clap) and what each subcommand does.
//!
//! Exit codes: 0 success, 1 runtime error (no such interface, no BPF permission, no
//! agent answering, ...), 2 usage or configuration error.

pub mod check;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use clap::{Args, Parser, Subcommand};
use tokio::sync::watch;

use crate::api;
use crate::config::{ConfigError, ConfigFile, Overrides, Settings, DEFAULT_LISTEN};
use crate::datapath::attach::Attachments;
use crate::datapath::loader;
use crate::doc::table;
use crate::doc::Document;
use crate::sys::netif;
use crate::telemetry::collector::Collector;

/// Exit code of a runtime error.
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code of a usage or configuration error (clap uses it too).
pub const EXIT_USAGE: u8 = 2;

/// How long `flows` waits for the agent.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long each of the running agent's path probes waits.
const AUDIT_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a shutdown waits for open API connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

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
        running agent counted and did.\n\n\
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
        roce-agent run --iface eth1 --vtep eth0             # VXLAN outer DSCP/ECN from the inner\n\n\
        Flags override the config file; with no file, defaults apply. The datapath (maps, \
        programs, links) is pinned under --pin-dir: it goes on classifying and enforcing when \
        the agent exits or is killed, and a restarted agent adopts it with its counters \
        (`roce-agent detach` removes it; --no-pin detaches at exit instead). SIGHUP reads the \
        config file again: validated in full, then applied at once (the DSCP policy switches \
        atomically; interfaces added or removed are attached or detached); a bad file is \
        refused with FILE:LINE:COLUMN and the configuration in force stays. SIGINT or SIGTERM \
        end the agent (exit 0). Needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (root has \
        them). RUST_LOG sets the log level (default info).")]
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
    #[command(after_help = "Examples:\n  \
        roce-agent flows\n  \
        roce-agent flows --json | jq '.flows[] | select(.ecn.ce > 0)'\n  \
        roce-agent flows --api 127.0.0.1:9473")]
    Flows(FlowsArgs),
    /// Analyze a pcap or pcapng capture: the flow table, ICRC checks and findings
    #[command(after_help = "Examples:\n  \
        roce-agent analyze mirror.pcap\n  \
        roce-agent analyze fabric.pcapng --json | jq '.findings[]'\n  \
        roce-agent analyze big.pcap --lossless-dscp 24,26 --cnp-dscp 56\n  \
        roce-agent analyze mirror.pcap --engine kernel\n\n\
        Classifies every frame with the live agent's classifier and counting rules: by default \
        the reference classifier (the same code the XDP program runs), on every CPU; \
        `--engine kernel` runs each frame through the real XDP program with BPF_PROG_TEST_RUN \
        (root needed, slower). Both print the same report. Ethernet captures only. Exit status 1 \
        when the capture is truncated or corrupt (the flows read until then are still printed).")]
    Analyze(AnalyzeArgs),
    /// Audit this host for RoCE: MTU, VXLAN headroom, path MTU to peers, DCB app table and PFC, RNIC ECN knobs
    #[command(after_help = "Examples:\n  \
        roce-agent check                              # every interface that is up\n  \
        roce-agent check --iface eth1 --mtu 9000\n  \
        roce-agent check --iface eth1 --peer 198.18.0.2 --peer 2001:db8::2\n  \
        roce-agent check --config /etc/roce-agent/host.toml --json | jq '.findings[]'\n  \
        roce-agent check --iface eth1 --fix           # set what can be set, then audit again\n\n\
        Checks: mtu, vxlan_overhead (50 bytes over IPv4, 70 over IPv6), mtu_path (DF probes \
        to --peer; the path MTU learnt from ICMP), dcb_app and pfc (the NIC's DSCP -> priority \
        app table and PFC against the policy; dcb_unsupported on devices without DCB), ecn_np, \
        ecn_rp, cnp_dscp (RNIC ECN knobs in sysfs), roce_tos (rdma_cm default ToS).\n\n\
        Without --iface it audits the config file's interfaces and VTEPs, else every interface \
        that is up (loopback excepted). The policy (DSCPs, lossless set, DSCP -> priority) is \
        the config's [qos] table or the defaults (RoCE 26, CNP 48, lossless {26}, priority = \
        DSCP >> 3). Reading needs no privilege; --fix needs CAP_NET_ADMIN (MTU, DCB) and \
        write access to sysfs, and changes only the interfaces audited.\n\n\
        Exit status: 0 no finding at error level, 1 at least one, 2 the audit could not run.")]
    Check(CheckArgs),
    /// Follow a running agent's sampled events (CE, CNP, NAK, RNR NAK, PSN gap): lines, JSON lines or pcapng
    #[command(after_help = "Examples:\n  \
        roce-agent events                                  # human lines until Ctrl-C\n  \
        roce-agent events --kind ce,cnp --duration 60\n  \
        roce-agent events --json | jq 'select(.kind == \"nak\")'\n  \
        roce-agent events --pcapng ce.pcapng --kind ce --duration 30 && wireshark ce.pcapng\n\n\
        Follows GET /events of the agent at --api. The agent samples 1 in N events of each \
        kind (run --events-sample N) and rate-limits them per CPU; each event carries the \
        first 128 bytes of its packet. With --pcapng the packets go to the file (one \
        interface block per interface, nanosecond timestamps, a comment naming the kind) \
        and a count to stderr. A reader too slow for the event rate loses the oldest events \
        and is told how many.")]
    Events(EventsArgs),
    /// Live view of a running agent's flows, worst first, refreshed every interval (like top)
    #[command(after_help = crate::top::AFTER_HELP)]
    Top(crate::top::TopArgs),
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Address of the running agent's API (its --listen)
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_LISTEN)]
    pub api: String,
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

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Interface to audit; repeat for more [default: the config's interfaces and VTEPs, else every interface that is up]
    #[arg(long = "iface", value_name = "IF")]
    pub iface: Vec<String>,
    /// The netdev MTU the RoCE interfaces need [default: the config's `mtu`, else the one carrying the RoCE path MTU (default_pmtu, 4096): 4192]
    #[arg(long, value_name = "BYTES")]
    pub mtu: Option<u32>,
    /// A host whose network path must carry --mtu with DF set (IPv4 or IPv6); repeat for more
    #[arg(long = "peer", value_name = "ADDR")]
    pub peer: Vec<std::net::IpAddr>,
    /// TOML configuration file: interfaces, vteps, mtu, peers, default_pmtu and [qos] apply
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The directory that stands for /sys (fixture trees)
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Apply what can be applied (MTU via netlink, DCB entries, writable sysfs knobs) on the audited interfaces, print each change, then audit again
    #[arg(long)]
    pub fix: bool,
    /// Print {"findings": [...]} (and "changes" with --fix) as JSON
    #[arg(long)]
    pub json: bool,
    /// Seconds a path probe waits for an answer
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub probe_timeout: f64,
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// The capture file (pcap or pcapng, Ethernet link type)
    #[arg(value_name = "CAPTURE")]
    pub capture: PathBuf,
    /// Print the JSON document (the flow document plus `capture`, `icrc_errors` and `findings`)
    #[arg(long)]
    pub json: bool,
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

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Interface to attach to (XDP ingress); repeat for more. Replaces `interfaces` of the config file
    #[arg(long = "iface", value_name = "IF")]
    pub iface: Vec<String>,
    /// Address of the HTTP API (GET /flows, /findings, /metrics) [default: 127.0.0.1:9473, loopback only]
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// TOML configuration file (see configs/*.toml); flags override it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Seconds between two reads of the kernel's flow table [default: 1]
    #[arg(long, value_name = "SECS")]
    pub interval: Option<f64>,
    /// DSCP policy on egress of the --iface interfaces: audit counts what would change, enforce rewrites [default: audit]
    #[arg(long, value_enum, value_name = "MODE")]
    pub mode: Option<crate::config::HostMode>,
    /// VTEP underlay interface: inner DSCP/ECN propagated to the outer header of VXLAN packets leaving it (always rewrites), decap checks on ingress; repeat for more
    #[arg(long = "vtep", value_name = "IF")]
    pub vtep: Vec<String>,
    /// Outer ECN on --vtep interfaces: kernel (as `tos inherit`: inner CE -> ECT(0)) or rfc6040 (copy, CE included) [default: kernel]
    #[arg(long, value_enum, value_name = "MODE")]
    pub ecn_propagation: Option<crate::config::EcnPropagation>,
    /// The netdev MTU the --iface interfaces need: audited every interval (GET /findings), and set back through netlink in --mode enforce [default: the config's `mtu`, else 4192]
    #[arg(long, value_name = "BYTES")]
    pub mtu: Option<u32>,
    /// The directory that stands for /sys in the host audit and the RNIC counters of GET /metrics (fixture trees)
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Probe the path MTU (mtu_path) towards the remote end of every flow counted, each peer at most once a minute (the config's `peers` are always probed)
    #[arg(long)]
    pub probe_flow_peers: bool,
    /// Sampled events (GET /events): keep 1 in N of each kind (CE, CNP, NAK, RNR NAK, PSN gap) per CPU, at most 100 per CPU per 100 ms; 0 emits none [default: the config's `events_sample`, else 1]
    #[arg(long, value_name = "N")]
    pub events_sample: Option<u32>,
    /// Pin maps, programs and links here (a bpffs; mounted on /sys/fs/bpf when none is): the datapath keeps classifying and enforcing when the agent exits, and a restarted agent adopts it with its counters
    #[arg(long, value_name = "DIR", default_value = crate::datapath::pin::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Pin nothing: the programs detach when the agent exits (trials, tests)
    #[arg(long, conflicts_with = "pin_dir")]
    pub no_pin: bool,
    /// Start even when a configured interface does not exist yet, and attach to it when it appears (without it, a missing interface is an error)
    #[arg(long)]
    pub wait_for_interfaces: bool,
}

#[derive(Debug, Args)]
pub struct DetachArgs {
    /// The pin directory of the datapath to remove (run --pin-dir)
    #[arg(long, value_name = "DIR", default_value = crate::datapath::pin::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Print what was removed as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FlowsArgs {
    /// Print the JSON document exactly as the agent served it
    #[arg(long)]
    pub json: bool,
    /// Address of the running agent's API (its --listen)
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_LISTEN)]
    pub api: String,
}

/// Runtime failures of `run` that are not configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no such interface: {}", .0.join(", "))]
    NoInterface(Vec<String>),
}

/// The exit code for an error: 2 when it is a configuration error, 1 otherwise.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| {
        c.downcast_ref::<ConfigError>().is_some()
            || c.downcast_ref::<crate::audit::AuditError>().is_some()
    }) {
        EXIT_USAGE
    } else {
        EXIT_RUNTIME
    }
}

/// One line for an error and its causes, leaving out a cause whose text an earlier
/// message already quotes (many library errors print their source themselves).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Logs to stderr; RUST_LOG filters (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second initialisation (tests) is harmless: keep the first.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs one parsed command line.
pub fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run(args),
        Command::Flows(args) => flows(args),
        Command::Analyze(args) => analyze(args),
        Command::Check(args) => crate::cli::check::check(args),
        Command::Events(args) => events(args),
        Command::Top(args) => crate::top::top(args),
        Command::Detach(args) => detach(args),
    }
}

/// `roce-agent run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let flags = Overrides {
        interfaces: args.iface,
        listen: args.listen,
        interval_secs: args.interval,
        mode: args.mode,
        vteps: args.vtep,
        ecn_propagation: args.ecn_propagation,
        mtu: args.mtu,
        peers: Vec::new(),
        events_sample: args.events_sample,
    };
    let launch = Launch {
        config: args.config,
        flags,
        sysfs_root: args.sysfs_root,
        probe_flow_peers: args.probe_flow_peers,
        pin_dir: (!args.no_pin).then_some(args.pin_dir),
        wait_for_interfaces: args.wait_for_interfaces,
    };
    let settings = launch.settings()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(serve(launch, settings))
}

/// What `run` was started with: read again on every reload.
struct Launch {
    config: Option<PathBuf>,
    flags: Overrides,
    sysfs_root: PathBuf,
    probe_flow_peers: bool,
    /// None: `--no-pin`.
    pin_dir: Option<PathBuf>,
    /// A configured interface that is missing is waited for instead of refused.
    wait_for_interfaces: bool,
}

impl Launch {
    /// The settings of the config file and the flags, validated in full, with every
    /// interface present (unless `--wait-for-interfaces`).
    fn settings(&self) -> anyhow::Result<Settings> {
        let file = self.config.as_deref().map(ConfigFile::load).transpose()?;
        let settings = Settings::resolve(file.as_ref(), &self.flags, true)?;
        let missing: Vec<String> = settings
            .interfaces
            .iter()
            .chain(settings.vteps.iter())
            .filter(|i| netif::index_of(i).is_none())
            .cloned()
            .collect();
        if missing.is_empty() || self.wait_for_interfaces {
            return Ok(settings);
        }
        // A name from the file is a configuration error: say where it is.
        if let Some((origin, field)) = file
            .as_ref()
            .and_then(|f| missing.iter().find_map(|m| f.interface_origin(m)))
        {
            return Err(ConfigError::Invalid {
                origin,
                field,
                message: format!(
                    "no such interface: {} (run --wait-for-interfaces waits for it)",
                    missing.join(", ")
                ),
            }
            .into());
        }
        Err(RunError::NoInterface(missing).into())
    }

    /// The host audit as `settings` asks for it: at start and every interval, in its
    /// own task (a slow audit never delays the flow table); MTUs set back in enforce
    /// mode when an MTU was asked for.
    fn auditor(&self, settings: &Settings) -> crate::daemon::audit_task::Watcher {
        let enforce_mtu =
            settings.mode == crate::config::HostMode::Enforce && settings.mtu.is_some();
        let peers = crate::daemon::audit_task::PeerPolicy {
            configured: settings.peers.clone(),
            from_flows: self.probe_flow_peers,
        };
        crate::daemon::audit_task::Watcher::new(
            crate::cli::check::audit_options(settings, &self.sysfs_root, AUDIT_PROBE_TIMEOUT),
            peers,
            enforce_mtu,
        )
    }
}

/// Loads the kernel side, pinned under `pin_dir` (adopting what is pinned there) or
/// not at all.
fn load_datapath(settings: &Settings, pin_dir: Option<&Path>) -> anyhow::Result<loader::Loaded> {
    let opts = loader::LoadOptions::for_settings(&settings);
    note_flow_table_memory(opts.flows_max_entries);
    let Some(dir) = pin_dir else {
        return loader::load(&opts).context("loading the kernel programs");
    };
    let pins = crate::datapath::pin::PinDir::prepare(dir)
        .with_context(|| format!("preparing the pin directory {}", dir.display()))?;
    loader::load_pinned(&opts, pins).context("loading the kernel programs")
}

/// Says what the flow table costs in kernel memory, and warns when that is more than a
/// sixteenth of the host's (it is allocated in full at start: about 500 bytes a flow).
fn note_flow_table_memory(entries: u32) {
    let Ok(cpus) = aya::util::nr_cpus() else {
        return;
    };
    let bytes = loader::flow_tables_kernel_bytes(entries, cpus);
    let mib = bytes / (1 << 20);
    match mem_total_bytes() {
        Some(total) if bytes > total / 16 => tracing::warn!(
            flows_map_size = entries,
            possible_cpus = cpus,
            kernel_mib = mib,
            host_mib = total / (1 << 20),
            "the flow table takes over a sixteenth of this host's memory (it is allocated in full at start): a smaller flows_map_size lowers it"
        ),
        _ => tracing::info!(
            flows_map_size = entries,
            possible_cpus = cpus,
            kernel_mib = mib,
            "flow tables"
        ),
    }
}

/// MemTotal of /proc/meminfo, in bytes.
fn mem_total_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&meminfo)
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

async fn serve(launch: Launch, mut settings: Settings) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing a SIGHUP handler")?;

    // Claim the API address before attaching anything, so a busy port changes nothing.
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let local = listener
        .local_addr()
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    if !local.ip().is_loopback() {
        tracing::warn!(listen = %local, "the API (flows, findings, metrics, events) is reachable from other hosts: it has no authentication; bind it to loopback unless a firewall or a scraper needs it");
    }

    let pin_dir = launch.pin_dir.as_deref();
    // A datapath pinned earlier is adopted; one made now is removed again should the
    // start fail, so that a refused start leaves nothing behind.
    let fresh = pin_dir.is_none_or(|d| !crate::datapath::pin::holds_datapath(d));
    let loaded = match load_datapath(&settings, pin_dir) {
        Ok(l) => l,
        Err(e) => {
            // Maps may be pinned already (a verifier refusal comes after them); but
            // a directory another agent holds is that agent's.
            let busy = e.chain().any(|c| {
                matches!(
                    c.downcast_ref(),
                    Some(crate::datapath::pin::PinError::Busy(_))
                )
            });
            remove_fresh_datapath(fresh && !busy, pin_dir);
            return Err(e);
        }
    };
    let mut collector = Collector::new(loaded);
    let mut attachments = Attachments::new(crate::datapath::qos::TcMechanism::Auto);
    if let Err(e) = attachments.apply(collector.loaded_mut(), &settings) {
        attachments.release(collector.loaded_mut());
        drop(collector);
        remove_fresh_datapath(fresh, pin_dir);
        return Err(anyhow!(e));
    }
    match pin_dir {
        Some(dir) if fresh => {
            tracing::info!(pin_dir = %dir.display(), "datapath pinned: it keeps running when the agent exits")
        }
        Some(dir) => {
            tracing::info!(pin_dir = %dir.display(), "adopted the pinned datapath: counters continue")
        }
        None => tracing::info!("--no-pin: the datapath goes when the agent exits"),
    }

    let first = match collector.poll() {
        Ok(p) => p.document,
        Err(e) => {
            tracing::warn!(error = %e, "reading the flow table failed");
            Arc::new(crate::telemetry::live::LiveDocument::default())
        }
    };
    let (tx, rx) = watch::channel(first);

    let mut auditor = launch.auditor(&settings);
    let findings = tokio::task::block_in_place(|| auditor.round(None));
    let (findings_tx, findings_rx) =
        watch::channel(Arc::new(crate::doc::finding::Findings { findings }));
    let findings_tx = Arc::new(findings_tx);
    let mut audit_task = tokio::spawn(crate::daemon::audit_task::every(
        auditor,
        settings.interval,
        rx.clone(),
        findings_tx.clone(),
    ));

    // Sampled events from the kernel programs; GET /events subscribes here.
    let events = start_events(collector.loaded_mut(), &settings);
    let events_sample = Arc::new(std::sync::atomic::AtomicU32::new(settings.events_sample));
    let reloads = Arc::new(crate::telemetry::metrics::ReloadCounts::default());
    let exporter = Arc::new(crate::telemetry::metrics::Exporter {
        host: std::sync::RwLock::new(crate::telemetry::metrics::HostSources {
            sysfs_root: launch.sysfs_root.clone(),
            interfaces: settings.tc_interfaces(),
        }),
        top_flows: settings.top_flows,
        reloads: reloads.clone(),
        events_ring: events.as_ref().and_then(|e| e.progress.clone()),
    });
    let feed = events.map(|e| api::server::EventFeed {
        sender: e.sender,
        sample: events_sample.clone(),
    });
    let routes = api::server::router(rx.clone(), findings_rx.clone(), feed).merge(
        api::server::metrics_router(rx.clone(), findings_rx, exporter.clone()),
    );

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(async move {
        axum::serve(listener, routes)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });
    tracing::info!(listen = %local, interval = ?settings.interval, required_mtu = settings.required_mtu(), "serving GET /flows, GET /findings and GET /metrics");

    let mut ticker = new_ticker(settings.interval).await;
    // Link changes wake the loop at once; the interval check catches what they miss.
    let mut link_events = match netif::link_events() {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!(error = %e, "no rtnetlink link events: interfaces are checked every interval only");
            None
        }
    };
    let mut server_done = None;
    let mut throttle = crate::daemon::throttle::Throttle::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                match tokio::task::block_in_place(|| collector.poll()) {
                    Ok(p) => {
                        tracing::debug!(flows = p.document.len(), entries = p.entries, elapsed = ?p.elapsed, read = ?p.read, "polled");
                        attachments.log_changes(&p.document.counters.qos);
                        // Shared, not copied: the collector keeps it for the next rates.
                        tx.send_replace(p.document);
                        // Interfaces that appeared, went away or were re-created.
                        follow_interfaces(&mut attachments, collector.loaded_mut(), &settings, &mut throttle);
                    }
                    Err(e) => {
                        if let Some(left_out) = throttle.allow("poll", std::time::Instant::now()) {
                            tracing::warn!(error = %e, left_out, "reading the flow table failed");
                        }
                    }
                }
            }
            Some(()) = async {
                match link_events.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                tokio::task::block_in_place(|| {
                    follow_interfaces(&mut attachments, collector.loaded_mut(), &settings, &mut throttle)
                });
            }
            _ = sighup.recv() => {
                let reloaded = tokio::task::block_in_place(|| {
                    reload(&launch, &settings, &mut attachments, collector.loaded_mut())
                });
                reloads.record(reloaded.is_some());
                if let Some(new) = reloaded {
                    if new.interval != settings.interval {
                        ticker = new_ticker(new.interval).await;
                    }
                    audit_task.abort();
                    audit_task = tokio::spawn(crate::daemon::audit_task::every(
                        launch.auditor(&new),
                        new.interval,
                        rx.clone(),
                        findings_tx.clone(),
                    ));
                    events_sample.store(new.events_sample, std::sync::atomic::Ordering::Relaxed);
                    exporter.set_interfaces(new.tc_interfaces());
                    settings = new;
                }
            }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            r = &mut server => { server_done = Some(r); break; }
        }
    }

    audit_task.abort();
    attachments.release(collector.loaded_mut());
    match pin_dir {
        Some(dir) => {
            tracing::info!(pin_dir = %dir.display(), "the pinned datapath keeps classifying and enforcing; `roce-agent detach` removes it")
        }
        None => tracing::info!(interfaces = ?settings.interfaces, "detached"),
    }
    match server_done {
        Some(Ok(Ok(()))) => Err(anyhow!("the API server stopped unexpectedly")),
        Some(Ok(Err(e))) => Err(anyhow!(e).context("the API server failed")),
        Some(Err(e)) => Err(anyhow!(e).context("the API server task failed")),
        None => {
            let _ = stop_tx.send(());
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
                .await
                .is_err()
            {
                server.abort();
            }
            Ok(())
        }
    }
}

/// Applies `settings` again when an interface is not where its programs are (it
/// appeared, went away, was re-created or renamed); a failure is retried at the next
/// check.
fn follow_interfaces(
    attachments: &mut Attachments,
    loaded: &mut loader::Loaded,
    settings: &Settings,
    throttle: &mut crate::daemon::throttle::Throttle,
) {
    if !attachments.drifted(settings) {
        return;
    }
    if let Err(e) = attachments.apply(loaded, settings) {
        if let Some(left_out) = throttle.allow("interfaces", std::time::Instant::now()) {
            tracing::warn!(error = %error_text(&anyhow!(e)), left_out, "attaching to an interface that changed failed; trying again at the next check");
        }
    }
}

/// After a failed start: removes what this start pinned when there was no datapath
/// before it (an adopted one is left running), so that the next start is a clean one.
fn remove_fresh_datapath(fresh: bool, pin_dir: Option<&Path>) {
    let (true, Some(dir)) = (fresh, pin_dir) else {
        return;
    };
    if let Err(e) = crate::datapath::pin::detach(dir) {
        tracing::warn!(error = %e, "removing the half-made datapath failed: run `roce-agent detach`");
    }
}

/// An interval ticker whose first (immediate) tick is already taken.
async fn new_ticker(every: Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    ticker
}

/// SIGHUP: reads the configuration again, validates all of it, and applies it in one
/// step. A refused file changes nothing (the message names FILE:LINE:COLUMN); a file
/// that validates but fails to apply (an attach refused) is rolled back. Returns the
/// settings now in force when they changed.
fn reload(
    launch: &Launch,
    current: &Settings,
    attachments: &mut Attachments,
    loaded: &mut loader::Loaded,
) -> Option<Settings> {
    let Some(path) = launch.config.as_deref() else {
        tracing::warn!("SIGHUP: there is no --config file to read again; nothing changes");
        return None;
    };
    let new = match launch.settings() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(file = %path.display(), error = %error_text(&e), "SIGHUP: the configuration was refused; the one in force stays");
            return None;
        }
    };
    for (what, changed) in [
        ("listen", new.listen != current.listen),
        (
            "flows_map_size",
            new.flows_map_size != current.flows_map_size,
        ),
    ] {
        if changed {
            tracing::warn!(
                setting = what,
                "SIGHUP: this setting takes effect at the next start only"
            );
        }
    }
    match attachments.apply(loaded, &new) {
        Ok(()) => {
            tracing::info!(file = %path.display(), interfaces = ?new.interfaces, vteps = ?new.vteps, "SIGHUP: configuration reloaded");
            Some(new)
        }
        Err(e) => {
            tracing::error!(file = %path.display(), error = %error_text(&anyhow!(e)), "SIGHUP: applying the configuration failed; going back to the one in force");
            if let Err(back) = attachments.apply(loaded, current) {
                tracing::error!(error = %error_text(&anyhow!(back)), "restoring the configuration in force failed");
            }
            None
        }
    }
}

/// Starts the reader of the kernel's sampled events, also while `events_sample` is 0
/// (the kernel then writes none), so that a reload can turn them on. None when the
/// reader cannot start: flows, QoS and the audit go on without events.
fn start_events(
    loaded: &mut loader::Loaded,
    settings: &Settings,
) -> Option<crate::telemetry::events_reader::Spawned> {
    let sample = settings.events_sample;
    let resolve: crate::telemetry::events_reader::Resolver = Arc::new(netif::name_of);
    match crate::telemetry::events_reader::spawn(loaded, resolve) {
        Ok(spawned) => {
            if sample == roce_common::event::EVENTS_OFF {
                tracing::info!("events_sample is 0: no sampled events until a reload sets it");
            } else {
                tracing::info!(
                    sample,
                    per_cpu_per_100ms = roce_common::event::EVENTS_PER_CPU_PER_WINDOW,
                    "sampled events: reading the EVENTS ring buffer"
                );
            }
            Some(spawned)
        }
        Err(e) => {
            tracing::warn!(error = %e, "sampled events unavailable; flow counting goes on");
            None
        }
    }
}

/// `roce-agent detach`.
pub fn detach(args: DetachArgs) -> anyhow::Result<()> {
    let removed = crate::datapath::pin::detach(&args.pin_dir).with_context(|| {
        format!(
            "detaching the datapath pinned under {}",
            args.pin_dir.display()
        )
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&removed)?);
        return Ok(());
    }
    if removed.links.is_empty() && removed.programs.is_empty() && removed.maps.is_empty() {
        println!("nothing pinned under {}", args.pin_dir.display());
        return Ok(());
    }
    println!(
        "detached {} links; removed {} program and {} map pins and {}",
        removed.links.len(),
        removed.programs.len(),
        removed.maps.len(),
        args.pin_dir.display()
    );
    for l in &removed.links {
        println!("  link {l}");
    }
    Ok(())
}

/// `roce-agent flows`.
pub fn flows(args: FlowsArgs) -> anyhow::Result<()> {
    let body = api::client::get_body(&args.api, "/flows", CLIENT_TIMEOUT)?;
    let doc: Document = serde_json::from_slice(&body).with_context(|| {
        format!(
            "the answer of {} is not a roce-agent flow document",
            args.api
        )
    })?;
    let mut out = std::io::stdout().lock();
    use std::io::Write as _;
    let written = if args.json {
        out.write_all(&body).and_then(|()| {
            if body.last() != Some(&b'\n') {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
    } else {
        out.write_all(table::render(&doc).as_bytes())
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`) is not an error worth reporting.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

/// `roce-agent events`.
pub fn events(args: EventsArgs) -> anyhow::Result<()> {
    use crate::api::client::{follow, Line};
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
    follow(&args.api, &kinds, duration, |line| {
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
        progress: true,
        workers: args.workers.map(usize::from),
    };
    let analysis = analyze::analyze(&args.capture, &opts)?;
    tracing::debug!(engine = %analysis.engine, frames = analysis.report.capture.frames, "analyzed");
    let text = if args.json {
        let mut t = serde_json::to_string_pretty(&analysis.report).context("encoding JSON")?;
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
    match analysis.error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_is_a_subcommand_with_the_documented_defaults() {
        use clap::Parser as _;
        let cli = Cli::try_parse_from(["roce-agent", "top"]).unwrap();
        match cli.command {
            Command::Top(t) => {
                assert_eq!(t.api, "127.0.0.1:9473");
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
    fn mem_total_is_read_in_bytes_and_nonsense_is_none() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:        1000 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(24_576_000 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: lots kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: 12 MB\n"), None);
        assert!(
            mem_total_bytes().is_some_and(|b| b > 0),
            "this host's /proc/meminfo"
        );
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
                assert_eq!(f.api, "127.0.0.1:9473");
                assert!(!f.json);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn error_text_quotes_each_cause_once() {
        let io = std::io::Error::other("Operation not permitted");
        let e = anyhow::Error::new(io).context("map CONFIG: Operation not permitted");
        let e = e.context("loading");
        assert_eq!(
            error_text(&e),
            "loading: map CONFIG: Operation not permitted"
        );
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
        assert_eq!(exit_code(&e), EXIT_RUNTIME);
    }
}
