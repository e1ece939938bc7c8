//! The NIC's DCB state over dcbnl, and the `dcb_app`, `pfc` and `dcb_unsupported`
//! checks of `roce-agent check`.
//!
//! No crate speaks dcbnl, so this module does, on a raw NETLINK_ROUTE socket
//! ([`netlink_sys::Socket`]), in three layers tested on their own:
//! - the codec: requests built and replies read byte by byte, as
//!   `include/uapi/linux/dcbnl.h` lays them out and `net/dcb/dcbnl.c` fills them
//!   ([`encode_ieee_get`], [`decode_ieee_reply`], ...);
//! - the socket: [`query`], [`set_apps`], [`delete_apps`], [`set_pfc`];
//! - the judging: [`audit`] turns what [`query`] returned into findings against the
//!   policy, and [`fix`] makes what `check --fix` changes.
//!
//! What matters for lossless RoCE: the NIC must classify by DSCP (an app table with
//! DSCP entries; on mlx5 the first one switches the port to trust DSCP) and map the
//! lossless DSCPs, RoCE's and the CNPs' to the priorities the policy gives them; PFC
//! must be on for exactly the lossless priorities.
//!
//! Reading needs no privilege; changing needs CAP_NET_ADMIN. Devices without DCB
//! (veth, vxlan, bridges, lo) answer EOPNOTSUPP: [`DcbError::Unsupported`].

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use roce_common::policy::{Policy, DSCP_COUNT};

use super::{finding, Change, Finding, Severity};

// ---------------------------------------------------------------------------------
// Wire constants (include/uapi/linux/{netlink,rtnetlink,dcbnl}.h)

const NLMSG_ERROR: u16 = 2;
const RTM_GETDCB: u16 = 78;
const RTM_SETDCB: u16 = 79;
const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_ACK: u16 = 0x04;
const NLMSG_HDRLEN: usize = 16;
const NLA_HDRLEN: usize = 4;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);
/// `struct dcbmsg`: family, cmd, 2 bytes of padding.
const DCBMSG_LEN: usize = 4;

/// `enum dcbnl_commands`. IEEE_DEL is 27, not 23 (23 is DCB_CMD_SDCBX).
const DCB_CMD_IEEE_SET: u8 = 20;
const DCB_CMD_IEEE_GET: u8 = 21;
const DCB_CMD_IEEE_DEL: u8 = 27;

/// `enum dcbnl_attrs`.
const DCB_ATTR_IFNAME: u16 = 1;
const DCB_ATTR_IEEE: u16 = 13;
const DCB_ATTR_DCBX: u16 = 14;

/// `enum ieee_attrs`, inside DCB_ATTR_IEEE.
const DCB_ATTR_IEEE_ETS: u16 = 1;
const DCB_ATTR_IEEE_PFC: u16 = 2;
const DCB_ATTR_IEEE_APP_TABLE: u16 = 3;
/// `enum ieee_attrs_app`, inside DCB_ATTR_IEEE_APP_TABLE.
const DCB_ATTR_IEEE_APP: u16 = 1;

/// `struct ieee_ets`: 3 bytes, then seven arrays of 8.
const IEEE_ETS_LEN: usize = 59;
/// `struct ieee_pfc`: pfc_cap, pfc_en, mbc, pad, delay (u16), pad, requests[8],
/// indications[8] (u64, 8-aligned).
const IEEE_PFC_LEN: usize = 136;
const PFC_REQUESTS_AT: usize = 8;
const PFC_INDICATIONS_AT: usize = 72;
/// `struct dcb_app`: selector, priority, protocol (u16).
const DCB_APP_LEN: usize = 4;

/// `IEEE_8021QAZ_APP_SEL_DSCP`: the app entry's protocol is a DSCP.
pub const APP_SEL_DSCP: u8 = 5;
/// 802.1Q priorities (and traffic classes) per port.
pub const PRIORITIES: u8 = 8;

/// Longest interface name (IFNAMSIZ less the NUL).
const IFNAME_MAX: usize = 15;
/// How long a reply may take: the kernel answers at once, a driver talking to
/// firmware in well under a second.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// dcbnl replies fit in one page (NLMSG_DEFAULT_SIZE); this leaves room to spare.
const RECEIVE_BUFFER: usize = 64 * 1024;

// ---------------------------------------------------------------------------------
// Types

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

    fn to_bytes(self) -> [u8; DCB_APP_LEN] {
        let p = self.protocol.to_ne_bytes();
        [self.selector, self.priority, p[0], p[1]]
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

    fn to_bytes(self) -> [u8; IEEE_PFC_LEN] {
        let mut b = [0u8; IEEE_PFC_LEN];
        b[0] = self.cap;
        b[1] = self.enabled;
        b[2] = self.mbc;
        b[4..6].copy_from_slice(&self.delay.to_ne_bytes());
        for (i, (req, ind)) in self.requests.iter().zip(&self.indications).enumerate() {
            let (r, n) = (PFC_REQUESTS_AT + 8 * i, PFC_INDICATIONS_AT + 8 * i);
            b[r..r + 8].copy_from_slice(&req.to_ne_bytes());
            b[n..n + 8].copy_from_slice(&ind.to_ne_bytes());
        }
        b
    }

    fn from_bytes(b: &[u8]) -> Result<IeeePfc, DcbError> {
        let b = need(b, IEEE_PFC_LEN, "ieee_pfc")?;
        let mut pfc = IeeePfc {
            cap: b[0],
            enabled: b[1],
            mbc: b[2],
            delay: u16::from_ne_bytes([b[4], b[5]]),
            ..IeeePfc::default()
        };
        for i in 0..8 {
            pfc.requests[i] = u64_at(b, PFC_REQUESTS_AT + 8 * i);
            pfc.indications[i] = u64_at(b, PFC_INDICATIONS_AT + 8 * i);
        }
        Ok(pfc)
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

impl IeeeEts {
    fn from_bytes(b: &[u8]) -> Result<IeeeEts, DcbError> {
        let b = need(b, IEEE_ETS_LEN, "ieee_ets")?;
        let array = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            a
        };
        Ok(IeeeEts {
            willing: b[0],
            ets_cap: b[1],
            cbs: b[2],
            tc_tx_bw: array(3),
            tc_rx_bw: array(11),
            tc_tsa: array(19),
            prio_tc: array(27),
        })
    }
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

// ---------------------------------------------------------------------------------
// Codec: requests

/// A message under construction: netlink header, dcbmsg, attributes.
struct Request {
    buf: Vec<u8>,
}

impl Request {
    fn new(kind: u16, flags: u16, seq: u32, cmd: u8, ifname: &str) -> Request {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, set by finish()
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel fills it
        buf.extend_from_slice(&[libc::AF_UNSPEC as u8, cmd, 0, 0]);
        let mut r = Request { buf };
        let mut name = ifname.as_bytes().to_vec();
        name.push(0);
        r.attr(DCB_ATTR_IFNAME, &name);
        r
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) {
        let start = self.begin(kind);
        self.buf.extend_from_slice(payload);
        self.end(start);
    }

    /// Opens a nested attribute; returns where it starts, for [`Request::end`].
    fn begin(&mut self, kind: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        start
    }

    /// Sets the attribute's length (header and payload, no padding) and pads it.
    fn end(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf.resize(align4(self.buf.len()), 0);
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// RTM_GETDCB / DCB_CMD_IEEE_GET for `ifname`: the whole IEEE state in one reply.
pub fn encode_ieee_get(ifname: &str, seq: u32) -> Vec<u8> {
    Request::new(RTM_GETDCB, NLM_F_REQUEST, seq, DCB_CMD_IEEE_GET, ifname).finish()
}

/// A SET or DEL carrying an app table.
fn encode_apps(cmd: u8, ifname: &str, seq: u32, apps: &[DcbApp]) -> Vec<u8> {
    let mut r = Request::new(RTM_SETDCB, NLM_F_REQUEST | NLM_F_ACK, seq, cmd, ifname);
    let ieee = r.begin(DCB_ATTR_IEEE | NLA_F_NESTED);
    let table = r.begin(DCB_ATTR_IEEE_APP_TABLE | NLA_F_NESTED);
    for app in apps {
        r.attr(DCB_ATTR_IEEE_APP, &app.to_bytes());
    }
    r.end(table);
    r.end(ieee);
    r.finish()
}

/// RTM_SETDCB / DCB_CMD_IEEE_SET adding `apps` to `ifname`'s app table. The kernel
/// keeps one entry per (selector, protocol, priority): adding 26->3 next to 26->0
/// leaves both (mlx5 replaces; some drivers refuse a second priority).
pub fn encode_app_set(ifname: &str, seq: u32, apps: &[DcbApp]) -> Vec<u8> {
    encode_apps(DCB_CMD_IEEE_SET, ifname, seq, apps)
}

/// RTM_SETDCB / DCB_CMD_IEEE_DEL removing `apps` (matched on selector, protocol
/// and priority) from `ifname`'s app table.
pub fn encode_app_del(ifname: &str, seq: u32, apps: &[DcbApp]) -> Vec<u8> {
    encode_apps(DCB_CMD_IEEE_DEL, ifname, seq, apps)
}

/// RTM_SETDCB / DCB_CMD_IEEE_SET with `pfc`. Drivers read `enabled` (and mlx5 a
/// non-zero `delay`); the counters are ignored.
pub fn encode_pfc_set(ifname: &str, seq: u32, pfc: &IeeePfc) -> Vec<u8> {
    let mut r = Request::new(
        RTM_SETDCB,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        DCB_CMD_IEEE_SET,
        ifname,
    );
    let ieee = r.begin(DCB_ATTR_IEEE | NLA_F_NESTED);
    r.attr(DCB_ATTR_IEEE_PFC, &pfc.to_bytes());
    r.end(ieee);
    r.finish()
}

// ---------------------------------------------------------------------------------
// Codec: replies

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// `b`, checked to hold at least `needed` bytes.
fn need<'a>(b: &'a [u8], needed: usize, what: &'static str) -> Result<&'a [u8], DcbError> {
    if b.len() < needed {
        return Err(DcbError::Truncated {
            what,
            needed,
            got: b.len(),
        });
    }
    Ok(b)
}

/// The native-endian u64 at `at` (the caller checked the length).
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// A netlink message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    len: usize,
    kind: u16,
    seq: u32,
}

/// The first message of `buf`: its header and its payload (after the header).
fn message(buf: &[u8]) -> Result<(Header, &[u8]), DcbError> {
    let b = need(buf, NLMSG_HDRLEN, "netlink header")?;
    let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let header = Header {
        len,
        kind: u16::from_ne_bytes([b[4], b[5]]),
        seq: u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
    };
    if len < NLMSG_HDRLEN {
        return Err(DcbError::Malformed(format!(
            "netlink message length {len} is shorter than its header"
        )));
    }
    let whole = need(buf, len, "netlink message")?;
    Ok((header, &whole[NLMSG_HDRLEN..len]))
}

/// The messages of one datagram, each as its own slice (header included).
fn messages(mut buf: &[u8]) -> Result<Vec<&[u8]>, DcbError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (header, _) = message(buf)?;
        out.push(&buf[..header.len]);
        buf = &buf[align4(header.len).min(buf.len())..];
    }
    Ok(out)
}

/// The errno of an NLMSG_ERROR payload (`struct nlmsgerr`): 0 for an ack, else the
/// positive errno.
fn error_code(payload: &[u8]) -> Result<i32, DcbError> {
    let b = need(payload, 4, "nlmsgerr")?;
    let code = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    Ok(code.checked_neg().unwrap_or(i32::MAX))
}

/// The attributes of `buf` as (type without the NLA_F_* bits, payload), in order.
fn attributes(mut buf: &[u8]) -> Result<Vec<(u16, &[u8])>, DcbError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let b = need(buf, NLA_HDRLEN, "attribute header")?;
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN {
            return Err(DcbError::Malformed(format!(
                "attribute {kind} has length {len}, shorter than its header"
            )));
        }
        let whole = need(buf, len, "attribute")?;
        out.push((kind, &whole[NLA_HDRLEN..len]));
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

/// The state in an RTM_GETDCB / DCB_CMD_IEEE_GET reply (`buf` starts at its netlink
/// header). An NLMSG_ERROR reply gives its errno as the error. Unknown attributes
/// (peer state, maxrate, buffers, rewrite and trust tables, ...) are skipped.
pub fn decode_ieee_reply(buf: &[u8]) -> Result<DcbState, DcbError> {
    let (header, payload) = message(buf)?;
    match header.kind {
        NLMSG_ERROR => {
            return Err(match error_code(payload)? {
                0 => DcbError::Malformed("an acknowledgement instead of the DCB state".into()),
                errno => DcbError::from_errno(errno),
            })
        }
        RTM_GETDCB => {}
        other => {
            return Err(DcbError::Malformed(format!(
                "message type {other} instead of RTM_GETDCB"
            )))
        }
    }
    let dcb = need(payload, DCBMSG_LEN, "dcbmsg")?;
    if dcb[1] != DCB_CMD_IEEE_GET {
        return Err(DcbError::Malformed(format!(
            "dcbnl command {} instead of IEEE_GET",
            dcb[1]
        )));
    }
    let mut state = DcbState::default();
    for (kind, value) in attributes(&dcb[DCBMSG_LEN..])? {
        match kind {
            DCB_ATTR_IEEE => decode_ieee(value, &mut state)?,
            DCB_ATTR_DCBX => state.dcbx = value.first().copied(),
            _ => {}
        }
    }
    Ok(state)
}

/// The DCB_ATTR_IEEE nest of a GET reply.
fn decode_ieee(nest: &[u8], state: &mut DcbState) -> Result<(), DcbError> {
    for (kind, value) in attributes(nest)? {
        match kind {
            DCB_ATTR_IEEE_ETS => state.ets = Some(IeeeEts::from_bytes(value)?),
            DCB_ATTR_IEEE_PFC => state.pfc = Some(IeeePfc::from_bytes(value)?),
            DCB_ATTR_IEEE_APP_TABLE => {
                for (kind, app) in attributes(value)? {
                    // Type 2 (DCB_ATTR_DCB_APP) holds PCP entries: not ours.
                    if kind != DCB_ATTR_IEEE_APP {
                        continue;
                    }
                    let a = need(app, DCB_APP_LEN, "dcb_app")?;
                    state.apps.push(DcbApp {
                        selector: a[0],
                        priority: a[1],
                        protocol: u16::from_ne_bytes([a[2], a[3]]),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// One message of the replies to a SET or DEL (sent with NLM_F_ACK): the RTM_SETDCB
/// reply carries the driver's status in a u8 DCB_ATTR_IEEE (a negative errno cut to
/// 8 bits: the netlink exchange itself succeeds when the driver fails), then the
/// kernel acknowledges. Some(()) when the exchange ended well, None to read on.
fn set_reply_step(buf: &[u8]) -> Result<Option<()>, DcbError> {
    let (header, payload) = message(buf)?;
    match header.kind {
        NLMSG_ERROR => match error_code(payload)? {
            0 => Ok(Some(())),
            errno => Err(DcbError::from_errno(errno)),
        },
        RTM_SETDCB => {
            let dcb = need(payload, DCBMSG_LEN, "dcbmsg")?;
            for (kind, value) in attributes(&dcb[DCBMSG_LEN..])? {
                if kind == DCB_ATTR_IEEE {
                    let status = need(value, 1, "set status")?[0];
                    if status != 0 {
                        return Err(DcbError::from_errno((status as i8).unsigned_abs() as i32));
                    }
                }
            }
            Ok(None)
        }
        other => Err(DcbError::Malformed(format!(
            "message type {other} in reply to RTM_SETDCB"
        ))),
    }
}

// ---------------------------------------------------------------------------------
// Socket

static SEQUENCE: AtomicU32 = AtomicU32::new(1);

fn next_seq() -> u32 {
    SEQUENCE.fetch_add(1, Ordering::Relaxed)
}

/// No kernel device can have this name: answered without asking.
fn check_name(ifname: &str) -> Result<(), DcbError> {
    if ifname.is_empty() || ifname.len() > IFNAME_MAX || ifname.contains(['\0', '/']) {
        return Err(DcbError::NoDevice);
    }
    Ok(())
}

fn no_reply() -> DcbError {
    DcbError::Io(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no reply from dcbnl within {} s", REPLY_TIMEOUT.as_secs()),
    ))
}

/// Sends `request` (sequence `seq`) on a new socket and hands every reply message of
/// that sequence to `step` until it returns a value or an error. Never waits longer
/// than REPLY_TIMEOUT in all.
fn exchange<T>(
    request: &[u8],
    seq: u32,
    mut step: impl FnMut(&[u8]) -> Result<Option<T>, DcbError>,
) -> Result<T, DcbError> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    super::link::set_receive_timeout(&socket, REPLY_TIMEOUT)?;
    socket.send_to(request, &SocketAddr::new(0, 0), 0)?;
    let deadline = Instant::now() + REPLY_TIMEOUT;
    let mut buf: Vec<u8> = Vec::with_capacity(RECEIVE_BUFFER);
    while Instant::now() < deadline {
        buf.clear();
        let from = match socket.recv_from(&mut buf, 0) {
            Ok((_, from)) => from,
            Err(e) => match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => return Err(no_reply()),
                _ => return Err(e.into()),
            },
        };
        if from.port_number() != 0 {
            continue; // not from the kernel
        }
        for m in messages(&buf)? {
            if message(m)?.0.seq != seq {
                continue;
            }
            if let Some(done) = step(m)? {
                return Ok(done);
            }
        }
    }
    Err(no_reply())
}

/// The DCB state of `ifname` (in the calling thread's network namespace). Needs no
/// privilege.
pub fn query(ifname: &str) -> Result<DcbState, DcbError> {
    check_name(ifname)?;
    let seq = next_seq();
    exchange(&encode_ieee_get(ifname, seq), seq, |m| {
        decode_ieee_reply(m).map(Some)
    })
}

/// An acknowledged RTM_SETDCB: `request_of` builds it for a sequence number.
fn set(ifname: &str, request_of: impl FnOnce(u32) -> Vec<u8>) -> Result<(), DcbError> {
    check_name(ifname)?;
    let seq = next_seq();
    exchange(&request_of(seq), seq, set_reply_step)
}

/// Adds `apps` to `ifname`'s app table (see [`encode_app_set`]). Needs CAP_NET_ADMIN.
pub fn set_apps(ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
    if apps.is_empty() {
        return Ok(());
    }
    set(ifname, |seq| encode_app_set(ifname, seq, apps))
}

/// Removes `apps` from `ifname`'s app table. Needs CAP_NET_ADMIN.
pub fn delete_apps(ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
    if apps.is_empty() {
        return Ok(());
    }
    set(ifname, |seq| encode_app_del(ifname, seq, apps))
}

/// Sets `ifname`'s PFC state. Needs CAP_NET_ADMIN.
pub fn set_pfc(ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError> {
    set(ifname, |seq| encode_pfc_set(ifname, seq, pfc))
}

// ---------------------------------------------------------------------------------
// Checks

/// The policy's priority for `dscp`, when it is an 802.1Q priority (0..7): a larger
/// skb priority has no app-table or PFC counterpart to compare with.
fn policy_priority(policy: &Policy, dscp: u8) -> Option<u8> {
    let p = policy.table.get(dscp as usize)?.priority;
    u8::try_from(p).ok().filter(|p| *p < PRIORITIES)
}

/// The DSCPs whose priority the fabric depends on: the lossless ones, RoCE data's and
/// the CNPs', ascending, each with the priority the policy gives it.
fn dscps_that_matter(policy: &Policy) -> Vec<(u8, u8)> {
    let mut dscps: Vec<u8> = (0..DSCP_COUNT as u8)
        .filter(|d| policy.is_lossless(*d))
        .chain([policy.qos.roce_dscp, policy.qos.cnp_dscp])
        .filter(|d| (*d as u32) < DSCP_COUNT)
        .collect();
    dscps.sort_unstable();
    dscps.dedup();
    dscps
        .into_iter()
        .filter_map(|d| Some((d, policy_priority(policy, d)?)))
        .collect()
}

/// Bit mask of the priorities PFC must protect: those of the lossless DSCPs.
fn lossless_priority_mask(policy: &Policy) -> u8 {
    (0..DSCP_COUNT as u8)
        .filter(|d| policy.is_lossless(*d))
        .filter_map(|d| policy_priority(policy, d))
        .fold(0, |m, p| m | 1 << p)
}

fn priorities_of_mask(mask: u8) -> Vec<u8> {
    (0..PRIORITIES).filter(|p| mask & (1 << p) != 0).collect()
}

fn join(items: &[u8]) -> String {
    items
        .iter()
        .map(u8::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `DSCP 26 -> priority 3`, `DSCP 26 -> priorities 0, 3`, `DSCP 26 -> no app entry`.
fn dscp_mapping_text(dscp: u8, priorities: &[u8]) -> String {
    match priorities {
        [] => format!("DSCP {dscp} -> no app entry"),
        [p] => format!("DSCP {dscp} -> priority {p}"),
        ps => format!("DSCP {dscp} -> priorities {}", join(ps)),
    }
}

/// `PFC on priorities 3, 4` or `PFC on no priority`.
fn pfc_text(mask: u8) -> String {
    match priorities_of_mask(mask).as_slice() {
        [] => "PFC on no priority".to_string(),
        ps => format!("PFC on priorities {}", join(ps)),
    }
}

/// `dcb app replace dev IF dscp-prio 26:3 48:6`.
fn app_fix_command(ifname: &str, pairs: &[(u8, u8)]) -> String {
    let map: Vec<String> = pairs.iter().map(|(d, p)| format!("{d}:{p}")).collect();
    format!("dcb app replace dev {ifname} dscp-prio {}", map.join(" "))
}

/// `dcb pfc set dev IF prio-pfc 0:off 1:off 2:off 3:on ...`.
fn pfc_fix_command(ifname: &str, mask: u8) -> String {
    let map: Vec<String> = (0..PRIORITIES)
        .map(|p| format!("{p}:{}", if mask & (1 << p) != 0 { "on" } else { "off" }))
        .collect();
    format!("dcb pfc set dev {ifname} prio-pfc {}", map.join(" "))
}

/// The findings of the `dcb_app`, `pfc` and `dcb_unsupported` checks for `ifname`,
/// from what [`query`] returned.
///
/// - No DCB on the device: one `dcb_unsupported` Info finding (virtual devices have
///   none; the checks belong on the physical port).
/// - Not permitted to read: one Warning, the checks skipped. Any other error: one
///   Error naming dcbnl, the interface and the errno. Both under check `dcb_app`,
///   saying that `pfc` was not checked either.
/// - `dcb_app` (Error): every DSCP that matters (lossless, RoCE, CNP) must have
///   exactly one DSCP app entry, with the policy's priority; no DSCP entry at all
///   means the port trusts PCP (one Error). Other DSCP entries that differ from the
///   policy: one Warning. DSCPs whose policy priority is above 7 are not compared.
/// - `pfc` (Error): PFC on exactly the priorities of the lossless DSCPs.
pub fn audit(ifname: &str, state: &Result<DcbState, DcbError>, policy: &Policy) -> Vec<Finding> {
    let iface = Some(ifname);
    match state {
        Ok(state) => {
            let mut out = app_findings(ifname, state, policy);
            out.extend(pfc_finding(ifname, state, policy));
            out
        }
        Err(DcbError::Unsupported) => vec![finding(
            "dcb_unsupported",
            iface,
            Severity::Info,
            format!(
                "{ifname} has no DCB: dcbnl answered EOPNOTSUPP (veth, vxlan, bridges \
                 and lo have none)"
            ),
            "DCB (DSCP app table, PFC) on the NIC port that carries RoCE",
            format!(
                "nothing to change on {ifname}; audit the physical RoCE port \
                 (`dcb app show dev PORT`)"
            ),
        )],
        Err(DcbError::Permission) => vec![finding(
            "dcb_app",
            iface,
            Severity::Warning,
            format!(
                "dcb_app and pfc not checked on {ifname}: dcbnl refused to answer \
                 (EPERM/EACCES)"
            ),
            "the DCB state readable over dcbnl",
            "run the check as root, or with CAP_NET_ADMIN",
        )],
        Err(e) => vec![finding(
            "dcb_app",
            iface,
            Severity::Error,
            format!("dcb_app and pfc not checked: dcbnl on {ifname}: {e}"),
            format!("the DCB state of {ifname} readable over dcbnl"),
            match e {
                DcbError::NoDevice => "check the interface name (`ip link show`)".to_string(),
                _ => format!("compare with `dcb app show dev {ifname}`"),
            },
        )],
    }
}

fn app_findings(ifname: &str, state: &DcbState, policy: &Policy) -> Vec<Finding> {
    let iface = Some(ifname);
    let matter = dscps_that_matter(policy);
    if matter.is_empty() {
        return Vec::new();
    }
    if !state.has_dscp_entries() {
        let wanted: Vec<String> = matter
            .iter()
            .map(|(d, p)| dscp_mapping_text(*d, &[*p]))
            .collect();
        return vec![finding(
            "dcb_app",
            iface,
            Severity::Error,
            format!(
                "no DSCP app entries: {ifname} trusts PCP (the VLAN tag's priority), \
                 not DSCP"
            ),
            wanted.join(", "),
            app_fix_command(ifname, &matter),
        )];
    }
    let mut out = Vec::new();
    for &(dscp, want) in &matter {
        let have = state.dscp_priorities(dscp);
        if have != [want] {
            out.push(finding(
                "dcb_app",
                iface,
                Severity::Error,
                dscp_mapping_text(dscp, &have),
                dscp_mapping_text(dscp, &[want]),
                app_fix_command(ifname, &[(dscp, want)]),
            ));
        }
    }
    // The rest of the table: only entries that exist are compared (no entry leaves
    // the NIC's default, which the policy does not describe).
    let mut others: Vec<(u8, Vec<u8>, u8)> = Vec::new();
    for dscp in 0..DSCP_COUNT as u8 {
        if matter.iter().any(|(d, _)| *d == dscp) {
            continue;
        }
        let have = state.dscp_priorities(dscp);
        if let Some(want) = policy_priority(policy, dscp) {
            if !have.is_empty() && have != [want] {
                others.push((dscp, have, want));
            }
        }
    }
    if !others.is_empty() {
        let found: Vec<String> = others
            .iter()
            .map(|(d, have, _)| dscp_mapping_text(*d, have))
            .collect();
        let expected: Vec<String> = others
            .iter()
            .map(|(d, _, want)| dscp_mapping_text(*d, &[*want]))
            .collect();
        let pairs: Vec<(u8, u8)> = others.iter().map(|(d, _, want)| (*d, *want)).collect();
        out.push(finding(
            "dcb_app",
            iface,
            Severity::Warning,
            found.join("; "),
            expected.join("; "),
            app_fix_command(ifname, &pairs),
        ));
    }
    out
}

fn pfc_finding(ifname: &str, state: &DcbState, policy: &Policy) -> Option<Finding> {
    let want = lossless_priority_mask(policy);
    let Some(pfc) = state.pfc else {
        return Some(finding(
            "pfc",
            Some(ifname),
            Severity::Error,
            format!("{ifname} reports no PFC state over dcbnl (its driver has no IEEE PFC)"),
            pfc_text(want),
            "configure PFC with the NIC vendor's tool",
        ));
    };
    if pfc.enabled == want {
        return None;
    }
    let mut found = pfc_text(pfc.enabled);
    if pfc.cap == 0 {
        found.push_str(" (pfc_cap 0: the NIC reports no traffic class that can have PFC)");
    }
    Some(finding(
        "pfc",
        Some(ifname),
        Severity::Error,
        found,
        pfc_text(want),
        pfc_fix_command(ifname, want),
    ))
}

// ---------------------------------------------------------------------------------
// Fix

/// What to do for one DSCP whose app entries differ from the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AppRepair {
    dscp: u8,
    /// Entries of this DSCP with another priority: deleted first (entries are per
    /// (selector, protocol, priority), and some drivers refuse a second priority).
    remove: Vec<DcbApp>,
    /// The policy's entry, when it is not there yet.
    add: Option<DcbApp>,
    before: Vec<u8>,
    after: u8,
}

/// What [`fix`] would do, in order: repairs that only add first (so that on mlx5 the
/// port never drops its last DSCP entry, which would switch it back to trust PCP),
/// then delete-and-add pairs; then the PFC state to set.
fn plan(state: &DcbState, policy: &Policy) -> (Vec<AppRepair>, Option<IeeePfc>) {
    let mut repairs: Vec<AppRepair> = dscps_that_matter(policy)
        .into_iter()
        .filter_map(|(dscp, want)| {
            let before = state.dscp_priorities(dscp);
            if before == [want] {
                return None;
            }
            let remove = before
                .iter()
                .filter(|p| **p != want)
                .map(|p| DcbApp::dscp(dscp, *p))
                .collect();
            let add = (!before.contains(&want)).then(|| DcbApp::dscp(dscp, want));
            Some(AppRepair {
                dscp,
                remove,
                add,
                before,
                after: want,
            })
        })
        .collect();
    repairs.sort_by_key(|r| !r.remove.is_empty());
    let want = lossless_priority_mask(policy);
    let pfc = state
        .pfc
        .filter(|p| p.enabled != want)
        .map(|p| IeeePfc { enabled: want, ..p });
    (repairs, pfc)
}

/// Makes `ifname`'s DCB state what the policy needs: the app entries of the DSCPs
/// that matter (a wrong entry of the same DSCP deleted first) and the PFC mask.
/// Returns each change made. Only for devices with DCB (`query` succeeded); needs
/// CAP_NET_ADMIN. Other DSCPs' entries (the `dcb_app` Warning) are left alone.
///
/// On an error, the changes made before it stay made (a new [`query`] shows them).
pub fn fix(ifname: &str, state: &DcbState, policy: &Policy) -> (Vec<Change>, Result<(), DcbError>) {
    let mut changes = Vec::new();
    // What was changed before a failure is reported too: nothing half-applied unsaid.
    let result = apply(ifname, state, policy, &mut changes);
    (changes, result)
}

fn apply(
    ifname: &str,
    state: &DcbState,
    policy: &Policy,
    changes: &mut Vec<Change>,
) -> Result<(), DcbError> {
    let (repairs, pfc) = plan(state, policy);
    for r in repairs {
        delete_apps(ifname, &r.remove)?;
        if let Some(add) = r.add {
            set_apps(ifname, &[add])?;
        }
        changes.push(Change {
            check: "dcb_app".to_string(),
            interface: ifname.to_string(),
            what: format!("app DSCP {}", r.dscp),
            before: priorities_text(&r.before),
            after: priorities_text(&[r.after]),
        });
    }
    if let (Some(new), Some(old)) = (pfc, state.pfc) {
        set_pfc(ifname, &new)?;
        changes.push(Change {
            check: "pfc".to_string(),
            interface: ifname.to_string(),
            what: "pfc".to_string(),
            before: pfc_text(old.enabled),
            after: pfc_text(new.enabled),
        });
    }
    Ok(())
}

/// `priority 3`, `priorities 0, 3`, `no entry`.
fn priorities_text(p: &[u8]) -> String {
    match p {
        [] => "no entry".to_string(),
        [p] => format!("priority {p}"),
        ps => format!("priorities {}", join(ps)),
    }
}

#[cfg(test)]
mod tests {
    //! Replies built byte by byte as net/dcb/dcbnl.c builds them (dcbnl_ieee_fill,
    //! dcbnl_ieee_set, netlink_ack), requests checked field by field, and the checks
    //! on hand-made states.
    use super::*;
    use roce_common::policy::ENTRY_LOSSLESS;

    const IF: &str = "eth1";

    // Attributes the kernel sends that this module does not read (enum ieee_attrs).
    const DCB_ATTR_IEEE_PEER_PFC: u16 = 5;
    const DCB_ATTR_IEEE_MAXRATE: u16 = 7;
    const DCB_ATTR_DCB_BUFFER: u16 = 10;
    const DCB_ATTR_DCB_APP_TRUST_TABLE: u16 = 11;
    const DCB_ATTR_DCB_REWR_TABLE: u16 = 12;
    /// `enum ieee_attrs_app`: PCP entries of the rewrite table.
    const DCB_ATTR_DCB_APP: u16 = 2;
    const APP_SEL_ETHERTYPE: u8 = 1;
    const APP_SEL_PCP: u8 = 255;

    // ----- byte builders, independent of the module's encoder

    fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut a = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
        a.extend(kind.to_ne_bytes());
        a.extend_from_slice(payload);
        a.resize(a.len().next_multiple_of(4), 0);
        a
    }

    fn nest(kind: u16, children: &[Vec<u8>]) -> Vec<u8> {
        nla(kind, &children.concat())
    }

    fn nlmsg(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = ((16 + payload.len()) as u32).to_ne_bytes().to_vec();
        m.extend(kind.to_ne_bytes());
        m.extend(flags.to_ne_bytes());
        m.extend(seq.to_ne_bytes());
        m.extend(4242u32.to_ne_bytes()); // our port id, as the kernel addresses it
        m.extend_from_slice(payload);
        m
    }

    fn dcbmsg(cmd: u8) -> Vec<u8> {
        vec![0, cmd, 0, 0]
    }

    fn app_attr(kind: u16, selector: u8, priority: u8, protocol: u16) -> Vec<u8> {
        let p = protocol.to_ne_bytes();
        nla(kind, &[selector, priority, p[0], p[1]])
    }

    fn app(selector: u8, priority: u8, protocol: u16) -> Vec<u8> {
        app_attr(DCB_ATTR_IEEE_APP, selector, priority, protocol)
    }

    /// `struct ieee_ets` as mlx5 fills it (prio 0 -> TC 1, prio 1 -> TC 0), with
    /// recommendation fields set to values that must not leak into the parsed ones.
    fn ets_bytes() -> Vec<u8> {
        let mut e = vec![0u8; 59];
        e[0] = 1; // willing
        e[1] = 8; // ets_cap
        e[2] = 0; // cbs
        e[3..11].copy_from_slice(&[10, 10, 10, 50, 10, 10, 0, 0]); // tc_tx_bw
        e[11..19].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]); // tc_rx_bw
        e[19..27].copy_from_slice(&[2, 2, 2, 2, 2, 2, 0, 0]); // tc_tsa
        e[27..35].copy_from_slice(&[1, 0, 2, 3, 4, 5, 6, 7]); // prio_tc
        e[35..59].fill(0xEE); // tc_reco_bw, tc_reco_tsa, reco_prio_tc
        e
    }

    /// `struct ieee_pfc` laid out by hand: 3 u8, a pad byte, u16 delay, 2 pad bytes,
    /// then requests[8] and indications[8] as u64.
    fn pfc_bytes(cap: u8, en: u8, mbc: u8, delay: u16, req: [u64; 8], ind: [u64; 8]) -> Vec<u8> {
        let mut b = vec![cap, en, mbc, 0];
        b.extend(delay.to_ne_bytes());
        b.extend([0, 0]);
        for r in req {
            b.extend(r.to_ne_bytes());
        }
        for i in ind {
            b.extend(i.to_ne_bytes());
        }
        assert_eq!(b.len(), 136);
        b
    }

    const REQUESTS: [u64; 8] = [0, 0, 0, 1_000_001, 0, 0, 0, 0];
    const INDICATIONS: [u64; 8] = [0, 0, 0, 0x1_0000_0002, 0, 0, 7, 0];

    /// An IEEE_GET reply as dcbnl_ieee_fill() builds it for a driver with ETS,
    /// maxrate, PFC, buffers, app trust and peer PFC: DCB_ATTR_IFNAME, the IEEE nest
    /// (ETS, MAXRATE, PFC, DCB_BUFFER, APP_TABLE, REWR_TABLE, APP_TRUST_TABLE,
    /// PEER_PFC; the kernel opens IEEE and APP_TABLE without NLA_F_NESTED, REWR and
    /// APP_TRUST with it), then DCB_ATTR_DCBX. `nested` adds NLA_F_NESTED to all.
    fn kernel_reply(seq: u32, apps: &[Vec<u8>], nested: bool) -> Vec<u8> {
        let flag = if nested { NLA_F_NESTED } else { 0 };
        let peer_pfc = pfc_bytes(8, 0xFF, 1, 9, [9; 8], [9; 8]);
        let ieee = nest(
            DCB_ATTR_IEEE | flag,
            &[
                nla(DCB_ATTR_IEEE_ETS, &ets_bytes()),
                nla(DCB_ATTR_IEEE_MAXRATE, &[0u8; 64]),
                nla(
                    DCB_ATTR_IEEE_PFC,
                    &pfc_bytes(8, 1 << 3, 0, 0x1234, REQUESTS, INDICATIONS),
                ),
                nla(DCB_ATTR_DCB_BUFFER, &[0u8; 44]),
                nest(DCB_ATTR_IEEE_APP_TABLE | flag, apps),
                nest(
                    DCB_ATTR_DCB_REWR_TABLE | NLA_F_NESTED,
                    &[app_attr(DCB_ATTR_DCB_APP, APP_SEL_PCP, 3, 3)],
                ),
                // Trust order: DSCP, then PCP (u8 selectors, typed like app entries).
                nest(
                    DCB_ATTR_DCB_APP_TRUST_TABLE | NLA_F_NESTED,
                    &[
                        nla(DCB_ATTR_IEEE_APP, &[APP_SEL_DSCP]),
                        nla(DCB_ATTR_DCB_APP, &[APP_SEL_PCP]),
                    ],
                ),
                nla(DCB_ATTR_IEEE_PEER_PFC, &peer_pfc),
            ],
        );
        let mut payload = dcbmsg(DCB_CMD_IEEE_GET);
        payload.extend(nla(DCB_ATTR_IFNAME, b"eth1\0"));
        payload.extend(ieee);
        payload.extend(nla(DCB_ATTR_DCBX, &[0x09])); // host | IEEE
        nlmsg(RTM_GETDCB, NLM_F_REQUEST, seq, &payload)
    }

    fn roce_apps() -> Vec<Vec<u8>> {
        vec![
            app(APP_SEL_DSCP, 3, 26),
            app(APP_SEL_DSCP, 6, 48),
            app(APP_SEL_ETHERTYPE, 5, 0x8915),
        ]
    }

    fn error_reply(seq: u32, errno: i32) -> Vec<u8> {
        // struct nlmsgerr: the error, then the request's header.
        let mut payload = errno.to_ne_bytes().to_vec();
        payload.extend(nlmsg(RTM_GETDCB, NLM_F_REQUEST, seq, &[])[..16].iter());
        nlmsg(NLMSG_ERROR, 0, seq, &payload)
    }

    fn truncated(r: Result<DcbState, DcbError>) -> (&'static str, usize, usize) {
        match r {
            Err(DcbError::Truncated { what, needed, got }) => (what, needed, got),
            other => panic!("expected Truncated, got {other:?}"),
        }
    }

    // ----- replies

    #[test]
    fn a_kernel_reply_decodes_field_by_field() {
        let state = decode_ieee_reply(&kernel_reply(7, &roce_apps(), false)).unwrap();
        assert_eq!(
            state.apps,
            vec![
                DcbApp {
                    selector: 5,
                    priority: 3,
                    protocol: 26
                },
                DcbApp {
                    selector: 5,
                    priority: 6,
                    protocol: 48
                },
                DcbApp {
                    selector: 1,
                    priority: 5,
                    protocol: 0x8915
                },
            ]
        );
        let pfc = state.pfc.unwrap();
        assert_eq!(pfc.cap, 8);
        assert_eq!(pfc.enabled, 0b0000_1000);
        assert_eq!(pfc.enabled_priorities(), vec![3]);
        assert_eq!(pfc.mbc, 0);
        assert_eq!(pfc.delay, 0x1234);
        assert_eq!(pfc.requests, REQUESTS);
        assert_eq!(pfc.indications, INDICATIONS);
        assert_eq!(
            state.ets,
            Some(IeeeEts {
                willing: 1,
                ets_cap: 8,
                cbs: 0,
                tc_tx_bw: [10, 10, 10, 50, 10, 10, 0, 0],
                tc_rx_bw: [1, 2, 3, 4, 5, 6, 7, 8],
                tc_tsa: [2, 2, 2, 2, 2, 2, 0, 0],
                prio_tc: [1, 0, 2, 3, 4, 5, 6, 7],
            })
        );
        assert_eq!(state.dcbx, Some(0x09));
        assert_eq!(state.dscp_priorities(26), vec![3]);
        assert_eq!(state.dscp_priorities(48), vec![6]);
        assert_eq!(state.dscp_priorities(0), Vec::<u8>::new());
    }

    #[test]
    fn the_nested_flag_is_masked_off() {
        assert_eq!(
            decode_ieee_reply(&kernel_reply(7, &roce_apps(), true)).unwrap(),
            decode_ieee_reply(&kernel_reply(7, &roce_apps(), false)).unwrap()
        );
    }

    #[test]
    fn a_device_without_pfc_ets_or_apps_decodes_to_an_empty_state() {
        // dcbnl_ieee_fill always opens the app table, even when it stays empty.
        let mut payload = dcbmsg(DCB_CMD_IEEE_GET);
        payload.extend(nla(DCB_ATTR_IFNAME, b"eth1\0"));
        payload.extend(nest(DCB_ATTR_IEEE, &[nest(DCB_ATTR_IEEE_APP_TABLE, &[])]));
        let state = decode_ieee_reply(&nlmsg(RTM_GETDCB, 1, 1, &payload)).unwrap();
        assert_eq!(state, DcbState::default());
    }

    #[test]
    fn error_replies_become_the_errors_they_name() {
        let e = |errno: i32| decode_ieee_reply(&error_reply(1, -errno));
        assert!(matches!(e(libc::EOPNOTSUPP), Err(DcbError::Unsupported)));
        assert!(matches!(e(libc::ENODEV), Err(DcbError::NoDevice)));
        assert!(matches!(e(libc::EPERM), Err(DcbError::Permission)));
        assert!(matches!(e(libc::EACCES), Err(DcbError::Permission)));
        assert!(matches!(e(libc::EINVAL), Err(DcbError::Kernel(22))));
        assert!(matches!(e(0), Err(DcbError::Malformed(_))));
        assert_eq!(
            DcbError::Kernel(libc::EINVAL).to_string(),
            "dcbnl answered errno 22 (Invalid argument)"
        );
    }

    #[test]
    fn other_messages_are_malformed_not_misread() {
        let mut set = kernel_reply(1, &roce_apps(), false);
        set[4..6].copy_from_slice(&RTM_SETDCB.to_ne_bytes());
        assert!(matches!(
            decode_ieee_reply(&set),
            Err(DcbError::Malformed(_))
        ));
        let mut cee = kernel_reply(1, &roce_apps(), false);
        cee[17] = 26; // DCB_CMD_CEE_GET
        assert!(matches!(
            decode_ieee_reply(&cee),
            Err(DcbError::Malformed(_))
        ));
    }

    #[test]
    fn a_reply_cut_short_is_truncated_at_every_level() {
        let full = kernel_reply(1, &roce_apps(), false);
        let n = full.len();
        assert_eq!(truncated(decode_ieee_reply(&[])), ("netlink header", 16, 0));
        assert_eq!(
            truncated(decode_ieee_reply(&full[..10])),
            ("netlink header", 16, 10)
        );
        for cut in [16, 18, 20, 24, 100, 200, n - 4, n - 1] {
            assert_eq!(
                truncated(decode_ieee_reply(&full[..cut])),
                ("netlink message", n, cut),
                "cut at {cut}"
            );
        }
        // A header that claims only what is left: the cut shows inside.
        let claim = |cut: usize| {
            let mut m = full[..cut].to_vec();
            m[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            decode_ieee_reply(&m)
        };
        assert_eq!(truncated(claim(18)), ("dcbmsg", 4, 2));
        assert_eq!(truncated(claim(22)), ("attribute header", 4, 2));
        // IFNAME is 12 bytes at 20; the IEEE nest starts at 32, ETS's value at 40.
        assert_eq!(truncated(claim(28)), ("attribute", 9, 8));
        // Cut inside IFNAME's padding: nothing is missing yet.
        assert_eq!(claim(30).unwrap(), DcbState::default());
        // The IEEE nest claims 4 + ETS 64 + MAXRATE 68 + PFC 140 + BUFFER 48 +
        // APP_TABLE 28 + REWR 12 + TRUST 20 + PEER_PFC 140 bytes.
        assert_eq!(truncated(claim(50)), ("attribute", 524, 18));
        // Cut inside the app table: its nest claims 28 bytes.
        let table_at = 32 + 4 + 64 + 68 + 140 + 48;
        assert_eq!(
            truncated(claim(table_at + 10)),
            ("attribute", 524, 10 + 4 + 64 + 68 + 140 + 48)
        );
        // A PFC, an ETS or an app entry shorter than its struct.
        let short = |kind: u16, len: usize| {
            let mut payload = dcbmsg(DCB_CMD_IEEE_GET);
            let value = if kind == DCB_ATTR_IEEE_APP_TABLE {
                nest(kind, &[nla(DCB_ATTR_IEEE_APP, &vec![5; len])])
            } else {
                nla(kind, &vec![0; len])
            };
            payload.extend(nest(DCB_ATTR_IEEE, &[value]));
            decode_ieee_reply(&nlmsg(RTM_GETDCB, 0, 1, &payload))
        };
        assert_eq!(
            truncated(short(DCB_ATTR_IEEE_PFC, 100)),
            ("ieee_pfc", 136, 100)
        );
        assert_eq!(
            truncated(short(DCB_ATTR_IEEE_ETS, 58)),
            ("ieee_ets", 59, 58)
        );
        assert_eq!(
            truncated(short(DCB_ATTR_IEEE_APP_TABLE, 3)),
            ("dcb_app", 4, 3)
        );
        let mut err = error_reply(1, -libc::ENODEV);
        err.truncate(18);
        err[0..4].copy_from_slice(&18u32.to_ne_bytes());
        assert_eq!(truncated(decode_ieee_reply(&err)), ("nlmsgerr", 4, 2));
    }

    #[test]
    fn every_cut_of_a_valid_reply_is_an_error_never_a_panic() {
        for nested in [false, true] {
            let full = kernel_reply(1, &roce_apps(), nested);
            for cut in 0..full.len() {
                assert!(decode_ieee_reply(&full[..cut]).is_err(), "cut at {cut}");
                // Also with the header claiming only what is left, so the cut falls
                // inside the attributes: an error or a shorter state, never a panic.
                if cut >= 16 {
                    let mut m = full[..cut].to_vec();
                    m[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
                    let _ = decode_ieee_reply(&m);
                    let _ = set_reply_step(&m);
                }
            }
        }
    }

    #[test]
    fn corrupt_lengths_never_loop_or_panic() {
        let full = kernel_reply(1, &roce_apps(), false);
        // Every byte set to each of a few values that break lengths.
        for at in 0..full.len() {
            for v in [0u8, 1, 3, 4, 0x7F, 0xFF] {
                let mut m = full.clone();
                m[at] = v;
                let _ = decode_ieee_reply(&m);
                let _ = messages(&m);
            }
        }
        // A zero-length attribute would never advance: malformed.
        let mut payload = dcbmsg(DCB_CMD_IEEE_GET);
        payload.extend([0, 0, 1, 0]);
        assert!(matches!(
            decode_ieee_reply(&nlmsg(RTM_GETDCB, 0, 1, &payload)),
            Err(DcbError::Malformed(_))
        ));
    }

    #[test]
    fn one_datagram_can_hold_several_messages() {
        let mut d = nlmsg(
            RTM_SETDCB,
            5,
            3,
            &[dcbmsg(20), nla(DCB_ATTR_IEEE, &[0])].concat(),
        );
        let first = d.len();
        d.extend(error_reply(3, 0));
        let m = messages(&d).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].len(), first);
        assert_eq!(message(m[1]).unwrap().0.kind, NLMSG_ERROR);
        assert_eq!(message(m[1]).unwrap().0.seq, 3);
    }

    #[test]
    fn set_replies_carry_the_drivers_status_then_the_ack() {
        // dcbnl_ieee_set: nla_put_u8(skb, DCB_ATTR_IEEE, err), err a negative errno.
        let status = |s: u8| {
            let payload = [dcbmsg(DCB_CMD_IEEE_SET), nla(DCB_ATTR_IEEE, &[s])].concat();
            set_reply_step(&nlmsg(RTM_SETDCB, 5, 9, &payload))
        };
        assert!(matches!(status(0), Ok(None)));
        assert!(matches!(
            status(-libc::EEXIST as u8),
            Err(DcbError::Kernel(17))
        ));
        assert!(matches!(
            status(-libc::EOPNOTSUPP as u8),
            Err(DcbError::Unsupported)
        ));
        assert!(matches!(set_reply_step(&error_reply(9, 0)), Ok(Some(()))));
        assert!(matches!(
            set_reply_step(&error_reply(9, -libc::EPERM)),
            Err(DcbError::Permission)
        ));
        assert!(matches!(
            set_reply_step(&kernel_reply(9, &[], false)),
            Err(DcbError::Malformed(_))
        ));
    }

    // ----- requests

    /// Splits a request into its header fields and its attributes' bytes.
    fn header_of(r: &[u8]) -> (u32, u16, u16, u32, u32, [u8; 4]) {
        (
            u32::from_ne_bytes(r[0..4].try_into().unwrap()),
            u16::from_ne_bytes(r[4..6].try_into().unwrap()),
            u16::from_ne_bytes(r[6..8].try_into().unwrap()),
            u32::from_ne_bytes(r[8..12].try_into().unwrap()),
            u32::from_ne_bytes(r[12..16].try_into().unwrap()),
            r[16..20].try_into().unwrap(),
        )
    }

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes([b[at], b[at + 1]])
    }

    #[test]
    fn an_ieee_get_request_field_by_field() {
        let r = encode_ieee_get("eth1", 7);
        assert_eq!(r.len(), 32);
        // nlmsghdr: length, RTM_GETDCB, NLM_F_REQUEST only (no ack: the reply is the
        // answer), seq, pid 0; dcbmsg: AF_UNSPEC, IEEE_GET, pad.
        assert_eq!(header_of(&r), (32, 78, 0x01, 7, 0, [0, 21, 0, 0]));
        // DCB_ATTR_IFNAME: length 4 + "eth1\0", type 1, padded to 12.
        assert_eq!(u16_at(&r, 20), 9);
        assert_eq!(u16_at(&r, 22), 1);
        assert_eq!(&r[24..32], b"eth1\0\0\0\0");
    }

    #[test]
    fn app_set_and_delete_requests_field_by_field() {
        let apps = [DcbApp::dscp(26, 3), DcbApp::dscp(48, 6)];
        for (r, cmd) in [
            (encode_app_set("eth1", 8, &apps), 20),
            (encode_app_del("eth1", 8, &apps), 27),
        ] {
            assert_eq!(r.len(), 56);
            // RTM_SETDCB with NLM_F_REQUEST | NLM_F_ACK.
            assert_eq!(header_of(&r), (56, 79, 0x05, 8, 0, [0, cmd, 0, 0]));
            assert_eq!(&r[20..32], &nla(1, b"eth1\0")[..]);
            // DCB_ATTR_IEEE nest (13 | NLA_F_NESTED) of 24 bytes holding the app
            // table nest (3 | NLA_F_NESTED, 20 bytes) holding two 8-byte entries.
            assert_eq!((u16_at(&r, 32), u16_at(&r, 34)), (24, 13 | 0x8000));
            assert_eq!((u16_at(&r, 36), u16_at(&r, 38)), (20, 3 | 0x8000));
            assert_eq!((u16_at(&r, 40), u16_at(&r, 42)), (8, 1));
            assert_eq!((r[44], r[45], u16_at(&r, 46)), (5, 3, 26));
            assert_eq!((u16_at(&r, 48), u16_at(&r, 50)), (8, 1));
            assert_eq!((r[52], r[53], u16_at(&r, 54)), (5, 6, 48));
        }
    }

    #[test]
    fn a_pfc_set_request_field_by_field() {
        let pfc = IeeePfc {
            cap: 8,
            enabled: 1 << 3,
            mbc: 1,
            delay: 0x1234,
            requests: REQUESTS,
            indications: INDICATIONS,
        };
        let r = encode_pfc_set("eth1", 9, &pfc);
        assert_eq!(r.len(), 32 + 4 + 4 + 136);
        assert_eq!(header_of(&r), (176, 79, 0x05, 9, 0, [0, 20, 0, 0]));
        assert_eq!((u16_at(&r, 32), u16_at(&r, 34)), (144, 13 | 0x8000));
        assert_eq!((u16_at(&r, 36), u16_at(&r, 38)), (140, 2));
        assert_eq!(
            &r[40..],
            &pfc_bytes(8, 1 << 3, 1, 0x1234, REQUESTS, INDICATIONS)[..]
        );
        assert_eq!(IeeePfc::from_bytes(&r[40..]).unwrap(), pfc);
    }

    #[test]
    fn impossible_names_are_no_device_without_asking() {
        for name in ["", "sixteen-chars-xx", "a/b", "nul\0"] {
            assert!(matches!(query(name), Err(DcbError::NoDevice)), "{name:?}");
            assert!(matches!(
                set_pfc(name, &IeeePfc::default()),
                Err(DcbError::NoDevice)
            ));
        }
        // Nothing to send: no request at all.
        assert!(set_apps("", &[]).is_ok());
        assert!(delete_apps("", &[]).is_ok());
    }

    // ----- checks

    fn state(apps: &[(u8, u8)], pfc_mask: Option<u8>) -> DcbState {
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

    fn right() -> DcbState {
        state(&[(26, 3), (48, 6)], Some(1 << 3))
    }

    fn one(state: DcbState) -> Finding {
        let f = audit(IF, &Ok(state), &Policy::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        f.into_iter().next().unwrap()
    }

    fn check(f: &Finding, check: &str, severity: Severity, found: &str, expected: &str, fix: &str) {
        assert_eq!(f.check, check);
        assert_eq!(f.interface.as_deref(), Some(IF));
        assert_eq!(f.severity, severity);
        assert_eq!(f.found, found);
        assert_eq!(f.expected, expected);
        assert_eq!(f.fix, fix);
        assert_eq!(f.flows, None);
    }

    const PFC_ON_3: &str =
        "dcb pfc set dev eth1 prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off";

    #[test]
    fn the_right_state_has_no_findings() {
        assert_eq!(audit(IF, &Ok(right()), &Policy::default()), vec![]);
        // As mlx5 shows a port that trusts DSCP: all 64 entries, DSCP >> 3 (the
        // firmware default, which is also the default policy's table).
        let mlx5: Vec<(u8, u8)> = (0..64).map(|d| (d, d >> 3)).collect();
        assert_eq!(
            audit(IF, &Ok(state(&mlx5, Some(1 << 3))), &Policy::default()),
            vec![]
        );
        // The decoded kernel reply: 26 -> 3, 48 -> 6, PFC on 3, an ethertype entry.
        let decoded = decode_ieee_reply(&kernel_reply(1, &roce_apps(), false));
        assert_eq!(audit(IF, &decoded, &Policy::default()), vec![]);
    }

    #[test]
    fn a_wrong_priority_is_an_error_with_the_exact_mapping() {
        let f = one(state(&[(26, 0), (48, 6)], Some(1 << 3)));
        check(
            &f,
            "dcb_app",
            Severity::Error,
            "DSCP 26 -> priority 0",
            "DSCP 26 -> priority 3",
            "dcb app replace dev eth1 dscp-prio 26:3",
        );
    }

    #[test]
    fn a_missing_entry_is_an_error() {
        let f = one(state(&[(26, 3)], Some(1 << 3)));
        check(
            &f,
            "dcb_app",
            Severity::Error,
            "DSCP 48 -> no app entry",
            "DSCP 48 -> priority 6",
            "dcb app replace dev eth1 dscp-prio 48:6",
        );
    }

    #[test]
    fn two_priorities_for_one_dscp_is_an_error() {
        let f = one(state(&[(26, 0), (26, 3), (48, 6)], Some(1 << 3)));
        check(
            &f,
            "dcb_app",
            Severity::Error,
            "DSCP 26 -> priorities 0, 3",
            "DSCP 26 -> priority 3",
            "dcb app replace dev eth1 dscp-prio 26:3",
        );
    }

    #[test]
    fn no_dscp_entries_means_the_port_trusts_pcp() {
        let mut s = state(&[], Some(1 << 3));
        s.apps.push(DcbApp {
            selector: APP_SEL_ETHERTYPE,
            priority: 5,
            protocol: 0x8915,
        });
        let f = one(s);
        check(
            &f,
            "dcb_app",
            Severity::Error,
            "no DSCP app entries: eth1 trusts PCP (the VLAN tag's priority), not DSCP",
            "DSCP 26 -> priority 3, DSCP 48 -> priority 6",
            "dcb app replace dev eth1 dscp-prio 26:3 48:6",
        );
    }

    #[test]
    fn other_dscps_that_differ_are_one_warning() {
        let f = one(state(
            &[(26, 3), (48, 6), (10, 0), (46, 7), (47, 5)],
            Some(1 << 3),
        ));
        check(
            &f,
            "dcb_app",
            Severity::Warning,
            "DSCP 10 -> priority 0; DSCP 46 -> priority 7",
            "DSCP 10 -> priority 1; DSCP 46 -> priority 5",
            "dcb app replace dev eth1 dscp-prio 10:1 46:5",
        );
    }

    #[test]
    fn pfc_on_the_wrong_priority_is_an_error() {
        let f = one(state(&[(26, 3), (48, 6)], Some(1 << 4)));
        check(
            &f,
            "pfc",
            Severity::Error,
            "PFC on priorities 4",
            "PFC on priorities 3",
            PFC_ON_3,
        );
    }

    #[test]
    fn pfc_off_is_an_error() {
        let f = one(state(&[(26, 3), (48, 6)], Some(0)));
        check(
            &f,
            "pfc",
            Severity::Error,
            "PFC on no priority",
            "PFC on priorities 3",
            PFC_ON_3,
        );
        let mut s = state(&[(26, 3), (48, 6)], Some(0));
        s.pfc = s.pfc.map(|p| IeeePfc { cap: 0, ..p });
        assert_eq!(
            one(s).found,
            "PFC on no priority (pfc_cap 0: the NIC reports no traffic class that can have PFC)"
        );
        // PFC on 3 and more is not exactly the lossless set either.
        assert_eq!(
            one(state(&[(26, 3), (48, 6)], Some(0b0100_1000))).found,
            "PFC on priorities 3, 6"
        );
    }

    #[test]
    fn no_pfc_state_from_the_driver_is_an_error() {
        let f = one(state(&[(26, 3), (48, 6)], None));
        check(
            &f,
            "pfc",
            Severity::Error,
            "eth1 reports no PFC state over dcbnl (its driver has no IEEE PFC)",
            "PFC on priorities 3",
            "configure PFC with the NIC vendor's tool",
        );
    }

    #[test]
    fn the_policy_decides_what_matters() {
        // Lossless {24, 26}, 24 on priority 2: PFC on 2 and 3, both need entries.
        let mut p = Policy::default();
        p.set_lossless(&[24, 26]);
        p.table[24].priority = 2;
        let s = state(&[(26, 3), (48, 6)], Some(1 << 3));
        let f = audit(IF, &Ok(s), &p);
        assert_eq!(f.len(), 2, "{f:#?}");
        assert_eq!(f[0].found, "DSCP 24 -> no app entry");
        assert_eq!(f[0].expected, "DSCP 24 -> priority 2");
        assert_eq!(f[1].expected, "PFC on priorities 2, 3");
        assert_eq!(
            f[1].fix,
            "dcb pfc set dev eth1 prio-pfc 0:off 1:off 2:on 3:on 4:off 5:off 6:off 7:off"
        );
        // A policy priority above 7 cannot be compared: no finding for it.
        let mut p = Policy::default();
        p.table[26].priority = 9;
        let f = audit(IF, &Ok(state(&[(26, 0), (48, 6)], Some(0))), &p);
        assert_eq!(f, vec![], "{f:#?}");
        assert_eq!(p.table[26].flags & ENTRY_LOSSLESS, ENTRY_LOSSLESS);
    }

    #[test]
    fn errors_become_one_finding_each() {
        let p = Policy::default();
        let f = audit("veth0", &Err(DcbError::Unsupported), &p);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].check, "dcb_unsupported");
        assert_eq!(f[0].severity, Severity::Info);
        assert_eq!(f[0].interface.as_deref(), Some("veth0"));
        assert!(f[0].found.starts_with("veth0 has no DCB"), "{}", f[0].found);

        let f = audit(IF, &Err(DcbError::Permission), &p);
        assert_eq!((f.len(), f[0].severity), (1, Severity::Warning));
        assert!(f[0].found.contains("not checked"), "{}", f[0].found);
        assert!(f[0].fix.contains("CAP_NET_ADMIN"), "{}", f[0].fix);

        let f = audit(IF, &Err(DcbError::Kernel(libc::EINVAL)), &p);
        assert_eq!((f.len(), f[0].severity), (1, Severity::Error));
        assert_eq!(
            f[0].found,
            "dcb_app and pfc not checked: dcbnl on eth1: dcbnl answered errno 22 (Invalid argument)"
        );

        let f = audit("eth9", &Err(DcbError::NoDevice), &p);
        assert_eq!((f.len(), f[0].severity), (1, Severity::Error));
        assert!(
            f[0].found.contains("dcbnl on eth9: no such device"),
            "{}",
            f[0].found
        );
    }

    // ----- fix

    #[test]
    fn the_fix_adds_first_then_replaces_and_sets_the_pfc_mask() {
        let (repairs, pfc) = plan(&state(&[(26, 0)], Some(1 << 4)), &Policy::default());
        assert_eq!(
            repairs,
            vec![
                AppRepair {
                    dscp: 48,
                    remove: vec![],
                    add: Some(DcbApp::dscp(48, 6)),
                    before: vec![],
                    after: 6,
                },
                AppRepair {
                    dscp: 26,
                    remove: vec![DcbApp::dscp(26, 0)],
                    add: Some(DcbApp::dscp(26, 3)),
                    before: vec![0],
                    after: 3,
                },
            ]
        );
        // Only the mask changes: cap, delay (mlx5's cable length) stay.
        assert_eq!(
            pfc,
            Some(IeeePfc {
                cap: 8,
                enabled: 1 << 3,
                delay: 77,
                ..IeeePfc::default()
            })
        );
        // A right entry next to a wrong one: only the wrong one goes.
        let (repairs, _) = plan(
            &state(&[(26, 0), (26, 3), (48, 6)], None),
            &Policy::default(),
        );
        assert_eq!(repairs.len(), 1);
        assert_eq!(
            (repairs[0].remove.clone(), repairs[0].add),
            (vec![DcbApp::dscp(26, 0)], None)
        );
        assert_eq!(priorities_text(&repairs[0].before), "priorities 0, 3");
        // Nothing to do on a right state.
        assert_eq!(plan(&right(), &Policy::default()), (vec![], None));
        let (changes, result) = fix("eth1", &right(), &Policy::default());
        assert!(changes.is_empty() && result.is_ok());
    }
}
