//! The audit inside `run`: at start and every interval, the findings served on
//! `GET /findings`; in `--mode enforce` with an MTU configured, an interface whose MTU
//! drifted below it is set back. The log says what changed, not what stayed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::api::Findings;

use super::{audit, fix_mtu_only, AuditOptions, Finding, Severity};

/// Audits again and again, remembering what it reported last.
pub struct Watcher {
    opts: AuditOptions,
    /// Set MTUs back (enforce mode with an explicit MTU).
    enforce_mtu: bool,
    /// (check, interface, found) of the last audit's warnings and errors.
    reported: BTreeSet<(String, Option<String>, String)>,
    /// The last audit failure, so a persisting one is logged once.
    failing: Option<String>,
}

impl Watcher {
    pub fn new(opts: AuditOptions, enforce_mtu: bool) -> Watcher {
        Watcher {
            opts,
            enforce_mtu,
            reported: BTreeSet::new(),
            failing: None,
        }
    }

    /// One round: audit, enforce, log what changed. The findings to serve (an audit
    /// that could not run is itself a finding, so `/findings` never lies by omission).
    pub fn round(&mut self) -> Vec<Finding> {
        let mut result = audit(&self.opts);
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
                            result = audit(&self.opts);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "MTU enforcement failed"),
                }
            }
        }
        match result {
            Ok(a) => {
                if self.failing.take().is_some() {
                    tracing::info!("the host audit runs again");
                }
                self.log_changes(&a.findings);
                a.findings
            }
            Err(e) => {
                let text = e.to_string();
                if self.failing.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "the host audit could not run");
                    self.failing = Some(text.clone());
                }
                vec![super::finding(
                    "audit",
                    None,
                    Severity::Error,
                    format!("the host audit could not run: {text}"),
                    "an audit that runs",
                    "see the agent's log",
                )]
            }
        }
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
                tracing::warn!(check = %f.check, interface = f.interface.as_deref().unwrap_or("-"), severity = ?f.severity, found = %f.found, expected = %f.expected, fix = %f.fix, "audit finding");
            }
        }
        for (check, interface, found) in self.reported.difference(&now) {
            tracing::info!(check = %check, interface = interface.as_deref().unwrap_or("-"), was = %found, "audit finding cleared");
        }
        self.reported = now;
    }
}

/// Audits every `interval` (after the first round, which the caller made) and
/// publishes the findings, until the task is aborted. Each round runs on a blocking
/// thread: netlink, sysfs and probes block.
pub async fn every(watcher: Watcher, interval: Duration, publish: watch::Sender<Arc<Findings>>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // immediate: the first round is done
    let mut watcher = Some(watcher);
    loop {
        ticker.tick().await;
        let Some(mut w) = watcher.take() else { return };
        match tokio::task::spawn_blocking(move || {
            let findings = w.round();
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
