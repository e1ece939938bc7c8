//! The NIC's DCB state over dcbnl, and the `dcb_app`, `pfc` and `dcb_unsupported`
//! checks of `roce-agent check`.
//!
//! No crate speaks dcbnl, so this module does, on a raw NETLINK_ROUTE socket
//! ([`netlink_sys::Socket`]), in layers tested on their own:
//! - here: what dcbnl says about a port ([`DcbState`], [`DcbApp`], [`IeeePfc`],
//!   [`IeeeEts`]) and why it could not say it ([`DcbError`]);
//! - `wire`: requests built and replies read byte by byte, as
//!   `include/uapi/linux/dcbnl.h` lays them out and `net/dcb/dcbnl.c` fills them
//!   ([`encode_ieee_get`], [`decode_ieee_reply`], ...);
//! - `socket`: the exchanges over NETLINK_ROUTE: [`query`], [`set_apps`],
//!   [`delete_apps`], [`set_pfc`];
//! - `check`: [`audit`] turns what [`query`] returned into findings against the
//!   policy;
//! - `fix`: [`fix`] makes what `check --fix` changes; [`fix_commands`] says it as
//!   `dcb` commands (`check --dry-run`).
//!
//! What matters for lossless RoCE: the NIC must classify by DSCP (an app table with
//! DSCP entries; on mlx5 the first one switches the port to trust DSCP) and map the
//! lossless DSCPs, RoCE's and the CNPs' to the priorities the policy gives them; PFC
//! must be on for exactly the lossless priorities.
//!
//! Reading needs no privilege; changing needs CAP_NET_ADMIN. Devices without DCB
//! (veth, vxlan, bridges, lo) answer EOPNOTSUPP: [`DcbError::Unsupported`].

mod check;
mod fix;
mod socket;
mod wire;

use std::io;

pub use check::audit;
pub use fix::{commands as fix_commands, fix};
pub use socket::{delete_apps, query, set_apps, set_pfc};
pub use wire::{
    decode_ieee_reply, encode_app_del, encode_app_set, encode_ieee_get, encode_pfc_set,
};

/// `IEEE_8021QAZ_APP_SEL_DSCP`: the app entry's protocol is a DSCP.
pub const APP_SEL_DSCP: u8 = 5;
/// 802.1Q priorities (and traffic classes) per port.
pub const PRIORITIES: u8 = 8;

/// One app-table entry (`struct dcb_app`): traffic matching `selector`/`protocol`
/// gets 802.1Q priority `priority`. With selector [`APP_SEL_DSCP`], `protocol` is
/// the DSCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DcbApp {
    pub selector: u8,
    pub priority: u8,
    pub protocol: u16,
}

impl DcbApp {
    /// The entry mapping `dscp` to `priority`.
    pub fn dscp(dscp: u8, priority: u8) -> DcbApp {
        DcbApp {
            selector: APP_SEL_DSCP,
            priority,
            protocol: dscp as u16,
        }
    }

    fn is_dscp(&self) -> bool {
        self.selector == APP_SEL_DSCP
    }
}

/// The port's PFC state (`struct ieee_pfc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IeeePfc {
    /// How many traffic classes may have PFC at once (0: none can).
    pub cap: u8,
    /// Bit p set: PFC is on for priority p.
    pub enabled: u8,
    /// MACsec bypass capability.
    pub mbc: u8,
    /// Allowance for the link's round-trip delay, in bits (mlx5: cable length).
    pub delay: u16,
    /// PFC pause frames this port sent, per priority: the port's receive buffer
    /// for that priority filled up (the host could not keep up).
    pub requests: [u64; 8],
    /// PFC pause frames this port received, per priority: the switch asked the
    /// host to stop sending on that priority (congestion towards the fabric).
    pub indications: [u64; 8],
}

impl IeeePfc {
    /// Priorities with PFC on, ascending.
    pub fn enabled_priorities(&self) -> Vec<u8> {
        priorities_of_mask(self.enabled)
    }
}

/// The port's ETS state (`struct ieee_ets`, without the recommendation TLV's fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IeeeEts {
    pub willing: u8,
    /// How many traffic classes the port supports.
    pub ets_cap: u8,
    pub cbs: u8,
    /// Transmit bandwidth share of each traffic class, in percent.
    pub tc_tx_bw: [u8; 8],
    pub tc_rx_bw: [u8; 8],
    /// Scheduling of each traffic class (0 strict, 1 credit-based shaper, 2 ETS,
    /// 255 vendor).
    pub tc_tsa: [u8; 8],
    /// The traffic class of each priority.
    pub prio_tc: [u8; 8],
}

/// What dcbnl's IEEE GET says about one port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DcbState {
    /// The app table, in the kernel's order (IEEE entries only).
    pub apps: Vec<DcbApp>,
    /// None when the driver reports no PFC.
    pub pfc: Option<IeeePfc>,
    /// None when the driver reports no ETS.
    pub ets: Option<IeeeEts>,
    /// DCBX mode bits (`DCB_CAP_DCBX_*`: 0x01 host, 0x02 LLD-managed, 0x04 CEE,
    /// 0x08 IEEE, 0x10 static), when the driver reports them.
    pub dcbx: Option<u8>,
}

impl DcbState {
    /// The priorities the app table gives `dscp`, ascending (several when more than
    /// one entry names it; none when no entry does).
    pub fn dscp_priorities(&self, dscp: u8) -> Vec<u8> {
        let mut p: Vec<u8> = self
            .apps
            .iter()
            .filter(|a| a.is_dscp() && a.protocol == dscp as u16)
            .map(|a| a.priority)
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    }

    fn has_dscp_entries(&self) -> bool {
        self.apps.iter().any(DcbApp::is_dscp)
    }
}

/// Why dcbnl could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DcbError {
    /// EOPNOTSUPP: the device has no DCB (veth, vxlan, bridges, lo), or its driver
    /// does not do what was asked.
    #[error("no DCB support (dcbnl answered EOPNOTSUPP)")]
    Unsupported,
    /// ENODEV: no device of that name in this network namespace.
    #[error("no such device (dcbnl answered ENODEV)")]
    NoDevice,
    /// EPERM or EACCES.
    #[error("not permitted (dcbnl answered EPERM): changing DCB needs CAP_NET_ADMIN")]
    Permission,
    /// The reply ends before what it announces.
    #[error("dcbnl reply cut short: {what} needs {needed} bytes, {got} present")]
    Truncated {
        what: &'static str,
        needed: usize,
        got: usize,
    },
    /// The reply is not what a dcbnl reply looks like.
    #[error("unexpected dcbnl reply: {0}")]
    Malformed(String),
    /// Any other errno the kernel or the driver answered (positive).
    #[error("dcbnl answered errno {errno} ({text})", errno = .0, text = errno_text(*.0))]
    Kernel(i32),
    #[error("netlink socket: {0}")]
    Io(#[from] io::Error),
}

impl DcbError {
    /// The error for a (positive) errno the kernel answered.
    pub fn from_errno(errno: i32) -> DcbError {
        // ENOTSUPP (524) is kernel-internal, but some dcbnl paths leak it.
        const ENOTSUPP: i32 = 524;
        match errno {
            libc::EOPNOTSUPP | ENOTSUPP => DcbError::Unsupported,
            libc::ENODEV => DcbError::NoDevice,
            libc::EPERM | libc::EACCES => DcbError::Permission,
            e => DcbError::Kernel(e),
        }
    }
}

/// `Invalid argument`, without Rust's "(os error N)".
fn errno_text(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    match text.find(" (os error") {
        Some(end) => text[..end].to_string(),
        None => text,
    }
}

/// The priorities whose bit is set in `mask`, ascending.
fn priorities_of_mask(mask: u8) -> Vec<u8> {
    (0..PRIORITIES).filter(|p| mask & (1 << p) != 0).collect()
}

/// The hand-made states the tests of `check` and `fix` read.
#[cfg(test)]
mod test_states {
    use super::{DcbApp, DcbState, IeeePfc};

    /// DSCP-to-priority `apps` and, unless None, PFC enabled on the priorities of
    /// `pfc_mask` (of 8); DCBX IEEE and host-managed.
    pub(super) fn state(apps: &[(u8, u8)], pfc_mask: Option<u8>) -> DcbState {
        DcbState {
            apps: apps.iter().map(|(d, p)| DcbApp::dscp(*d, *p)).collect(),
            pfc: pfc_mask.map(|enabled| IeeePfc {
                cap: 8,
                enabled,
                delay: 77,
                ..IeeePfc::default()
            }),
            ets: None,
            dcbx: Some(0x09),
        }
    }

    /// What the default policy asks for: DSCP 26 on priority 3, 48 on 6, PFC on 3.
    pub(super) fn right() -> DcbState {
        state(&[(26, 3), (48, 6)], Some(1 << 3))
    }
}
