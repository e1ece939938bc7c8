//! `roce-agent analyze`: a capture's flow table, ICRC checks and findings.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::config::{ConfigFile, Overrides, Settings};
use crate::datapath::loader;

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
