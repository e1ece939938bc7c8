//! What a start does before the loop: the settings checked against the host, the
//! datapath loaded (or adopted from its pins), the audit and the events reader set up;
//! and what a refused start undoes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::api::web_config::WebConfig;
use crate::config::{ConfigError, ConfigFile, Origin, Settings};
use crate::datapath::loader;
use crate::sys::netif;

use super::{Launch, RunError};

/// How long each of the running agent's path probes waits.
const AUDIT_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

impl Launch {
    /// The settings of the config file and the flags, validated in full, with every
    /// interface present (unless `--wait-for-interfaces`).
    pub(super) fn settings(&self) -> anyhow::Result<Settings> {
        let file = self.config.as_deref().map(ConfigFile::load).transpose()?;
        self.settings_of(file.as_ref())
    }

    /// [`Self::settings`] with the config file read already.
    pub(super) fn settings_of(&self, file: Option<&ConfigFile>) -> anyhow::Result<Settings> {
        let settings = Settings::resolve(file, &self.flags, true)?;
        let missing: Vec<String> = settings
            .interfaces
            .iter()
            .chain(settings.vteps.iter())
            .chain(settings.mirror_interfaces.iter())
            .filter(|i| netif::index_of(i).is_none())
            .cloned()
            .collect();
        if missing.is_empty() || self.wait_for_interfaces {
            return Ok(settings);
        }
        // A name from the file is a configuration error: say where it is.
        if let Some((origin, field)) =
            file.and_then(|f| missing.iter().find_map(|m| f.interface_origin(m)))
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

    /// The web configuration `settings` name (`web_config_file`): TLS, users and
    /// headers of the API; plain HTTP without authentication when there is none. A
    /// refusal is a configuration error (exit 2) that names the flag or key, the file
    /// and the cause.
    pub(super) fn web_config(&self, settings: &Settings) -> anyhow::Result<WebConfig> {
        let Some(path) = settings.web_config_file.as_deref() else {
            return Ok(WebConfig::plain());
        };
        WebConfig::load(path).map_err(|e| {
            let origin = if self.flags.web_config_file.is_some() {
                Origin::Flag("--web-config-file")
            } else {
                Origin::Missing
            };
            ConfigError::Invalid {
                origin,
                field: "web_config_file",
                message: e.to_string(),
            }
            .into()
        })
    }

    /// The host audit as `settings` asks for it: at start and every interval, in its
    /// own task (a slow audit never delays the flow table); MTUs set back in enforce
    /// mode when an MTU was asked for.
    pub(super) fn auditor(&self, settings: &Settings) -> crate::daemon::audit_task::Watcher {
        let enforce_mtu =
            settings.mode == crate::config::HostMode::Enforce && settings.mtu.is_some();
        let peers = crate::daemon::audit_task::PeerPolicy {
            configured: settings.peers.clone(),
            from_flows: self.probe_flow_peers,
        };
        crate::daemon::audit_task::Watcher::new(
            crate::audit::AuditOptions::for_settings(
                settings,
                &self.sysfs_root,
                AUDIT_PROBE_TIMEOUT,
            ),
            peers,
            enforce_mtu,
            settings.verdicts,
        )
    }
}

/// Loads the kernel side, pinned under `pin_dir` (adopting what is pinned there) or
/// not at all.
pub(super) fn load_datapath(
    settings: &Settings,
    pin_dir: Option<&Path>,
) -> anyhow::Result<loader::Loaded> {
    let opts = loader::LoadOptions::for_settings(settings);
    note_flow_table_memory(opts.flows_max_entries);
    let Some(dir) = pin_dir else {
        return loader::load(&opts).context("loading the kernel programs");
    };
    let pins = crate::datapath::pin::PinDir::prepare(dir)
        .with_context(|| format!("preparing the pin directory {}", dir.display()))?;
    loader::load_pinned(&opts, pins).context("loading the kernel programs")
}

/// Says what the flow table costs in kernel memory, and warns when that is more than a
/// sixteenth of the host's (it is allocated in full at start: about 600 bytes a flow).
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

/// After a failed start: removes what this start pinned when there was no datapath
/// before it (an adopted one is left running), so that the next start is a clean one.
pub(super) fn remove_fresh_datapath(fresh: bool, pin_dir: Option<&Path>) {
    let (true, Some(dir)) = (fresh, pin_dir) else {
        return;
    };
    if let Err(e) = crate::datapath::pin::detach(dir) {
        tracing::warn!(error = %e, "removing the half-made datapath failed: run `roce-agent detach`");
    }
}

/// Starts the reader of the kernel's sampled events, also while `events_sample` is 0
/// (the kernel then writes none), so that a reload can turn them on. Each event keeps
/// its frame's headers and `events_payload_bytes` of payload; the returned
/// `Spawned::keep` is how a reload changes that. None when the reader cannot start:
/// flows, QoS and the audit go on without events.
pub(super) fn start_events(
    loaded: &mut loader::Loaded,
    settings: &Settings,
) -> Option<crate::telemetry::events_reader::Spawned> {
    use crate::telemetry::events_reader::{self, Keep, Resolver};
    let sample = settings.events_sample;
    let keep = Keep::for_settings(settings);
    let resolve: Resolver = Arc::new(netif::name_of);
    match events_reader::spawn(loaded, resolve, keep) {
        Ok(spawned) => {
            if sample == roce_common::event::EVENTS_OFF {
                tracing::info!("events_sample is 0: no sampled events until a reload sets it");
            } else {
                tracing::info!(
                    sample,
                    per_cpu_per_100ms = roce_common::event::EVENTS_PER_CPU_PER_WINDOW,
                    payload_bytes = keep.payload_bytes,
                    "sampled events: reading the EVENTS ring buffer (each keeps its frame's headers and payload_bytes of payload)"
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
