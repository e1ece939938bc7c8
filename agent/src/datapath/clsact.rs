//! The agent's filters on clsact qdiscs: how tc programs are attached on kernels
//! without TCX (before 6.6). A filter belongs to no process (kill -9 leaves it, and
//! its program, running), so the agent knows its own by what the kernel reports: a
//! `bpf` filter whose program name is one of [`AGENT_PROGRAMS`]. It makes them at one
//! place, priority [`PRIORITY`] and handle [`HANDLE`], where `tc filter show dev IF
//! egress` prints `pref 4791 bpf chain 0 handle 0x1 tc_egress direct-action ... name
//! tc_egress`.
//!
//! - [`filters`]: the filters on one hook of an interface (an RTM_GETTFILTER dump);
//! - [`delete_filter`]: one filter away (RTM_DELTFILTER);
//! - [`remove_qdisc_if_empty`]: the clsact qdisc away when neither hook holds a
//!   filter (never a qdisc with another tool's filter on it);
//! - [`remove_agent_filters`]: the agent's filters of one interface, then the qdisc
//!   if that left it empty; [`sweep`]: that on every interface (`detach`).
//!
//! Taking a filter over is `qos::TcInterface::attach`'s business (aya replaces a
//! filter in place). The messages are laid out and read here, on bytes.

use std::io;
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use roce_common::names::program::{TC_EGRESS, TC_INGRESS};

use crate::sys::netif;

/// The priority of the agent's filters: RoCEv2's UDP port, to be told apart at a
/// glance, and ahead of the priorities tc gives itself (49152 downwards).
pub const PRIORITY: u16 = 4791;
/// The handle of the agent's filter at [`PRIORITY`].
pub const HANDLE: u32 = 1;
/// The programs the agent attaches as tc filters: a `bpf` filter running one of them
/// is the agent's.
pub const AGENT_PROGRAMS: [&str; 2] = [TC_EGRESS, TC_INGRESS];

/// How long one request waits for the kernel's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

const RTM_DELQDISC: u16 = 37;
const RTM_NEWTFILTER: u16 = 44;
const RTM_DELTFILTER: u16 = 45;
const RTM_GETTFILTER: u16 = 46;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_HDRLEN: usize = 16;
const TCMSG_LEN: usize = 20;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_ID: u16 = 11;
/// NLA_F_NESTED and NLA_F_NET_BYTEORDER off: the attribute's type.
const NLA_TYPE_MASK: u16 = 0x3fff;
/// The clsact qdisc: parent ffff:fff1, handle ffff:0.
const TC_H_CLSACT: u32 = 0xffff_fff1;
const CLSACT_HANDLE: u32 = 0xffff_0000;

#[derive(Debug, thiserror::Error)]
pub enum ClsactError {
    #[error("opening a NETLINK_ROUTE socket: {0}")]
    Socket(io::Error),
    #[error("rtnetlink {what} on ifindex {ifindex}: {source}")]
    Netlink {
        what: &'static str,
        ifindex: u32,
        source: io::Error,
    },
    #[error("rtnetlink {what} on ifindex {ifindex}: undecodable answer ({detail})")]
    Decode {
        what: &'static str,
        ifindex: u32,
        detail: &'static str,
    },
    #[error("listing the interfaces: {0}")]
    Interfaces(io::Error),
}

/// The two hooks of a clsact qdisc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    pub const BOTH: [Hook; 2] = [Hook::Ingress, Hook::Egress];

    /// The filters' parent: ffff:fff2 (ingress) or ffff:fff3 (egress).
    fn parent(self) -> u32 {
        match self {
            Hook::Ingress => 0xffff_fff2,
            Hook::Egress => 0xffff_fff3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        }
    }
}

/// One filter on a clsact hook, as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub ifindex: u32,
    pub hook: Hook,
    pub priority: u16,
    /// The EtherType it matches (host order; ETH_P_ALL for the agent's).
    pub protocol: u16,
    pub handle: u32,
    /// The classifier: `bpf`, `u32`, `matchall`...
    pub kind: String,
    /// A `bpf` filter's program name (TCA_BPF_NAME).
    pub program: Option<String>,
    /// A `bpf` filter's program id.
    pub program_id: Option<u32>,
}

impl Filter {
    /// Whether this is a filter of the agent's (made by this or an earlier agent).
    pub fn is_agents(&self) -> bool {
        self.kind == "bpf"
            && self
                .program
                .as_deref()
                .is_some_and(|p| AGENT_PROGRAMS.contains(&p))
    }

    /// Whether it sits where the agent makes its filters.
    pub fn at_agents_place(&self) -> bool {
        self.priority == PRIORITY && self.handle == HANDLE
    }

    /// `IFNAME egress pref 4791 handle 0x1 tc_egress`, for logs and `detach`.
    pub fn describe(&self) -> String {
        let ifname = netif::name_of(self.ifindex).unwrap_or_else(|| self.ifindex.to_string());
        format!(
            "{ifname} {} pref {} handle {:#x} {}",
            self.hook.name(),
            self.priority,
            self.handle,
            self.program.as_deref().unwrap_or(&self.kind)
        )
    }
}

/// The filters on hook `hook` of interface `ifindex`; none when it has no clsact
/// qdisc.
pub fn filters(ifindex: u32, hook: Hook) -> Result<Vec<Filter>, ClsactError> {
    let what = "filter dump";
    let request = TcRequest {
        kind: RTM_GETTFILTER,
        flags: NLM_F_DUMP,
        ifindex,
        handle: 0,
        parent: hook.parent(),
        info: 0,
        tca_kind: None,
    };
    let answers = Rtnl::open()?.request(what, &request)?;
    let mut out = Vec::new();
    for (kind, payload) in answers {
        if kind != RTM_NEWTFILTER {
            continue;
        }
        let filter = parse_filter(hook, &payload).ok_or(ClsactError::Decode {
            what,
            ifindex,
            detail: "a filter message shorter than its header or attributes",
        })?;
        // The kernel also reports each classifier instance (handle 0): not a filter.
        if filter.handle != 0 && filter.ifindex == ifindex {
            out.push(filter);
        }
    }
    Ok(out)
}

/// Deletes filter `f` (`tc filter del dev IF HOOK pref P handle H protocol X KIND`).
pub fn delete_filter(f: &Filter) -> Result<(), ClsactError> {
    let request = TcRequest {
        kind: RTM_DELTFILTER,
        flags: NLM_F_ACK,
        ifindex: f.ifindex,
        handle: f.handle,
        parent: f.hook.parent(),
        info: (u32::from(f.priority) << 16) | u32::from(f.protocol.to_be()),
        tca_kind: Some(&f.kind),
    };
    Rtnl::open()?.request("filter delete", &request).map(drop)
}

/// Deletes the clsact qdisc of `ifindex` when neither of its hooks holds a filter;
/// says whether it did. No clsact qdisc (or another kind there): false.
pub fn remove_qdisc_if_empty(ifindex: u32) -> Result<bool, ClsactError> {
    for hook in Hook::BOTH {
        if !filters(ifindex, hook)?.is_empty() {
            return Ok(false);
        }
    }
    let request = TcRequest {
        kind: RTM_DELQDISC,
        flags: NLM_F_ACK,
        ifindex,
        handle: CLSACT_HANDLE,
        parent: TC_H_CLSACT,
        info: 0,
        // The kernel refuses to delete a qdisc of another kind (`ingress`): EINVAL.
        tca_kind: Some("clsact"),
    };
    match Rtnl::open()?.request("clsact qdisc delete", &request) {
        Ok(_) => Ok(true),
        Err(ClsactError::Netlink { source, .. })
            if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// What was taken away from one interface.
#[derive(Debug, Default)]
pub struct Removed {
    pub filters: Vec<Filter>,
    /// Whether the clsact qdisc went too (the agent's filters were all it held).
    pub qdisc: bool,
}

/// Deletes the agent's filters on `hooks` of `ifindex`, then the clsact qdisc if that
/// left it empty.
pub fn remove_agent_filters(ifindex: u32, hooks: &[Hook]) -> Result<Removed, ClsactError> {
    let mut removed = Removed::default();
    for &hook in hooks {
        for f in filters(ifindex, hook)?
            .into_iter()
            .filter(Filter::is_agents)
        {
            delete_filter(&f)?;
            removed.filters.push(f);
        }
    }
    if !removed.filters.is_empty() {
        removed.qdisc = remove_qdisc_if_empty(ifindex)?;
    }
    Ok(removed)
}

/// [`remove_agent_filters`] on both hooks of every interface of this network
/// namespace: the interfaces where it removed something, with their names.
pub fn sweep() -> Result<Vec<(String, Removed)>, ClsactError> {
    let mut out = Vec::new();
    for (ifindex, ifname) in netif::all().map_err(ClsactError::Interfaces)? {
        let removed = match remove_agent_filters(ifindex, &Hook::BOTH) {
            Ok(r) => r,
            // Gone while we looked.
            Err(ClsactError::Netlink { source, .. })
                if source.raw_os_error() == Some(libc::ENODEV) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        if !removed.filters.is_empty() {
            out.push((ifname, removed));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------
// The messages: struct nlmsghdr, struct tcmsg, then attributes.

/// One tc request: a `struct tcmsg` and, optionally, its TCA_KIND.
struct TcRequest<'a> {
    kind: u16,
    flags: u16,
    ifindex: u32,
    handle: u32,
    parent: u32,
    info: u32,
    tca_kind: Option<&'a str>,
}

impl TcRequest<'_> {
    fn encode(&self, seq: u32) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&0u32.to_ne_bytes()); // length, set below
        b.extend_from_slice(&self.kind.to_ne_bytes());
        b.extend_from_slice(&(NLM_F_REQUEST | self.flags).to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        b.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
        b.extend_from_slice(&self.ifindex.to_ne_bytes());
        b.extend_from_slice(&self.handle.to_ne_bytes());
        b.extend_from_slice(&self.parent.to_ne_bytes());
        b.extend_from_slice(&self.info.to_ne_bytes());
        if let Some(kind) = self.tca_kind {
            let len = 4 + kind.len() + 1;
            b.extend_from_slice(&(len as u16).to_ne_bytes());
            b.extend_from_slice(&TCA_KIND.to_ne_bytes());
            b.extend_from_slice(kind.as_bytes());
            b.push(0);
            b.resize(b.len().next_multiple_of(4), 0);
        }
        let len = b.len() as u32;
        b[..4].copy_from_slice(&len.to_ne_bytes());
        b
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The attributes in `b`: (type, value).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = Option<(u16, &[u8])>> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let parsed = (|| {
            let len = usize::from(u16_at(b, 0)?);
            let kind = u16_at(b, 2)? & NLA_TYPE_MASK;
            let value = b.get(4..len)?;
            Some((kind, value, len.next_multiple_of(4).min(b.len())))
        })();
        match parsed {
            Some((kind, value, next)) => {
                b = &b[next..];
                Some(Some((kind, value)))
            }
            None => {
                b = &[];
                Some(None)
            }
        }
    })
}

/// A NUL-terminated string attribute.
fn string(value: &[u8]) -> String {
    let end = value.iter().position(|&c| c == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// The filter of an RTM_NEWTFILTER payload (tcmsg + attributes).
fn parse_filter(hook: Hook, payload: &[u8]) -> Option<Filter> {
    let ifindex = u32_at(payload, 4)?;
    let handle = u32_at(payload, 8)?;
    let info = u32_at(payload, 16)?;
    let mut f = Filter {
        ifindex,
        hook,
        priority: (info >> 16) as u16,
        protocol: u16::from_be(info as u16),
        handle,
        kind: String::new(),
        program: None,
        program_id: None,
    };
    for attr in attributes(payload.get(TCMSG_LEN..)?) {
        match attr? {
            (TCA_KIND, v) => f.kind = string(v),
            (TCA_OPTIONS, v) => {
                for option in attributes(v) {
                    match option? {
                        (TCA_BPF_NAME, v) => f.program = Some(string(v)),
                        (TCA_BPF_ID, v) => f.program_id = u32_at(v, 0),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(f)
}

/// A NETLINK_ROUTE socket for one request.
struct Rtnl {
    socket: Socket,
}

impl Rtnl {
    fn open() -> Result<Rtnl, ClsactError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(ClsactError::Socket)?;
        socket.bind_auto().map_err(ClsactError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(ClsactError::Socket)?;
        crate::sys::set_receive_timeout(&socket, ANSWER_TIMEOUT).map_err(ClsactError::Socket)?;
        Ok(Rtnl { socket })
    }

    /// Sends `request` and collects its answers (type, payload) up to the end of a
    /// dump or the ack.
    fn request(
        &mut self,
        what: &'static str,
        request: &TcRequest<'_>,
    ) -> Result<Vec<(u16, Vec<u8>)>, ClsactError> {
        let ifindex = request.ifindex;
        let netlink = |source| ClsactError::Netlink {
            what,
            ifindex,
            source,
        };
        let decode = |detail| ClsactError::Decode {
            what,
            ifindex,
            detail,
        };
        const SEQ: u32 = 1;
        self.socket.send(&request.encode(SEQ), 0).map_err(netlink)?;
        let mut answers = Vec::new();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        loop {
            buf.clear();
            let n = match self.socket.recv(&mut buf, 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(netlink(e)),
            };
            let mut at = 0;
            while at + NLMSG_HDRLEN <= n {
                let len = u32_at(&buf, at).ok_or_else(|| decode("a cut header"))? as usize;
                let kind = u16_at(&buf, at + 4).ok_or_else(|| decode("a cut header"))?;
                let seq = u32_at(&buf, at + 8).ok_or_else(|| decode("a cut header"))?;
                if len < NLMSG_HDRLEN {
                    return Err(decode("a message shorter than its header"));
                }
                let payload = buf
                    .get(at + NLMSG_HDRLEN..at + len)
                    .ok_or_else(|| decode("a message longer than the datagram"))?;
                at += len.next_multiple_of(4);
                if seq != SEQ {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(answers),
                    NLMSG_ERROR => {
                        let code = u32_at(payload, 0).ok_or_else(|| decode("a cut error"))? as i32;
                        return if code == 0 {
                            Ok(answers)
                        } else {
                            Err(netlink(io::Error::from_raw_os_error(-code)))
                        };
                    }
                    _ => answers.push((kind, payload.to_vec())),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(value);
        b.resize(b.len().next_multiple_of(4), 0);
        b
    }

    /// An RTM_NEWTFILTER payload as cls_bpf dumps one: tcmsg, TCA_KIND "bpf",
    /// TCA_CHAIN, TCA_OPTIONS (nested) with the program's id, tag and name.
    fn bpf_filter_payload(ifindex: u32, prio: u16, handle: u32, name: &str, id: u32) -> Vec<u8> {
        let mut b = vec![0u8, 0, 0, 0];
        b.extend_from_slice(&ifindex.to_ne_bytes());
        b.extend_from_slice(&handle.to_ne_bytes());
        b.extend_from_slice(&0xffff_fff3u32.to_ne_bytes());
        b.extend_from_slice(&((u32::from(prio) << 16) | u32::from(3u16.to_be())).to_ne_bytes());
        b.extend(attr(TCA_KIND, b"bpf\0"));
        b.extend(attr(11, &0u32.to_ne_bytes())); // TCA_CHAIN
        let mut options = attr(TCA_BPF_ID, &id.to_ne_bytes());
        options.extend(attr(10, &[0xab; 8])); // TCA_BPF_TAG
        options.extend(attr(TCA_BPF_NAME, format!("{name}\0").as_bytes()));
        options.extend(attr(8, &1u32.to_ne_bytes())); // TCA_BPF_FLAGS: direct action
        b.extend(attr(TCA_OPTIONS | 0x8000, &options)); // NLA_F_NESTED
        b
    }

    #[test]
    fn a_dumped_tc_egress_filter_reads_as_the_agents_at_its_place() {
        let f = parse_filter(
            Hook::Egress,
            &bpf_filter_payload(7, PRIORITY, HANDLE, "tc_egress", 91),
        );
        assert_eq!(
            f,
            Some(Filter {
                ifindex: 7,
                hook: Hook::Egress,
                priority: 4791,
                protocol: libc::ETH_P_ALL as u16,
                handle: 1,
                kind: "bpf".into(),
                program: Some("tc_egress".into()),
                program_id: Some(91),
            })
        );
        let f = f.expect("parsed");
        assert!(f.is_agents() && f.at_agents_place());
    }

    #[test]
    fn another_programs_filter_or_another_classifier_is_not_the_agents() {
        let theirs = parse_filter(
            Hook::Egress,
            &bpf_filter_payload(7, PRIORITY, HANDLE, "cil_to_netdev", 5),
        );
        assert!(theirs.is_some_and(|f| !f.is_agents() && f.at_agents_place()));
        let mut u32_filter = bpf_filter_payload(7, 7, 0x800, "tc_egress", 5);
        // The same bytes with TCA_KIND "u32": a u32 filter is never the agent's.
        let at = u32_filter
            .windows(4)
            .position(|w| w == b"bpf\0")
            .expect("TCA_KIND");
        u32_filter[at..at + 4].copy_from_slice(b"u32\0");
        assert!(parse_filter(Hook::Egress, &u32_filter).is_some_and(|f| !f.is_agents()));
    }

    #[test]
    fn a_cut_filter_message_is_refused() {
        let full = bpf_filter_payload(7, PRIORITY, HANDLE, "tc_egress", 91);
        assert!(parse_filter(Hook::Egress, &full[..12]).is_none());
        // An attribute that claims more bytes than there are.
        let mut bad = full[..TCMSG_LEN].to_vec();
        bad.extend_from_slice(&200u16.to_ne_bytes());
        bad.extend_from_slice(&TCA_KIND.to_ne_bytes());
        bad.extend_from_slice(b"bpf\0");
        assert!(parse_filter(Hook::Egress, &bad).is_none());
    }

    #[test]
    fn a_filter_delete_names_priority_protocol_handle_and_kind() {
        let request = TcRequest {
            kind: RTM_DELTFILTER,
            flags: NLM_F_ACK,
            ifindex: 7,
            handle: 1,
            parent: Hook::Egress.parent(),
            info: (u32::from(PRIORITY) << 16) | u32::from((libc::ETH_P_ALL as u16).to_be()),
            tca_kind: Some("bpf"),
        };
        let b = request.encode(9);
        let mut want = Vec::new();
        want.extend_from_slice(&44u32.to_ne_bytes()); // 16 + 20 + 8
        want.extend_from_slice(&RTM_DELTFILTER.to_ne_bytes());
        want.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        want.extend_from_slice(&9u32.to_ne_bytes());
        want.extend_from_slice(&0u32.to_ne_bytes());
        want.extend_from_slice(&[0, 0, 0, 0]);
        want.extend_from_slice(&7u32.to_ne_bytes());
        want.extend_from_slice(&1u32.to_ne_bytes());
        want.extend_from_slice(&0xffff_fff3u32.to_ne_bytes());
        // `tc` writes pref 4791 protocol all as 0x12b7_0300 on a little-endian host.
        want.extend_from_slice(&(0x12b7_0000u32 | u32::from(3u16.to_be())).to_ne_bytes());
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&TCA_KIND.to_ne_bytes());
        want.extend_from_slice(b"bpf\0");
        assert_eq!(b, want);
    }

    #[test]
    fn a_qdisc_delete_without_kind_has_no_attributes() {
        let request = TcRequest {
            kind: RTM_DELQDISC,
            flags: NLM_F_ACK,
            ifindex: 3,
            handle: CLSACT_HANDLE,
            parent: TC_H_CLSACT,
            info: 0,
            tca_kind: None,
        };
        let b = request.encode(1);
        assert_eq!(b.len(), NLMSG_HDRLEN + TCMSG_LEN);
        assert_eq!(u32_at(&b, 0), Some(36));
        assert_eq!(u32_at(&b, NLMSG_HDRLEN + 12), Some(0xffff_fff1));
    }
}
