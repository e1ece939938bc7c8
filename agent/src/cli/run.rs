//! `roce-agent run`: its flags, turned into the daemon's [`Launch`].

use std::path::PathBuf;

use clap::Args;

use crate::config::Overrides;
use crate::daemon::{self, Launch};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Interface to attach to (XDP ingress); repeat for more. Replaces `interfaces` of the config file
    #[arg(long = "iface", value_name = "IF")]
    pub iface: Vec<String>,
    /// Mirror collector interface: XDP decapsulates GRE (transparent Ethernet bridging) and ERSPAN II/III copies arriving there and counts the mirrored RoCE flows with their session and sender (no tc QoS unless it is also an --iface); repeat for more. Replaces `mirror_interfaces` of the config file
    #[arg(long = "mirror", value_name = "IF")]
    pub mirror: Vec<String>,
    /// Address of the HTTP API (GET /flows, /findings, /metrics); :PORT is every address [default: 127.0.0.1:9473, loopback only]
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
    /// A host whose network path must carry the required MTU with DF set (mtu_path in GET /findings: probed at start, then once a minute; IPv4 or IPv6); repeat for more. Replaces `peers` of the config file
    #[arg(long = "peer", value_name = "ADDR")]
    pub peer: Vec<std::net::IpAddr>,
    /// Probe the path MTU (mtu_path) towards the remote end of every flow counted, each peer at most once a minute (--peer and the config's `peers` are always probed)
    #[arg(long)]
    pub probe_flow_peers: bool,
    /// Sampled events (GET /events): keep 1 in N of each kind (CE, CNP, NAK, RNR NAK, PSN gap) per CPU, at most 100 per CPU per 100 ms; 0 emits none [default: the config's `events_sample`, else 1]
    #[arg(long, value_name = "N")]
    pub events_sample: Option<u32>,
    /// A round trip (request leaving, its response arriving) longer than this many microseconds is an `rtt_spike` event; 0 emits none [default: the config's `rtt_spike_us`, else 1000]
    #[arg(long, value_name = "US")]
    pub rtt_spike_us: Option<u32>,
    /// Pin maps, programs and links here (a bpffs; mounted on /sys/fs/bpf when none is): the datapath keeps classifying and enforcing when the agent exits, and a restarted agent adopts it with its counters
    #[arg(long, value_name = "DIR", default_value = crate::datapath::pin::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Pin nothing: the programs detach when the agent exits (trials, tests)
    #[arg(long, conflicts_with = "pin_dir")]
    pub no_pin: bool,
    /// How the log on stderr is written: text (for people), json (a JSON object a line) or logfmt; without a timestamp in text and logfmt when stderr is the journal [default: the config's `log_format`, else text]
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<crate::config::LogFormat>,
    /// Serve the API with TLS, basic auth and response headers as this file says: the YAML of Prometheus exporters' --web.config.file (tls_server_config, basic_auth_users, http_server_config); re-read on SIGHUP [default: the config's `web_config_file`, else plain HTTP without authentication]
    #[arg(long, value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Start even when a configured interface does not exist yet, and attach to it when it appears (without it, a missing interface is an error)
    #[arg(long)]
    pub wait_for_interfaces: bool,
}

/// `roce-agent run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let flags = Overrides {
        interfaces: args.iface,
        listen: args.listen,
        interval_secs: args.interval,
        mode: args.mode,
        vteps: args.vtep,
        mirror_interfaces: args.mirror,
        ecn_propagation: args.ecn_propagation,
        mtu: args.mtu,
        peers: args.peer,
        events_sample: args.events_sample,
        rtt_spike_us: args.rtt_spike_us,
        log_format: args.log_format,
        web_config_file: args.web_config_file,
    };
    let launch = Launch {
        config: args.config,
        flags,
        sysfs_root: args.sysfs_root,
        probe_flow_peers: args.probe_flow_peers,
        pin_dir: (!args.no_pin).then_some(args.pin_dir),
        wait_for_interfaces: args.wait_for_interfaces,
    };
    daemon::run(launch)
}
