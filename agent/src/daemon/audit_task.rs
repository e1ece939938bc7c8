//! The audit inside `run`: at start and every interval, the findings served on
//! `GET /findings`; in `--mode enforce` with an MTU configured, an interface whose MTU
//! drifted below it is set back. Peers (the config's, and with `--probe-flow-peers` the
//! remote ends of the flows it counts) are probed for `mtu_path` each at most once a
//! minute, a few per round, so a large table never turns the audit into a probe storm.
//! The log says what changed, not what stayed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::doc::finding::Findings;
use crate::doc::Direction;
use crate::telemetry::live::LiveDocument;

use crate::audit::link::Rtnl;
use crate::audit::rnic::{PortCache, GID_TABLES_MAX_AGE};
use crate::audit::{audit_with, fix_mtu_only, probe_peer, AuditOptions, Finding, Severity};

/// How long a probed peer's result stands before it is probed again.
pub const REPROBE_AFTER: Duration = Duration::from_secs(60);
/// New probes per round at most (each may wait its whole timeout).
pub const PROBES_PER_ROUND: usize = 4;
/// Peers remembered at most (flows can name many more hosts).
pub const MAX_PEERS: usize = 256;

/// Whom to probe for `mtu_path`.
#[derive(Clone, Debug, Default)]
pub struct PeerPolicy {
    /// The config's `peers`: always probed.
    pub configured: Vec<IpAddr>,
    /// Also the remote outer address of every flow in the table (opt-in).
    pub from_flows: bool,
}

/// The live verdicts and the rounds of their window, kept across the watchers of
/// successive configurations (SIGHUP).
pub type SharedVerdicts = Arc<Mutex<crate::verdict::Live>>;

/// The verdicts, also after a round that panicked while holding them.
fn lock(v: &SharedVerdicts) -> std::sync::MutexGuard<'_, crate::verdict::Live> {
    v.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Audits again and again, remembering what it reported last.
pub struct Watcher {
    /// Without peers: those are probed here, on their own schedule.
    opts: AuditOptions,
    peers: PeerPolicy,
    /// Each peer's last probe: when, and its finding.
    probed: BTreeMap<IpAddr, (Instant, Option<Finding>)>,
    /// Set MTUs back (enforce mode with an explicit MTU).
    enforce_mtu: bool,
    /// (check, interface, found) of the last audit's warnings and errors.
    reported: BTreeSet<(String, Option<String>, String)>,
    /// The last audit failure, so a persisting one is logged once.
    failing: Option<String>,
    /// The RDMA ports' GID tables, kept between rounds.
    ports: PortCache,
    /// The fabric verdicts on the flows, each round judging its own window.
    verdicts: SharedVerdicts,
    /// Where the pause and RNIC counters the verdicts read come from.
    host: crate::telemetry::metrics::HostSources,
}

impl Watcher {
    pub fn new(
        mut opts: AuditOptions,
        mut peers: PeerPolicy,
        enforce_mtu: bool,
        thresholds: crate::config::VerdictThresholds,
    ) -> Watcher {
        for p in std::mem::take(&mut opts.peers) {
            if !peers.configured.contains(&p) {
                peers.configured.push(p);
            }
        }
        let host = crate::telemetry::metrics::HostSources {
            sysfs_root: opts.sysfs_root.clone(),
            interfaces: opts.interfaces.clone(),
        };
        Watcher {
            opts,
            peers,
            probed: BTreeMap::new(),
            enforce_mtu,
            reported: BTreeSet::new(),
            failing: None,
            ports: PortCache::new(GID_TABLES_MAX_AGE),
            verdicts: Arc::new(Mutex::new(crate::verdict::Live::new(thresholds))),
            host,
        }
    }

    /// This watcher on a datapath this agent made at `started`, whose counts began
    /// from zero then: the verdicts judge them from that moment on
    /// ([`crate::verdict::Live::counting_from_zero`]).
    pub fn counting_from_zero(self, started: Instant) -> Watcher {
        {
            let mut live = lock(&self.verdicts);
            *live = std::mem::take(&mut *live).counting_from_zero(started);
        }
        self
    }

    /// The verdicts this watcher keeps, for the watcher of the next configuration.
    pub fn verdicts_shared(&self) -> SharedVerdicts {
        self.verdicts.clone()
    }

    /// This watcher (of a configuration reloaded) keeping the verdicts an earlier one
    /// kept, with this configuration's thresholds: a reload does not empty their
    /// windows, nor make a baseline of its first round.
    pub fn continuing(self, verdicts: SharedVerdicts) -> Watcher {
        let thresholds = lock(&self.verdicts).thresholds();
        lock(&verdicts).set_thresholds(thresholds);
        Watcher { verdicts, ..self }
    }

    /// One round: audit, enforce, judge the flows, log what changed. The findings to
    /// serve (an audit that could not run is itself a finding, so `/findings` never
    /// lies by omission).
    pub fn round(&mut self, flows: Option<&LiveDocument>) -> Vec<Finding> {
        let wanted = self.wanted_peers(flows);
        let verdicts = flows.map(|d| self.verdicts(d)).unwrap_or_default();
        self.round_with_peers(wanted, verdicts)
    }

    /// The fabric verdicts on the flows of `doc` (`crate::verdict`), over the window
    /// since the last call.
    pub fn verdicts(&mut self, doc: &LiveDocument) -> Vec<Finding> {
        use crate::verdict::rnic_loop::{CNP_SENT, ECN_MARKED};
        let readings = self.host.read_hw_counters(&[ECN_MARKED, CNP_SENT]);
        let pauses = pause_readings(&readings.pfc);
        let watchdogs = watchdog_readings(&readings.pfc);
        let np = np_readings(&readings.rnic);
        let host = crate::verdict::HostFacts {
            vteps: &doc.counters.qos.vteps,
            pauses: &pauses,
            watchdogs: &watchdogs,
            np: &np,
        };
        lock(&self.verdicts).round(|f| doc.for_each_facts(f), &host, &self.opts.policy)
    }

    /// The peers to probe: the configured ones, then (when asked for) the remote outer
    /// address of the flows, MAX_PEERS at most. Taken before a round, so that the
    /// round does not hold a document while it probes.
    pub fn wanted_peers(&self, flows: Option<&LiveDocument>) -> Vec<IpAddr> {
        let mut wanted: Vec<IpAddr> = self.peers.configured.clone();
        if let (true, Some(doc)) = (self.peers.from_flows, flows) {
            doc.for_each_endpoints(|direction, src, dst| {
                if wanted.len() >= MAX_PEERS {
                    return std::ops::ControlFlow::Break(());
                }
                let remote = match direction {
                    Some(Direction::Egress) => dst,
                    _ => src,
                };
                if !wanted.contains(&remote) {
                    wanted.push(remote);
                }
                std::ops::ControlFlow::Continue(())
            });
        }
        wanted
    }

    /// [`Self::round`] with the peers [`Self::wanted_peers`] chose and the verdicts
    /// [`Self::verdicts`] made.
    pub fn round_with_peers(
        &mut self,
        wanted: Vec<IpAddr>,
        verdicts: Vec<Finding>,
    ) -> Vec<Finding> {
        let mut result = audit_with(&self.opts, &mut self.ports);
        if self.enforce_mtu {
            if let Ok(a) = &result {
                match fix_mtu_only(a, self.opts.required_mtu) {
                    Ok(fixed) => {
                        for c in &fixed.changes {
                            tracing::warn!(interface = %c.interface, before = %c.before, after = %c.after, "MTU had drifted below the required MTU: set back");
                        }
                        for f in &fixed.failures {
                            tracing::warn!(error = %f, "MTU not set back");
                        }
                        if !fixed.changes.is_empty() {
                            result = audit_with(&self.opts, &mut self.ports);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "MTU enforcement failed"),
                }
            }
        }
        match result {
            Ok(mut a) => {
                if self.failing.take().is_some() {
                    tracing::info!("the host audit runs again");
                }
                a.findings.extend(self.probe_peers(wanted));
                a.findings.extend(verdicts);
                crate::audit::sort(&mut a.findings);
                self.log_changes(&a.findings);
                a.findings
            }
            Err(e) => {
                let text = e.to_string();
                if self.failing.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "the host audit could not run");
                    self.failing = Some(text.clone());
                }
                // The verdicts on the flows stand without the host audit.
                let mut findings = vec![crate::audit::finding(
                    "audit",
                    None,
                    Severity::Error,
                    format!("the host audit could not run: {text}"),
                    "an audit that runs",
                    "see the agent's log",
                )];
                findings.extend(verdicts);
                findings
            }
        }
    }

    /// The `mtu_path` findings of every peer: stale or new peers probed now (a few per
    /// round), the others from their last probe.
    fn probe_peers(&mut self, wanted: Vec<IpAddr>) -> Vec<Finding> {
        self.probed.retain(|p, _| wanted.contains(p));
        let now = Instant::now();
        let due: Vec<IpAddr> = wanted
            .iter()
            .filter(|p| {
                self.probed
                    .get(p)
                    .is_none_or(|(at, _)| now.duration_since(*at) >= REPROBE_AFTER)
            })
            .take(PROBES_PER_ROUND)
            .copied()
            .collect();
        if !due.is_empty() {
            match Rtnl::open().and_then(|mut r| Ok((r.links()?, r))) {
                Ok((links, mut rtnl)) => {
                    for p in due {
                        let f = probe_peer(&mut rtnl, &links, p, &self.opts);
                        self.probed.insert(p, (Instant::now(), f));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "path probes skipped"),
            }
        }
        self.probed
            .values()
            .filter_map(|(_, f)| f.clone())
            .collect()
    }

    fn log_changes(&mut self, findings: &[Finding]) {
        let now: BTreeSet<_> = findings
            .iter()
            .filter(|f| f.severity != Severity::Info)
            .map(|f| (f.check.clone(), f.interface.clone(), f.found.clone()))
            .collect();
        for f in findings.iter().filter(|f| f.severity != Severity::Info) {
            let key = (f.check.clone(), f.interface.clone(), f.found.clone());
            if !self.reported.contains(&key) {
                tracing::warn!(check = %f.check, interface = f.interface.as_deref().unwrap_or("-"), severity = severity_name(f.severity), found = %f.found, expected = %f.expected, fix = %f.fix, "audit finding");
            }
        }
        for (check, interface, found) in self.reported.difference(&now) {
            tracing::info!(check = %check, interface = interface.as_deref().unwrap_or("-"), was = %found, "audit finding cleared");
        }
        self.reported = now;
    }
}

/// A severity as `check --json` writes it.
fn severity_name(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

/// Audits every `interval` (after the first round, which the caller made) and
/// publishes the findings, until the task is aborted. Each round runs on a blocking
/// thread: netlink, sysfs and probes block.
pub async fn every(
    watcher: Watcher,
    interval: Duration,
    flows: watch::Receiver<Arc<LiveDocument>>,
    // Shared: a reload stops this task and starts another that publishes here too.
    publish: Arc<watch::Sender<Arc<Findings>>>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // immediate: the first round is done
    let mut watcher = Some(watcher);
    loop {
        ticker.tick().await;
        let Some(mut w) = watcher.take() else { return };
        let doc = flows.borrow().clone();
        match tokio::task::spawn_blocking(move || {
            let wanted = w.wanted_peers(Some(&doc));
            let verdicts = w.verdicts(&doc);
            drop(doc); // a large table is not kept alive for the length of the probes
            let findings = w.round_with_peers(wanted, verdicts);
            (w, findings)
        })
        .await
        {
            Ok((w, findings)) => {
                publish.send_replace(Arc::new(Findings { findings }));
                watcher = Some(w);
            }
            Err(e) => {
                tracing::error!(error = %e, "the host audit task failed; audits stop");
                return;
            }
        }
    }
}

/// The pause counters of each interface and priority that has any, as the verdicts
/// read them.
fn pause_readings(
    pfc: &[crate::telemetry::ethtool::PfcCounters],
) -> Vec<crate::verdict::pauses::PauseReading> {
    use crate::telemetry::ethtool::PauseDirection::{Rx, Tx};
    let mut out = Vec::new();
    for c in pfc {
        for priority in 0..8u8 {
            let p = priority as usize;
            let r = crate::verdict::pauses::PauseReading {
                ifname: c.ifname.clone(),
                priority,
                rx_frames: c.frames[Rx as usize][p],
                tx_frames: c.frames[Tx as usize][p],
                rx_paused_us: c.duration_us[Rx as usize][p],
            };
            if r.rx_frames.is_some() || r.tx_frames.is_some() || r.rx_paused_us.is_some() {
                out.push(r);
            }
        }
    }
    out
}

/// The PFC storm watchdog counters of each interface that has them.
fn watchdog_readings(
    pfc: &[crate::telemetry::ethtool::PfcCounters],
) -> Vec<crate::verdict::pauses::WatchdogReading> {
    use crate::telemetry::ethtool::StormLevel;
    pfc.iter()
        .filter(|c| c.storm_events.iter().any(Option::is_some))
        .map(|c| crate::verdict::pauses::WatchdogReading {
            ifname: c.ifname.clone(),
            warning_events: c.storm_events[StormLevel::Warning as usize],
            error_events: c.storm_events[StormLevel::Error as usize],
        })
        .collect()
}

/// The notification-point counters of each RDMA port that exports both, as the
/// verdicts read them.
fn np_readings(
    ports: &[crate::telemetry::metrics::RnicPortCounters],
) -> Vec<crate::verdict::rnic_loop::NpReading> {
    use crate::verdict::rnic_loop::{NpReading, CNP_SENT, ECN_MARKED};
    ports
        .iter()
        .filter_map(|p| {
            let value = |name: &str| p.counters.iter().find(|c| c.name == name).map(|c| c.value);
            Some(NpReading {
                device: p.device.clone(),
                port: p.port,
                netdev: p.netdev.clone(),
                ecn_marked: value(ECN_MARKED)?,
                cnp_sent: value(CNP_SENT)?,
            })
        })
        .collect()
}
