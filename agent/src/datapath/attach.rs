//! What `run` has attached where, and how it gets from one configuration to the next:
//! at start (where a pinned datapath may already run) and on every reload. One
//! function, [`Attachments::apply`], makes the kernel side match a [`Settings`]:
//!
//! 1. the runtime configuration and policy switch in one generation (`Loaded::commit`);
//! 2. `xdp_classify` on every `interfaces` entry (`xdp_mirror` on the
//!    `mirror_interfaces`), `tc_egress` on interfaces and VTEPs,
//!    `tc_ingress` on VTEPs, with IFACE_QOS saying what each does; pinned links of an
//!    earlier agent are adopted (their program swapped in place);
//! 3. whatever is attached but no longer asked for is detached, pinned or not.
//!
//! Interfaces come and go (a driver loads late, a VF is re-created, a link renamed):
//! [`Attachments::drifted`] compares each configured name's ifindex with the one its
//! programs are on, and `run` applies the settings again when they differ. A
//! configured interface that does not exist yet is waited for (and logged once).

use std::collections::BTreeMap;

use aya::programs::TcAttachType;

use crate::config::{HostMode, Settings};
use crate::datapath::clsact::{self, Hook};
use crate::datapath::loader::{
    AttachMode, LoadError, Loaded, TC_EGRESS, TC_INGRESS, XDP_MIRROR, XDP_PROGRAM,
};
use crate::datapath::qos::{caused_by_os_error, iface_qos, QosError, TcInterface, TcMechanism};
use crate::sys::netif;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Load(Box<LoadError>),
    #[error("attaching XDP to {ifname}{hint}: {source}")]
    Xdp {
        ifname: String,
        hint: String,
        source: Box<LoadError>,
    },
    #[error("attaching the tc QoS programs: {0}")]
    Qos(Box<QosError>),
}

impl From<LoadError> for AttachError {
    fn from(e: LoadError) -> Self {
        AttachError::Load(Box::new(e))
    }
}

impl From<QosError> for AttachError {
    fn from(e: QosError) -> Self {
        AttachError::Qos(Box::new(e))
    }
}

/// The interfaces that get an XDP program, and which: `xdp_mirror` on the mirror
/// collector interfaces (also those among `interfaces`: their own RoCE is counted
/// there as `xdp_classify` counts it), `xdp_classify` on the other `interfaces`.
fn xdp_interfaces(settings: &Settings) -> Vec<(String, &'static str)> {
    let mut out: Vec<(String, &'static str)> = settings
        .interfaces
        .iter()
        .filter(|n| !settings.mirror_interfaces.contains(n))
        .map(|n| (n.clone(), XDP_PROGRAM))
        .collect();
    out.extend(
        settings
            .mirror_interfaces
            .iter()
            .map(|n| (n.clone(), XDP_MIRROR)),
    );
    out
}

/// The interfaces `run` has programs on.
#[derive(Default)]
pub struct Attachments {
    /// Interfaces with `xdp_classify` or `xdp_mirror`: their ifindex then, how it got
    /// there, and which program.
    xdp: BTreeMap<String, (u32, AttachMode, &'static str)>,
    /// Interfaces with tc programs, and their ifindex then.
    tc: BTreeMap<String, (u32, TcInterface)>,
    /// Configured interfaces that do not exist (yet).
    waiting: std::collections::BTreeSet<String>,
    /// The tc programs could not be attached and the settings let that pass (audit
    /// mode): no point trying again at every interval.
    tc_unavailable: bool,
    /// The QoS counters already reported as seen (each is logged once).
    logged: std::collections::BTreeSet<&'static str>,
    how: TcMechanism,
}

impl Attachments {
    pub fn new(how: TcMechanism) -> Self {
        Attachments {
            how,
            ..Attachments::default()
        }
    }

    /// The tc part alone, the policy written (tests and benchmarks of the QoS
    /// programs): dropping the value detaches them.
    pub fn tc_only(
        loaded: &mut Loaded,
        settings: &Settings,
        how: TcMechanism,
    ) -> Result<Attachments, AttachError> {
        let mut a = Attachments::new(how);
        loaded.set_policy(&settings.policy)?;
        a.apply_tc(loaded, settings)?;
        Ok(a)
    }

    /// Interfaces with tc programs, and whether they are TCX links.
    pub fn tc_interfaces(&self) -> impl Iterator<Item = &TcInterface> {
        self.tc.values().map(|(_, t)| t)
    }

    /// Whether an interface of `settings` is not where its programs are: it appeared,
    /// went away, or was re-created or renamed (another ifindex under the name).
    pub fn drifted(&self, settings: &Settings) -> bool {
        let xdp = xdp_interfaces(settings)
            .iter()
            .any(|(n, _)| self.xdp.get(n).map(|(i, _, _)| *i) != netif::index_of(n));
        let tc = !self.tc_unavailable
            && settings
                .tc_interfaces()
                .iter()
                .any(|n| self.tc.get(n).map(|(i, _)| *i) != netif::index_of(n));
        xdp || tc
    }

    /// Logs once that `ifname` is waited for.
    fn wait_for(&mut self, ifname: &str) {
        if self.waiting.insert(ifname.to_string()) {
            tracing::warn!(interface = %ifname, "waiting for the interface to appear");
        }
    }

    /// Makes the kernel side match `settings` (see the module comment). An interface
    /// that does not exist is waited for. On an error, what was attached until then
    /// stays: the caller applies the previous settings again.
    pub fn apply(&mut self, loaded: &mut Loaded, settings: &Settings) -> Result<(), AttachError> {
        loaded.commit(&settings.runtime_config(), &settings.policy)?;
        self.apply_xdp(loaded, settings)?;
        match self.apply_tc(loaded, settings) {
            Ok(()) => self.tc_unavailable = false,
            // Audit mode without VTEPs only counts: flow counting goes on without it.
            Err(e) if settings.mode == HostMode::Audit && settings.vteps.is_empty() => {
                tracing::warn!(error = %e, "tc QoS audit not attached; flow counting goes on");
                self.tc_unavailable = true;
            }
            Err(e) => return Err(e),
        }
        let removed = loaded.prune_links(&self.wanted_links())?;
        for path in removed {
            tracing::info!(link = %path, "detached a pinned link no longer configured");
        }
        Ok(())
    }

    fn apply_xdp(&mut self, loaded: &mut Loaded, settings: &Settings) -> Result<(), AttachError> {
        let wanted = xdp_interfaces(settings);
        let stale: Vec<String> = self
            .xdp
            .iter()
            .filter(|(n, (i, _, p))| {
                !wanted.contains(&((*n).clone(), *p)) || netif::index_of(n) != Some(*i)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for ifname in stale {
            loaded.detach_xdp(&ifname);
            self.xdp.remove(&ifname);
            tracing::info!(interface = %ifname, "XDP classifier detached");
        }
        for (ifname, program) in &wanted {
            if self.xdp.contains_key(ifname) {
                continue;
            }
            let Some(index) = netif::index_of(ifname) else {
                self.wait_for(ifname);
                continue;
            };
            self.waiting.remove(ifname);
            let mode = loaded
                .attach_xdp_program(ifname, program)
                .map_err(|source| {
                    // An XDP link is exclusive: EEXIST/EBUSY when another program is there.
                    let hint = if caused_by_os_error(&source, &[libc::EEXIST, libc::EBUSY]) {
                        format!(
                        " (another XDP program is attached there: see `ip link show dev {ifname}`)"
                    )
                    } else {
                        String::new()
                    };
                    AttachError::Xdp {
                        ifname: ifname.clone(),
                        hint,
                        source: Box::new(source),
                    }
                })?;
            tracing::info!(interface = %ifname, ifindex = index, %mode, program = %program, "XDP classifier attached");
            self.xdp.insert(ifname.clone(), (index, mode, program));
        }
        Ok(())
    }

    fn apply_tc(&mut self, loaded: &mut Loaded, settings: &Settings) -> Result<(), AttachError> {
        let wanted = settings.tc_interfaces();
        let stale: Vec<String> = self
            .tc
            .iter()
            .filter(|(n, (i, _))| !wanted.contains(n) || netif::index_of(n) != Some(*i))
            .map(|(n, _)| n.clone())
            .collect();
        for ifname in stale {
            if let Some((index, _)) = self.tc.remove(&ifname) {
                loaded.set_iface_qos(index, None)?;
            }
            tracing::info!(interface = %ifname, "tc QoS programs detached");
        }
        // An adopted datapath may hold entries of interfaces no longer configured.
        let wanted_indexes: Vec<u32> = wanted.iter().filter_map(|i| netif::index_of(i)).collect();
        for index in loaded.iface_qos_indexes()? {
            if !wanted_indexes.contains(&index) {
                loaded.set_iface_qos(index, None)?;
                // A killed agent's clsact filters there run on until someone removes them.
                match clsact::remove_agent_filters(index, &Hook::BOTH) {
                    Ok(r) => {
                        for f in &r.filters {
                            tracing::info!(filter = %f.describe(), "removed a clsact filter of an interface no longer configured");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(ifindex = index, error = %e, "removing the clsact filters of an interface no longer configured failed")
                    }
                }
            }
        }
        for ifname in &wanted {
            let Some(index) = netif::index_of(ifname) else {
                self.wait_for(ifname);
                continue;
            };
            self.waiting.remove(ifname);
            let q = iface_qos(settings, ifname);
            loaded.set_iface_qos(index, Some(q))?;
            let has_ingress = self.tc.get(ifname).map(|(_, t)| t.has_ingress());
            if has_ingress == Some(q.vtep != 0) {
                continue;
            }
            // New, or its VTEP role changed: attach afresh (a pinned link is adopted).
            self.tc.remove(ifname);
            let mut t = TcInterface::new(ifname);
            t.attach(loaded, TC_EGRESS, TcAttachType::Egress, self.how)?;
            if q.vtep != 0 {
                t.attach(loaded, TC_INGRESS, TcAttachType::Ingress, self.how)?;
            }
            let mode = if q.host != 0 {
                settings.mode.to_string()
            } else {
                "-".into()
            };
            tracing::info!(
                interface = %ifname,
                mode = %mode,
                vtep = q.vtep != 0,
                ecn_propagation = %settings.ecn_propagation,
                mechanism = %if t.tcx { "tcx" } else { "clsact" },
                "tc QoS programs attached"
            );
            self.tc.insert(ifname.clone(), (index, t));
        }
        Ok(())
    }

    /// The (program, ifindex) of every link that should be pinned now.
    fn wanted_links(&self) -> Vec<(&'static str, u32)> {
        let mut out = Vec::new();
        for (i, _, program) in self.xdp.values() {
            out.push((*program, *i));
        }
        for (i, t) in self.tc.values() {
            out.push((TC_EGRESS, *i));
            if t.has_ingress() {
                out.push((TC_INGRESS, *i));
            }
        }
        out
    }

    /// Logs each QoS action the first time it happens. Counts belong on /metrics and
    /// GET /flows: a line per interval on every host, forever, helps nobody.
    pub fn log_changes(&mut self, counters: &crate::doc::QosCounters) {
        for (name, value) in counters.named() {
            if value > 0 && self.logged.insert(name) {
                tracing::info!(
                    counter = name,
                    packets = value,
                    "QoS action seen for the first time (counts on GET /flows)"
                );
            }
        }
    }

    /// Detaches what this process owns (unpinned links, clsact filters and the qdiscs
    /// they leave empty);
    /// pinned links stay and keep the datapath running.
    pub fn release(&mut self, loaded: &mut Loaded) {
        self.tc.clear();
        loaded.detach_all();
        self.xdp.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_interfaces_get_xdp_mirror_and_the_others_xdp_classify() {
        let settings = Settings {
            interfaces: vec!["eth1".into(), "eth2".into()],
            mirror_interfaces: vec!["eth2".into(), "mir0".into()],
            ..Settings::default()
        };
        assert_eq!(
            xdp_interfaces(&settings),
            vec![
                ("eth1".to_string(), XDP_PROGRAM),
                ("eth2".to_string(), XDP_MIRROR),
                ("mir0".to_string(), XDP_MIRROR),
            ]
        );
        // tc goes where `interfaces` and VTEPs say, never on a pure mirror interface.
        assert_eq!(settings.tc_interfaces(), vec!["eth1", "eth2"]);
    }
}
