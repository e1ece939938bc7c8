//! Host QoS enforcement: attaches `tc_egress` (and on VTEP underlays `tc_ingress`) to
//! an interface, and owns that attachment: dropping a [`TcInterface`] detaches its
//! programs (unless they are pinned) and removes any clsact qdisc it added. Which
//! interfaces get what is `attach::Attachments`' business.
//!
//! Attaching tries a TCX link first (kernels >= 6.6) and falls back to a clsact qdisc
//! with a direct-action filter; [`TcMechanism`] forces either (the tests run both).

use std::io;

use aya::programs::tc::SchedClassifierLink;
use aya::programs::tc::{self, NlOptions, TcAttachOptions};
use aya::programs::{LinkOrder, TcAttachType};
use roce_common::policy::{IfaceQos, VtepKey, VtepStats};

use crate::config::{EcnPropagation, HostMode, Settings};
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

/// The programs attached to one interface. Dropping it detaches them, then removes
/// the clsact qdisc if this value added it.
pub struct TcInterface {
    pub ifname: String,
    links: Vec<(&'static str, SchedClassifierLink)>,
    added_clsact: bool,
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
            links: Vec::new(),
            added_clsact: false,
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
        if direction == TcAttachType::Ingress {
            self.ingress = true;
        }
        if how != TcMechanism::Clsact && loaded.adopt_link(program, ifindex)? {
            // A pinned TCX link of an earlier agent now runs this program.
            self.tcx = true;
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
        if !self.added_clsact {
            match tc::qdisc_add_clsact(&self.ifname) {
                Ok(()) => self.added_clsact = true,
                Err(e) if is_exists(&e) => {}
                Err(source) => {
                    return Err(QosError::Clsact {
                        ifname: self.ifname.clone(),
                        source: Box::new(source),
                    })
                }
            }
        }
        let id = prog
            .attach_with_options(
                &self.ifname,
                direction,
                TcAttachOptions::Netlink(NlOptions::default()),
            )
            .map_err(|e| attach_err("clsact", e))?;
        let link = prog.take_link(id).map_err(|e| attach_err("clsact", e))?;
        self.links.push((program, link));
        Ok(())
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
        self.links.clear();
        if self.added_clsact {
            if let Err(e) = netlink::del_clsact(&self.ifname) {
                tracing::warn!(interface = %self.ifname, error = %e, "removing the clsact qdisc failed");
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

/// Removing a clsact qdisc (aya adds them but has no call to remove one).
mod netlink {
    use std::io;

    const RTM_DELQDISC: u16 = 37;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    const NLMSG_ERROR: u16 = 2;
    const TC_H_CLSACT: u32 = 0xFFFF_FFF1;
    const CLSACT_HANDLE: u32 = 0xFFFF_0000;

    #[repr(C)]
    struct Request {
        // struct nlmsghdr
        len: u32,
        kind: u16,
        flags: u16,
        seq: u32,
        pid: u32,
        // struct tcmsg
        family: u8,
        pad1: u8,
        pad2: u16,
        ifindex: i32,
        handle: u32,
        parent: u32,
        info: u32,
    }

    /// `tc qdisc del dev IF clsact`.
    pub fn del_clsact(ifname: &str) -> io::Result<()> {
        let index = crate::sys::netif::index_of(ifname)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, ifname.to_string()))?;
        // SAFETY: plain socket calls on buffers we own, of the sizes given.
        unsafe {
            let fd = libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let req = Request {
                len: std::mem::size_of::<Request>() as u32,
                kind: RTM_DELQDISC,
                flags: NLM_F_REQUEST | NLM_F_ACK,
                seq: 1,
                pid: 0,
                family: libc::AF_UNSPEC as u8,
                pad1: 0,
                pad2: 0,
                ifindex: index as i32,
                handle: CLSACT_HANDLE,
                parent: TC_H_CLSACT,
                info: 0,
            };
            let sent = libc::send(
                fd,
                &req as *const Request as *const libc::c_void,
                std::mem::size_of::<Request>(),
                0,
            );
            if sent < 0 {
                let e = io::Error::last_os_error();
                libc::close(fd);
                return Err(e);
            }
            let mut buf = [0u8; 1024];
            let n = libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0);
            let result = if n < 0 {
                Err(io::Error::last_os_error())
            } else if n >= 20 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
                let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
                if code == 0 {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(-code))
                }
            } else {
                Err(io::Error::other("unexpected netlink answer"))
            };
            libc::close(fd);
            result
        }
    }
}
