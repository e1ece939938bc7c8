//! The `run` daemon: launch (load, attach, pin), the collector loop, SIGHUP reload,
//! the periodic audit task, and shutdown.
//!
//! May import every library module below it (`datapath`, `audit`, `telemetry`, `api`,
//! `config`, `doc`, `sys`); never `cli` (it takes a plain launch struct) or `top`.

pub mod audit_task;
mod launch;
mod reload;
mod serve;
pub mod throttle;

use std::path::PathBuf;

use anyhow::Context as _;

use crate::config::Overrides;

/// What `run` was started with: read again on every reload.
pub struct Launch {
    pub config: Option<PathBuf>,
    pub flags: Overrides,
    pub sysfs_root: PathBuf,
    pub probe_flow_peers: bool,
    /// None: `--no-pin`.
    pub pin_dir: Option<PathBuf>,
    /// A configured interface that is missing is waited for instead of refused.
    pub wait_for_interfaces: bool,
}

/// Runtime failures of `run` that are not configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no such interface: {}", .0.join(", "))]
    NoInterface(Vec<String>),
}

/// Runs the agent until SIGINT or SIGTERM: validates the settings (nothing is attached
/// when they are refused), then serves on a tokio runtime of two workers.
pub fn run(launch: Launch) -> anyhow::Result<()> {
    let settings = launch.settings()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(serve::serve(launch, settings))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
