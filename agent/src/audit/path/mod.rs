//! `mtu_path`: does the network path to a peer carry a packet of the required size
//! with DF set? A router in the middle with a smaller MTU is what no host-only check
//! finds.
//!
//! How, as tracepath does it (unprivileged, no raw socket): a UDP socket connected to
//! the peer's port 33434 with `IP_MTU_DISCOVER = IP_PMTUDISC_PROBE` (DF set) and
//! `IP_RECVERR` (ICMP errors about our datagrams are queued on the socket, with who
//! sent them), one datagram whose IP packet is exactly the required size, then the
//! socket's error queue:
//! - ICMP port unreachable from the peer itself: the probe arrived;
//! - ICMP fragmentation needed / ICMPv6 packet too big: a hop could not forward it;
//!   the MTU it announced (`ee_info`) and its address (the offender) are the finding;
//! - a local EMSGSIZE: this host's own interface is already smaller;
//! - any other ICMP error: from the peer, the probe arrived (a firewall answered);
//!   from anyone else, it did not (no route, TTL, a filter).
//!
//! `PROBE` rather than `DO`: with `DO` the kernel refuses to send once it has cached a
//! smaller path MTU for the peer (for 10 minutes, learnt from our own earlier probe
//! or from any traffic), so a check right after the hop was fixed would still fail,
//! and without the hop's address. `PROBE` sends at the interface MTU every time: each
//! check measures the path as it is now.
//!
//! Silence is no answer: ICMP is rate-limited, and the first packet may be lost to
//! address resolution on the way, so the full-size probe is sent three times (a
//! local drop, which IP_RECVERR reports as ENOBUFS on send, counts as a lost one). When
//! none is answered, a small probe (576 bytes over IPv4, 1280 over IPv6: what every
//! path carries) tells a black hole (the peer answers small packets but never large
//! ones: an L2 hop with a smaller MTU, which sends no ICMP) from a peer that answers
//! nothing. One more full-size probe after the small one's answer keeps a peer's
//! ICMP rate limit from passing for a black hole.
//!
//! Only the way there is probed; the way back is the peer's own check.
//!
//! Here: what became of a probe ([`Probe`]) and why one could not be run
//! ([`PathError`]). `socket` sends the probes and reads the error queue ([`probe`]),
//! `icmp` says what each queued ICMP error means ([`IcmpError`]), `check` turns the
//! outcome into the finding ([`audit`]).

mod check;
mod icmp;
mod socket;

use std::io;
use std::net::{IpAddr, SocketAddr};

pub use check::audit;
pub use icmp::IcmpError;
pub use socket::probe;

/// The check's name in findings.
pub const CHECK: &str = "mtu_path";

/// The UDP port the full-size probes go to: traceroute's first, normally closed,
/// so the peer answers ICMP port unreachable.
pub const PROBE_PORT: u16 = 33434;

/// The port of the small control probe. Its own socket, so an answer to it is never
/// taken for an answer to the full-size probe (ICMP errors may quote no payload).
pub const CONTROL_PORT: u16 = 33435;

/// What became of the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The peer answered (ICMP port unreachable from it, or a UDP reply): the path
    /// carries the size with DF.
    Carried,
    /// A hop could not forward the probe: ICMP fragmentation needed, ICMPv6 packet
    /// too big.
    TooBig {
        /// The MTU the hop announced; `None` when it did not say (a pre-RFC 1191
        /// router, or `net.ipv4.ip_no_pmtu_disc` set on this host).
        path_mtu: Option<u32>,
        /// The ICMP's source: the hop's address on its side towards this host.
        reported_by: Option<IpAddr>,
    },
    /// This host cannot send it: the interface its route uses has a smaller MTU.
    LocalMtuTooSmall { mtu: u32 },
    /// The peer answers a small probe of `answered_size` bytes but none of the
    /// required size (`tries` sent): something on the path drops large packets
    /// without ICMP (an L2 hop with a smaller MTU, or a router whose ICMP is off).
    DroppedSilently { answered_size: u32, tries: u32 },
    /// No answer to the `tries` full-size probes nor to a small one: nothing known.
    NoAnswer { tries: u32 },
    /// The probe reached the peer, which answered another ICMP error than port
    /// unreachable (a firewall rejecting UDP): the path carries the size.
    RejectedByPeer(IcmpError),
    /// A hop (or this host) reported that the probe cannot reach the peer.
    Unreachable(IcmpError),
}

/// Why the probe could not be run (as opposed to what it found).
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("a probe of {size} bytes is no {family} packet (sizes {min} to {max})")]
    Size {
        size: u32,
        family: &'static str,
        min: u32,
        max: u32,
    },
    #[error("opening a UDP socket for the probe: {0}")]
    Socket(#[source] io::Error),
    #[error("setting {option} on the probe socket: {source}")]
    SocketOption {
        option: &'static str,
        source: io::Error,
    },
    #[error("connecting the probe socket to {to}: {source}")]
    Connect { to: SocketAddr, source: io::Error },
    #[error("sending the probe to {to}: {source}")]
    Send { to: SocketAddr, source: io::Error },
    #[error("reading the answers to the probe: {0}")]
    Receive(#[source] io::Error),
}

impl PathError {
    /// This host has no route to the peer (connect failed with "unreachable").
    pub fn is_no_route(&self) -> bool {
        match self {
            PathError::Connect { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
            ),
            _ => false,
        }
    }
}
