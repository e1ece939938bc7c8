//! Host QoS enforcement: attaches `tc_egress` (and on VTEP underlays `tc_ingress`) to
//! an interface, and owns that attachment: dropping a [`TcInterface`] detaches its
//! programs (unless they are pinned) and removes the clsact qdisc its filters leave
//! empty. Which interfaces get what is `attach::Attachments`' business.
//!
//! Attaching tries a TCX link first (kernels >= 6.6) and falls back to a clsact qdisc
//! with a direct-action filter; [`TcMechanism`] forces either (the tests run both).
//! The agent has one attachment per interface and hook: a filter an earlier agent
//! left (kill -9) gets the new program in place (`clsact` says which are the agent's).

use std::io;

use aya::programs::tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use roce_common::policy::{IfaceQos, VtepKey, VtepStats};

use crate::config::{EcnPropagation, HostMode, Settings};
use crate::datapath::clsact::{self, ClsactError, Filter, Hook};
use crate::datapath::loader::{LoadError, Loaded};
use crate::sys::netif;

#[derive(Debug, thiserror::Error)]
pub enum QosError {
    #[error(transparent)]
    Load(Box<LoadError>),
    #[error("interface {0} does not exist")]
    NoInterface(String),
    #[error("attaching {program} to {ifname} ({direction}) with {mechanism}: {source}")]
    Attach {
        program: &'static str,
        ifname: String,
        direction: &'static str,
        mechanism: &'static str,
        source: Box<aya::programs::ProgramError>,
    },
    #[error("adding a clsact qdisc to {ifname}: {source}")]
    Clsact {
        ifname: String,
        source: Box<aya::programs::tc::TcError>,
    },
    #[error("the clsact filters of {ifname}: {source}")]
    Filters {
        ifname: String,
        source: Box<ClsactError>,
    },
}

impl From<LoadError> for QosError {
    fn from(e: LoadError) -> Self {
        QosError::Load(Box::new(e))
    }
}

/// How tc programs are attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcMechanism {
    /// TCX when the kernel has it, clsact otherwise.
    #[default]
    Auto,
    Tcx,
    Clsact,
}

/// The (undocumented, for tests) environment variable that forces a [`TcMechanism`]
/// on `run`: `tcx` or `clsact` (the path of kernels before 6.6, tested on one that
/// has TCX); anything else is `Auto`.
pub const TC_MECHANISM_ENV: &str = "ROCE_AGENT_TC_MECHANISM";

impl TcMechanism {
    /// What [`TC_MECHANISM_ENV`] asks for (`Auto` when it is unset).
    pub fn from_env() -> TcMechanism {
        TcMechanism::parse(std::env::var(TC_MECHANISM_ENV).ok().as_deref())
    }

    fn parse(value: Option<&str>) -> TcMechanism {
        match value.map(str::trim) {
            Some("tcx") => TcMechanism::Tcx,
            Some("clsact") => TcMechanism::Clsact,
            _ => TcMechanism::Auto,
        }
    }
}

/// The programs attached to one interface. Dropping it detaches them, then removes
/// the clsact qdisc when its filters were all that qdisc held.
pub struct TcInterface {
    pub ifname: String,
    /// The interface the programs went on (None until the first attach).
    ifindex: Option<u32>,
    links: Vec<(&'static str, SchedClassifierLink)>,
    /// Whether the links are TCX links (false: clsact filters).
    pub tcx: bool,
    ingress: bool,
}

impl TcInterface {
    /// Whether `tc_ingress` is attached too (a VTEP underlay).
    pub fn has_ingress(&self) -> bool {
        self.ingress
    }

    pub fn new(ifname: &str) -> Self {
        TcInterface {
            ifname: ifname.to_string(),
            ifindex: None,
            links: Vec::new(),
            tcx: false,
            ingress: false,
        }
    }

    /// Attaches loaded program `program` in `direction`.
    pub fn attach(
        &mut self,
        loaded: &mut Loaded,
        program: &'static str,
        direction: TcAttachType,
        how: TcMechanism,
    ) -> Result<(), QosError> {
        let dir = match direction {
            TcAttachType::Ingress => "ingress",
            _ => "egress",
        };
        let ifindex = netif::index_of(&self.ifname)
            .ok_or_else(|| QosError::NoInterface(self.ifname.clone()))?;
        self.ifindex = Some(ifindex);
        if direction == TcAttachType::Ingress {
            self.ingress = true;
        }
        let hook = match direction {
            TcAttachType::Ingress => Hook::Ingress,
            _ => Hook::Egress,
        };
        if how != TcMechanism::Clsact && loaded.adopt_link(program, ifindex)? {
            // A pinned TCX link of an earlier agent now runs this program.
            self.tcx = true;
            self.remove_agent_filters(ifindex, hook);
            return Ok(());
        }
        let pinned = loaded.pinned().is_some();
        let prog = loaded.tc_program(program)?;
        let attach_err = |mechanism, source| QosError::Attach {
            program,
            ifname: self.ifname.clone(),
            direction: dir,
            mechanism,
            source: Box::new(source),
        };
        if how != TcMechanism::Clsact {
            match prog.attach_with_options(
                &self.ifname,
                direction,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            ) {
                Ok(id) => {
                    let link = prog.take_link(id).map_err(|e| attach_err("tcx", e))?;
                    self.tcx = true;
                    if pinned {
                        // Pinned, the link outlives this process; not ours to drop.
                        loaded.pin_link(program, ifindex, link)?;
                    } else {
                        self.links.push((program, link));
                    }
                    // A clsact filter of an earlier agent would run it a second time.
                    self.remove_agent_filters(ifindex, hook);
                    return Ok(());
                }
                Err(e) if how == TcMechanism::Tcx => return Err(attach_err("tcx", e)),
                Err(e) => {
                    tracing::info!(interface = %self.ifname, error = %e, "TCX refused, falling back to clsact");
                }
            }
        }
        if pinned {
            tracing::warn!(interface = %self.ifname, program, "clsact filters cannot be pinned: this program detaches when the agent exits (a kernel with TCX, 6.6 or later, keeps it)");
        }
        match tc::qdisc_add_clsact(&self.ifname) {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(source) => {
                return Err(QosError::Clsact {
                    ifname: self.ifname.clone(),
                    source: Box::new(source),
                })
            }
        }
        let filters_err = |source| QosError::Filters {
            ifname: self.ifname.clone(),
            source: Box::new(source),
        };
        let ours: Vec<Filter> = clsact::filters(ifindex, hook)
            .map_err(filters_err)?
            .into_iter()
            .filter(Filter::is_agents)
            .collect();
        let id = attach_filter(prog, &self.ifname, direction, &ours)
            .map_err(|e| attach_err("clsact", e))?;
        let link = prog.take_link(id).map_err(|e| attach_err("clsact", e))?;
        let (priority, handle) = (link.priority().ok(), link.handle().ok().map(u32::from));
        self.links.push((program, link));
        // Any other filter of the agent's on this hook would run it a second time.
        for f in &ours {
            if Some(f.priority) == priority && Some(f.handle) == handle {
                continue;
            }
            match clsact::delete_filter(f) {
                Ok(()) => {
                    tracing::info!(filter = %f.describe(), "removed a clsact filter an earlier agent left")
                }
                // Gone meanwhile.
                Err(ClsactError::Netlink { source, .. })
                    if source.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(filters_err(e)),
            }
        }
        Ok(())
    }

    /// Removes the agent's clsact filters on `hook` (left by an earlier agent that
    /// used clsact), once this one has a TCX link there. The program runs either way:
    /// a failure is only logged.
    fn remove_agent_filters(&self, ifindex: u32, hook: Hook) {
        match clsact::remove_agent_filters(ifindex, &[hook]) {
            Ok(removed) => {
                for f in &removed.filters {
                    tracing::info!(filter = %f.describe(), "removed a clsact filter an earlier agent left (TCX runs the program now)");
                }
            }
            Err(e) => {
                tracing::warn!(interface = %self.ifname, error = %e, "looking for clsact filters an earlier agent left failed")
            }
        }
    }
}

/// Attaches `prog` as a clsact filter on `ifname`, given the agent's filters already
/// on that hook (`ours`): one of them (at the agent's place if one is there) gets the
/// program in place, atomically, with no packet missed or run twice; with none, a new
/// filter goes to the agent's place, or where the kernel chooses when another tool's
/// filter holds it.
fn attach_filter(
    prog: &mut SchedClassifier,
    ifname: &str,
    direction: TcAttachType,
    ours: &[Filter],
) -> Result<aya::programs::tc::SchedClassifierLinkId, aya::programs::ProgramError> {
    let eth_p_all = libc::ETH_P_ALL as u16;
    let stale = ours
        .iter()
        .filter(|f| f.protocol == eth_p_all)
        .min_by_key(|f| !f.at_agents_place());
    if let Some(f) = stale {
        let old = SchedClassifierLink::attached(
            ifname,
            direction,
            f.priority,
            TcHandle::from(f.handle),
            None,
        )
        .map_err(|e| aya::programs::ProgramError::from(tc::TcError::IoError(e)))?;
        match prog.attach_to_link(old) {
            Ok(id) => {
                tracing::info!(filter = %f.describe(), "took over the clsact filter an earlier agent left");
                return Ok(id);
            }
            // Gone meanwhile (ENOENT): make a new one.
            Err(e) => {
                tracing::info!(filter = %f.describe(), error = %e, "taking over a clsact filter failed: adding one");
            }
        }
    }
    let place = NlOptions {
        priority: clsact::PRIORITY,
        handle: TcHandle::from(clsact::HANDLE),
        classid: None,
    };
    match prog.attach_with_options(ifname, direction, TcAttachOptions::Netlink(place)) {
        Ok(id) => Ok(id),
        Err(e) => {
            tracing::info!(interface = %ifname, error = %e, priority = clsact::PRIORITY, handle = clsact::HANDLE, "the agent's clsact place is taken: the kernel chooses one");
            prog.attach_with_options(
                ifname,
                direction,
                TcAttachOptions::Netlink(NlOptions::default()),
            )
        }
    }
}

fn is_exists(e: &aya::programs::tc::TcError) -> bool {
    caused_by_os_error(e, &[libc::EEXIST]) || e.to_string().contains("exists")
}

/// Whether `e` or one of its sources is an I/O error with one of `codes` (errno).
pub fn caused_by_os_error(e: &(dyn std::error::Error + 'static), codes: &[i32]) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        let code = c
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error);
        if code.is_some_and(|code| codes.contains(&code)) {
            return true;
        }
        cur = c.source();
    }
    false
}

impl Drop for TcInterface {
    fn drop(&mut self) {
        // Dropping an owned link detaches it.
        let filters = !self.tcx && !self.links.is_empty();
        self.links.clear();
        let (true, Some(ifindex)) = (filters, self.ifindex) else {
            return;
        };
        match clsact::remove_qdisc_if_empty(ifindex) {
            Ok(true) => {
                tracing::debug!(interface = %self.ifname, "removed the clsact qdisc left empty")
            }
            Ok(false) => {}
            // The interface went away, and its qdisc with it.
            Err(ClsactError::Netlink { source, .. })
                if source.raw_os_error() == Some(libc::ENODEV) => {}
            Err(e) => {
                tracing::warn!(interface = %self.ifname, error = %e, "removing the clsact qdisc failed")
            }
        }
    }
}

/// What one interface gets from the settings.
pub fn iface_qos(settings: &Settings, ifname: &str) -> IfaceQos {
    let host = settings.interfaces.iter().any(|i| i == ifname);
    let vtep = settings.vteps.iter().any(|i| i == ifname);
    IfaceQos {
        host: if host { settings.mode.code() } else { 0 },
        vtep: vtep as u8,
        ecn: settings.ecn_propagation.code(),
        _pad: 0,
    }
}

/// For logs and docs: `audit`/`enforce`, `kernel`/`rfc6040`.
pub fn describe(mode: HostMode, ecn: EcnPropagation) -> String {
    format!("{mode:?}/{ecn:?}").to_lowercase()
}

/// VTEPS as (remote address, counters), for the document.
pub fn vtep_records(vteps: &[(VtepKey, VtepStats)]) -> Vec<crate::doc::VtepRecord> {
    vteps
        .iter()
        .map(|(k, s)| crate::doc::VtepRecord::from_entry(k, s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::TcMechanism;

    #[test]
    fn the_environment_forces_tcx_or_clsact_and_anything_else_is_auto() {
        assert_eq!(TcMechanism::parse(Some("clsact")), TcMechanism::Clsact);
        assert_eq!(TcMechanism::parse(Some(" tcx\n")), TcMechanism::Tcx);
        assert_eq!(TcMechanism::parse(Some("netlink")), TcMechanism::Auto);
        assert_eq!(TcMechanism::parse(None), TcMechanism::Auto);
    }
}
