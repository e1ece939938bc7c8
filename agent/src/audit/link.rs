//! Interfaces, their MTUs and VXLAN devices, read (and MTUs set) over rtnetlink: a
//! synchronous NETLINK_ROUTE socket carrying netlink-packet-route messages. No `ip`
//! subprocess: the answer is typed, and a dump needs no privilege.

use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// How long one request waits for the kernel's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a netlink request failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("opening a NETLINK_ROUTE socket: {0}")]
    Socket(std::io::Error),
    #[error("rtnetlink {what}: {error}")]
    Io {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("rtnetlink {what}: the kernel answered {error}")]
    Kernel {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("rtnetlink {what}: undecodable answer: {detail}")]
    Decode { what: &'static str, detail: String },
    #[error("rtnetlink {what}: no answer within {timeout:?}")]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
}

impl LinkError {
    /// The errno of a refusal by the kernel (EPERM for an unprivileged MTU change).
    pub fn errno(&self) -> Option<i32> {
        match self {
            LinkError::Kernel { error, .. } | LinkError::Io { error, .. } => error.raw_os_error(),
            _ => None,
        }
    }
}

/// One network interface as rtnetlink describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// Administratively up (IFF_UP).
    pub up: bool,
    pub loopback: bool,
    /// The IFLA_INFO_KIND ("veth", "vxlan", ...); None for a physical device.
    pub kind: Option<String>,
    pub vxlan: Option<Vxlan>,
}

/// A VXLAN device's parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Vxlan {
    pub vni: Option<u32>,
    /// UDP destination port.
    pub port: Option<u16>,
    /// IFLA_VXLAN_LINK: the underlay the device was made on (`dev`), when it was.
    pub underlay: Option<u32>,
    pub local: Option<IpAddr>,
    /// The remote (or multicast group) address.
    pub remote: Option<IpAddr>,
}

impl Vxlan {
    /// Whether the underlay is IPv6 (70 bytes of overhead instead of 50).
    pub fn ipv6(&self) -> bool {
        matches!(self.remote.or(self.local), Some(IpAddr::V6(_)))
    }
}

/// A NETLINK_ROUTE socket that answers one request at a time.
pub struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> Result<Rtnl, LinkError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(LinkError::Socket)?;
        socket.bind_auto().map_err(LinkError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(LinkError::Socket)?;
        crate::sys::set_receive_timeout(&socket, ANSWER_TIMEOUT).map_err(LinkError::Socket)?;
        Ok(Rtnl { socket, seq: 0 })
    }

    /// Every interface of this network namespace.
    pub fn links(&mut self) -> Result<Vec<Link>, LinkError> {
        let answers = self.request(
            "link dump",
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_from(&l)),
                _ => None,
            })
            .collect())
    }

    /// Sets the MTU of interface `index` (needs CAP_NET_ADMIN).
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<(), LinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.request("MTU change", RouteNetlinkMessage::SetLink(msg), NLM_F_ACK)?;
        Ok(())
    }

    /// The interface the main routing decision sends `dst` out of (as `ip route get`).
    pub fn route_interface(&mut self, dst: IpAddr) -> Result<Option<u32>, LinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family(dst);
        msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        let answers = self.request("route lookup", RouteNetlinkMessage::GetRoute(msg), 0)?;
        Ok(answers.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// The interface that holds the local address `addr`.
    pub fn address_interface(&mut self, addr: IpAddr) -> Result<Option<u32>, LinkError> {
        let mut msg = AddressMessage::default();
        msg.header.family = family(addr);
        let answers = self.request(
            "address dump",
            RouteNetlinkMessage::GetAddress(msg),
            NLM_F_DUMP,
        )?;
        Ok(answers.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) => a
                .attributes
                .iter()
                .any(|attr| {
                    matches!(attr, AddressAttribute::Address(x) | AddressAttribute::Local(x) if *x == addr)
                })
                .then_some(a.header.index),
            _ => None,
        }))
    }

    /// The addresses of every interface (IPv4 and IPv6), by interface index, leaving out
    /// IPv6 addresses still in duplicate address detection (tentative) or that failed it.
    pub fn addresses(&mut self) -> Result<Vec<(u32, IpAddr)>, LinkError> {
        let answers = self.request(
            "address dump",
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(answers
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => address_from(&a),
                _ => None,
            })
            .collect())
    }

    /// Sends one request and collects its answers up to the end of a dump or the ack.
    fn request(
        &mut self,
        what: &'static str,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, LinkError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket
            .send(&buf, 0)
            .map_err(|error| LinkError::Io { what, error })?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut answers = Vec::new();
        let mut receive = vec![0u8; 1 << 16];
        loop {
            receive.clear();
            let n = match self.socket.recv(&mut receive, 0) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(LinkError::Timeout {
                        what,
                        timeout: ANSWER_TIMEOUT,
                    })
                }
                Err(error) => return Err(LinkError::Io { what, error }),
            };
            let mut at = 0;
            while at < n {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&receive[at..n])
                    .map_err(|e| LinkError::Decode {
                        what,
                        detail: e.to_string(),
                    })?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(LinkError::Decode {
                        what,
                        detail: "a message of length 0".into(),
                    });
                }
                at += len.next_multiple_of(4);
                if msg.header.sequence_number != seq {
                    continue; // an answer to an earlier request that timed out
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(answers), // the ack
                        Some(_) => {
                            return Err(LinkError::Kernel {
                                what,
                                error: e.to_io(),
                            })
                        }
                    },
                    NetlinkPayload::InnerMessage(m) => {
                        answers.push(m);
                        if !dump && flags & NLM_F_ACK == 0 {
                            return Ok(answers);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

fn family(addr: IpAddr) -> AddressFamily {
    if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// The interface index and address of an address message: IFA_LOCAL (the local end on
/// a point-to-point link), else IFA_ADDRESS; None for an address not usable yet.
fn address_from(msg: &AddressMessage) -> Option<(u32, IpAddr)> {
    let mut flags = AddressFlags::from_bits_retain(u32::from(msg.header.flags.bits()));
    let mut local = None;
    let mut address = None;
    for attr in &msg.attributes {
        match attr {
            AddressAttribute::Local(a) => local = Some(*a),
            AddressAttribute::Address(a) => address = Some(*a),
            AddressAttribute::Flags(f) => flags |= *f,
            _ => {}
        }
    }
    if flags.intersects(AddressFlags::Tentative | AddressFlags::Dadfailed) {
        return None;
    }
    Some((msg.header.index, local.or(address)?))
}

/// The fields of a link message the audit needs.
fn link_from(msg: &LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mtu: 0,
        up: msg.header.flags.contains(LinkFlags::Up),
        loopback: msg.header.flags.contains(LinkFlags::Loopback),
        kind: None,
        vxlan: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(k) => link.kind = Some(kind_name(k)),
                        LinkInfo::Data(InfoData::Vxlan(v)) => link.vxlan = Some(vxlan_from(v)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if link.kind.as_deref() == Some("vxlan") && link.vxlan.is_none() {
        link.vxlan = Some(Vxlan::default());
    }
    link
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Other(s) => s.clone(),
        k => k.to_string(),
    }
}

fn vxlan_from(attrs: &[InfoVxlan]) -> Vxlan {
    let mut v = Vxlan::default();
    for a in attrs {
        match a {
            InfoVxlan::Id(id) => v.vni = Some(*id),
            InfoVxlan::Port(p) => v.port = Some(*p),
            InfoVxlan::Link(l) if *l != 0 => v.underlay = Some(*l),
            InfoVxlan::Local(a) => v.local = Some(IpAddr::V4(*a)),
            InfoVxlan::Local6(a) => v.local = Some(IpAddr::V6(*a)),
            InfoVxlan::Group(a) => v.remote = Some(IpAddr::V4(*a)),
            InfoVxlan::Group6(a) => v.remote = Some(IpAddr::V6(*a)),
            _ => {}
        }
    }
    v
}
