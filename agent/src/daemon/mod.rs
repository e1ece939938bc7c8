//! The `run` daemon: launch (load, attach, pin), the collector loop, SIGHUP reload,
//! the periodic audit task, the QP table after every poll (`qp_task`), shutdown, and
//! the log's formats (`log`).
//!
//! May import every library module below it (`datapath`, `audit`, `telemetry`, `api`,
//! `config`, `doc`, `sys`); never `cli` (it takes a plain launch struct) or `top`.

pub mod audit_task;
mod launch;
pub mod log;
pub mod qp_task;
mod reload;
mod serve;
pub mod throttle;

use std::path::PathBuf;

use anyhow::Context as _;

use crate::config::{ConfigError, ConfigFile, Overrides};

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

/// Why `run` refused to start, outside the configuration's own checks.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// An interface of the command line that the host does not have (one from the
    /// file is a [`ConfigError`] naming its line). A usage error, like the file's.
    #[error("no such interface: {}", .0.join(", "))]
    NoInterface(Vec<String>),
}

/// Runs the agent until SIGINT or SIGTERM: starts the log in the format the flags or
/// the file ask for, validates the settings (nothing is attached when they are
/// refused), then serves on a tokio runtime of two workers.
pub fn run(launch: Launch) -> anyhow::Result<()> {
    let file = launch.config.as_deref().map(ConfigFile::load).transpose();
    // A file that cannot be read or parsed has no say in the format of its refusal.
    let from_file = file
        .as_ref()
        .ok()
        .and_then(Option::as_ref)
        .and_then(|f| f.values.log_format.as_ref())
        .map(|f| *f.get_ref());
    log::init(launch.flags.log_format.or(from_file).unwrap_or_default());
    let settings = launch.settings_of(file?.as_ref())?;
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

/// [`error_text`] without the caret block of a refused configuration file, and the
/// block: a log record carries it in a field of its own.
pub fn error_parts(e: &anyhow::Error) -> (String, Option<String>) {
    let text = error_text(e);
    let excerpt = e.chain().find_map(|c| {
        c.downcast_ref::<ConfigError>()
            .and_then(ConfigError::excerpt)
    });
    match excerpt {
        Some(x) if text.contains(x) => (text.replacen(x, "", 1), Some(x.to_string())),
        _ => (text, None),
    }
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

    #[test]
    fn error_parts_take_the_caret_block_out_of_the_text() {
        let refused = ConfigFile::parse(
            std::path::Path::new("t.toml"),
            "roce_port = = 4\n".to_string(),
        )
        .unwrap_err();
        let e = anyhow::Error::new(refused).context("reading the configuration");
        let (text, excerpt) = error_parts(&e);
        assert!(
            text.starts_with("reading the configuration: t.toml:1:13: roce_port: "),
            "{text}"
        );
        assert!(!text.contains('\n') && !text.contains('^'), "{text}");
        assert_eq!(
            excerpt.as_deref(),
            Some("\n    | roce_port = = 4\n    |             ^")
        );
        let plain = anyhow::anyhow!("no such interface: x");
        assert_eq!(
            error_parts(&plain),
            ("no such interface: x".to_string(), None)
        );
    }
}
