//! The dcbnl wire format: RTM_GETDCB / RTM_SETDCB requests built and their replies
//! read byte by byte, as `include/uapi/linux/{netlink,rtnetlink,dcbnl}.h` lay them
//! out and `net/dcb/dcbnl.c` fills them. No I/O: `socket` sends and receives.

use super::{DcbApp, DcbError, DcbState, IeeeEts, IeeePfc};

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

// ---------------------------------------------------------------------------------
// The C structs: `struct dcb_app`, `struct ieee_pfc`, `struct ieee_ets`

impl DcbApp {
    fn to_bytes(self) -> [u8; DCB_APP_LEN] {
        let p = self.protocol.to_ne_bytes();
        [self.selector, self.priority, p[0], p[1]]
    }
}

impl IeeePfc {
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
pub(super) struct Header {
    len: usize,
    kind: u16,
    pub(super) seq: u32,
}

/// The first message of `buf`: its header and its payload (after the header).
pub(super) fn message(buf: &[u8]) -> Result<(Header, &[u8]), DcbError> {
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
pub(super) fn messages(mut buf: &[u8]) -> Result<Vec<&[u8]>, DcbError> {
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
pub(super) fn set_reply_step(buf: &[u8]) -> Result<Option<()>, DcbError> {
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

#[cfg(test)]
mod tests {
    //! Replies built byte by byte as net/dcb/dcbnl.c builds them (dcbnl_ieee_fill,
    //! dcbnl_ieee_set, netlink_ack), and requests checked field by field.
    use super::super::APP_SEL_DSCP;
    use super::*;
    use roce_common::policy::Policy;

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
    fn a_decoded_kernel_reply_passes_the_checks() {
        // 26 -> 3, 48 -> 6, PFC on 3, an ethertype entry.
        let decoded = decode_ieee_reply(&kernel_reply(1, &roce_apps(), false));
        assert_eq!(
            super::super::audit("eth1", &decoded, &Policy::default()),
            vec![]
        );
    }
}
