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

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::{finding, Finding, Severity};

/// The check's name in findings.
pub const CHECK: &str = "mtu_path";

/// The UDP port the full-size probes go to: traceroute's first, normally closed,
/// so the peer answers ICMP port unreachable.
pub const PROBE_PORT: u16 = 33434;

/// The port of the small control probe. Its own socket, so an answer to it is never
/// taken for an answer to the full-size probe (ICMP errors may quote no payload).
pub const CONTROL_PORT: u16 = 33435;

/// Full-size probes sent before the small one.
const FULL_SIZE_TRIES: u32 = 3;

const IPV4_HEADER: u32 = 20;
const IPV6_HEADER: u32 = 40;
const UDP_HEADER: u32 = 8;
/// What every IPv4 path carries (RFC 791) and every IPv6 path (RFC 8200).
const IPV4_MIN_MTU: u32 = 576;
const IPV6_MIN_MTU: u32 = 1280;

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

/// An ICMP or ICMPv6 error about a probe, other than "too big".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcmpError {
    pub icmpv6: bool,
    pub icmp_type: u8,
    pub code: u8,
    /// The ICMP's source.
    pub reported_by: Option<IpAddr>,
}

impl IcmpError {
    /// What the type and code mean.
    pub fn description(&self) -> &'static str {
        match (self.icmpv6, self.icmp_type, self.code) {
            (false, 3, 0) => "network unreachable",
            (false, 3, 1) => "host unreachable",
            (false, 3, 2) => "protocol unreachable",
            (false, 3, 3) => "port unreachable",
            (false, 3, 4) => "fragmentation needed",
            (false, 3, 5) => "source route failed",
            (false, 3, 6) => "destination network unknown",
            (false, 3, 7) => "destination host unknown",
            (false, 3, 9) => "network administratively prohibited",
            (false, 3, 10) => "host administratively prohibited",
            (false, 3, 11) => "network unreachable for TOS",
            (false, 3, 12) => "host unreachable for TOS",
            (false, 3, 13) => "communication administratively prohibited",
            (false, 3, _) => "destination unreachable",
            (false, 11, _) => "time exceeded (TTL)",
            (false, 12, _) => "parameter problem",
            (true, 1, 0) => "no route to destination",
            (true, 1, 1) => "communication administratively prohibited",
            (true, 1, 2) => "beyond scope of source address",
            (true, 1, 3) => "address unreachable",
            (true, 1, 4) => "port unreachable",
            (true, 1, 5) => "source address failed ingress/egress policy",
            (true, 1, 6) => "reject route to destination",
            (true, 1, _) => "destination unreachable",
            (true, 2, _) => "packet too big",
            (true, 3, _) => "time exceeded (hop limit)",
            (true, 4, _) => "parameter problem",
            _ => "error",
        }
    }

    /// A filter's answer (firewall, ACL), not a routing failure.
    pub fn is_administrative(&self) -> bool {
        matches!(
            (self.icmpv6, self.icmp_type, self.code),
            (false, 3, 9 | 10 | 13) | (true, 1, 1 | 5 | 6)
        )
    }
}

impl fmt::Display for IcmpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let protocol = if self.icmpv6 { "ICMPv6" } else { "ICMP" };
        write!(
            f,
            "{protocol} {} (type {} code {})",
            self.description(),
            self.icmp_type,
            self.code
        )?;
        match self.reported_by {
            Some(by) => write!(f, " from {by}"),
            None => Ok(()),
        }
    }
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

/// Sends DF probes whose IP packet is `size` bytes (the MTU the path must carry) to
/// `peer` and reports what became of them; takes at most about `timeout` (longer
/// only when a send blocks). Blocking: call it from a blocking context.
pub fn probe(peer: IpAddr, size: u32, timeout: Duration) -> Result<Probe, PathError> {
    // An IPv4-mapped IPv6 address is an IPv4 peer: its packets take the IPv4 path,
    // whose options an IPv6 socket does not set.
    let peer = peer.to_canonical();
    let (family, headers, max, min_mtu) = match peer {
        IpAddr::V4(_) => ("IPv4", IPV4_HEADER + UDP_HEADER, 65_535, IPV4_MIN_MTU),
        // The UDP length field bounds the payload, not the IPv6 header.
        IpAddr::V6(_) => (
            "IPv6",
            IPV6_HEADER + UDP_HEADER,
            65_535 + IPV6_HEADER,
            IPV6_MIN_MTU,
        ),
    };
    if size < headers || size > max {
        return Err(PathError::Size {
            size,
            family,
            min: headers,
            max,
        });
    }
    let full = ProbeSocket::open(peer, PROBE_PORT, size - headers)?;
    // The small probe only tells something when the required size is above it.
    let control = if size > min_mtu {
        Some(ProbeSocket::open(peer, CONTROL_PORT, min_mtu - headers)?)
    } else {
        None
    };
    let rounds = FULL_SIZE_TRIES + if control.is_some() { 2 } else { 0 };
    let slice = timeout / rounds;
    let mut tries = 0;
    let mut control_answered = false;
    // What an answer decides: `None` when it is the peer's answer to the small
    // probe (it is there and answers; go on).
    let decide = |from_control: bool, answer: Answer| match (from_control, answer) {
        (true, Answer::FromPeer | Answer::RejectedByPeer(_)) => None,
        (_, answer) => Some(answer.into_probe()),
    };
    for round in 0..rounds {
        let on_control = round == FULL_SIZE_TRIES;
        let confirming = round == FULL_SIZE_TRIES + 1;
        if confirming && !control_answered {
            break;
        }
        let sender = match (on_control, &control) {
            (true, Some(c)) => c,
            _ => &full,
        };
        if let Some(answer) = sender.send()? {
            match decide(on_control, answer) {
                Some(probe) => return Ok(probe),
                None => control_answered = true,
            }
        }
        if !on_control {
            tries += 1;
        }
        let until = Instant::now() + slice;
        while let Some(ready) = wait_readable(&full, control.as_ref(), until)? {
            let socket = match (ready, &control) {
                (Ready::Control, Some(c)) => c,
                _ => &full,
            };
            for answer in socket.read_answers()? {
                match decide(ready == Ready::Control, answer) {
                    Some(probe) => return Ok(probe),
                    None => control_answered = true,
                }
            }
            if on_control && control_answered {
                break;
            }
        }
    }
    Ok(if control_answered {
        Probe::DroppedSilently {
            answered_size: min_mtu,
            tries,
        }
    } else {
        Probe::NoAnswer { tries }
    })
}

/// The finding for the probe of `peer` at `required` bytes (`interface`: the one
/// the route to the peer uses, when the caller knows it). `None` when the path
/// carries the size.
pub fn audit(
    peer: IpAddr,
    required: u32,
    interface: Option<&str>,
    result: &Result<Probe, PathError>,
) -> Option<Finding> {
    let expected = format!("path MTU >= {required}");
    let tracepath = format!("tracepath -n -l {required} {peer}");
    let report = |severity, found: String, expected: &str, fix: String| {
        Some(finding(CHECK, interface, severity, found, expected, fix))
    };
    let probe = match result {
        Ok(probe) => probe,
        Err(e) if e.is_no_route() => {
            return report(
                Severity::Error,
                format!("no route to {peer}: {e}"),
                &format!("a route to {peer}"),
                format!("add a route to {peer}: RoCE traffic to it cannot leave this host"),
            )
        }
        Err(e @ PathError::Size { .. }) => {
            return report(
                Severity::Error,
                format!("cannot probe {peer}: {e}"),
                &expected,
                format!("set a required MTU that {peer}'s address family can carry"),
            )
        }
        Err(e) => {
            return report(
                Severity::Warning,
                format!("could not probe the path towards {peer}: {e}"),
                &expected,
                format!("check it by hand: {tracepath}"),
            )
        }
    };
    match *probe {
        Probe::Carried => None,
        Probe::TooBig {
            path_mtu,
            reported_by,
        } => {
            let source = match reported_by {
                Some(by) => format!("ICMP from {by}"),
                None => "ICMP without a source address".to_string(),
            };
            let found = match path_mtu {
                Some(mtu) => format!("path MTU {mtu} towards {peer} ({source})"),
                None => format!(
                    "a hop towards {peer} cannot forward {required} bytes with DF and did not \
                     say its MTU ({source})"
                ),
            };
            let fix = match reported_by {
                Some(by) => format!(
                    "raise the MTU of the router at {by} on its link towards {peer} (and of \
                     every hop after it) to {required} or more"
                ),
                None => format!(
                    "find the hop whose MTU is below {required} ({tracepath}) and raise it to \
                     {required} or more"
                ),
            };
            report(Severity::Error, found, &expected, fix)
        }
        Probe::LocalMtuTooSmall { mtu } => {
            let (found, fix) = match interface {
                Some(ifname) => (
                    format!("the route towards {peer} leaves through {ifname}, MTU {mtu}"),
                    format!("raise the MTU of {ifname} to {required} or more"),
                ),
                None => (
                    format!("the route towards {peer} leaves this host with MTU {mtu}"),
                    format!(
                        "raise the MTU of the interface the route to {peer} uses to {required} \
                         or more"
                    ),
                ),
            };
            report(Severity::Error, found, &expected, fix)
        }
        Probe::DroppedSilently {
            answered_size,
            tries,
        } => report(
            Severity::Error,
            format!(
                "{peer} answers a probe of {answered_size} bytes but none of {required} bytes \
                 with DF ({tries} sent): a hop drops large packets without ICMP"
            ),
            &expected,
            format!(
                "find the hop whose MTU is below {required} (an L2 switch port, or a router \
                 that sends no ICMP; {tracepath}) and raise it to {required} or more"
            ),
        ),
        Probe::NoAnswer { tries } => report(
            Severity::Warning,
            format!(
                "no answer from {peer} to {tries} DF probes of {required} bytes, nor to a \
                 small one: the path MTU is not confirmed"
            ),
            &format!("ICMP port unreachable from {peer} for UDP to port {PROBE_PORT}"),
            format!(
                "let {peer} answer UDP to ports {PROBE_PORT}-{CONTROL_PORT} with ICMP port \
                 unreachable (no firewall drop) and let ICMP back to this host, then check \
                 again; or check by hand: {tracepath}"
            ),
        ),
        Probe::RejectedByPeer(icmp) => report(
            Severity::Info,
            format!(
                "a DF probe of {required} bytes reached {peer}, which answered {icmp} rather \
                 than port unreachable"
            ),
            &format!("ICMP port unreachable from {peer} for UDP to port {PROBE_PORT}"),
            format!(
                "nothing for the MTU; a firewall on {peer} rejects UDP to port {PROBE_PORT}: \
                 allow it for a plain answer"
            ),
        ),
        Probe::Unreachable(icmp) => {
            let by = icmp
                .reported_by
                .map_or("the hop".to_string(), |a| format!("the hop at {a}"));
            let (severity, fix) = if icmp.is_administrative() {
                (
                    Severity::Warning,
                    format!(
                        "let UDP to port {PROBE_PORT} through the filter at {by}, or check by \
                         hand: {tracepath}"
                    ),
                )
            } else {
                (
                    Severity::Error,
                    format!("make {peer} reachable: {by} has no way to it"),
                )
            };
            report(
                severity,
                format!("the DF probe of {required} bytes did not reach {peer}: {icmp}"),
                &format!("ICMP port unreachable from {peer} for UDP to port {PROBE_PORT}"),
                fix,
            )
        }
    }
}

/// What one entry of the error queue (or a reply) says about the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// ICMP port unreachable from the peer, or a UDP reply: the probe arrived.
    FromPeer,
    TooBig {
        path_mtu: Option<u32>,
        reported_by: Option<IpAddr>,
    },
    LocalMtuTooSmall {
        mtu: u32,
    },
    RejectedByPeer(IcmpError),
    Unreachable(IcmpError),
}

impl Answer {
    fn into_probe(self) -> Probe {
        match self {
            Answer::FromPeer => Probe::Carried,
            Answer::TooBig {
                path_mtu,
                reported_by,
            } => Probe::TooBig {
                path_mtu,
                reported_by,
            },
            Answer::LocalMtuTooSmall { mtu } => Probe::LocalMtuTooSmall { mtu },
            Answer::RejectedByPeer(icmp) => Probe::RejectedByPeer(icmp),
            Answer::Unreachable(icmp) => Probe::Unreachable(icmp),
        }
    }
}

/// `struct sock_extended_err` and the offender address after it (`SO_EE_OFFENDER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExtendedError {
    errno: u32,
    origin: u8,
    icmp_type: u8,
    code: u8,
    info: u32,
    offender: Option<IpAddr>,
}

/// Size of `struct sock_extended_err`: errno, origin, type, code, pad, info, data.
const EXTENDED_ERROR_LEN: usize = 16;

/// Reads an `IP_RECVERR` / `IPV6_RECVERR` control message's data; `None` for any
/// other control message or one too short. The offender is the ICMP's source
/// (`None` for local errors, whose offender is `AF_UNSPEC`).
fn parse_extended_error(level: i32, kind: i32, data: &[u8]) -> Option<ExtendedError> {
    let ours = (level == libc::SOL_IP && kind == libc::IP_RECVERR)
        || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR);
    if !ours {
        return None;
    }
    let u32_at = |at: usize| -> Option<u32> {
        let bytes = data.get(at..at + 4)?;
        Some(u32::from_ne_bytes(bytes.try_into().ok()?))
    };
    Some(ExtendedError {
        errno: u32_at(0)?,
        origin: *data.get(4)?,
        icmp_type: *data.get(5)?,
        code: *data.get(6)?,
        info: u32_at(8)?,
        offender: parse_sockaddr(data.get(EXTENDED_ERROR_LEN..).unwrap_or_default()),
    })
}

/// The address of a `sockaddr_in` / `sockaddr_in6` (family in host order, then
/// port; IPv4 address at 4, IPv6 at 8).
fn parse_sockaddr(sockaddr: &[u8]) -> Option<IpAddr> {
    let family = u16::from_ne_bytes(sockaddr.get(0..2)?.try_into().ok()?);
    match i32::from(family) {
        libc::AF_INET => {
            let octets: [u8; 4] = sockaddr.get(4..8)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(octets)))
        }
        libc::AF_INET6 => {
            let octets: [u8; 16] = sockaddr.get(8..24)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

/// What an error-queue entry means for a probe sent to `peer`; `None` for entries
/// that are no answer (timestamps, zero-copy notices).
fn classify(error: &ExtendedError, peer: IpAddr) -> Option<Answer> {
    let from_peer = error.offender == Some(peer);
    let icmp = |icmpv6| IcmpError {
        icmpv6,
        icmp_type: error.icmp_type,
        code: error.code,
        reported_by: error.offender,
    };
    let too_big = Answer::TooBig {
        path_mtu: (error.info != 0).then_some(error.info),
        reported_by: error.offender,
    };
    match error.origin {
        libc::SO_EE_ORIGIN_LOCAL if error.errno == libc::EMSGSIZE as u32 => {
            Some(Answer::LocalMtuTooSmall { mtu: error.info })
        }
        libc::SO_EE_ORIGIN_ICMP => Some(match (error.icmp_type, error.code) {
            (3, 4) => too_big,
            (3, 3) if from_peer => Answer::FromPeer,
            _ if from_peer => Answer::RejectedByPeer(icmp(false)),
            _ => Answer::Unreachable(icmp(false)),
        }),
        libc::SO_EE_ORIGIN_ICMP6 => Some(match (error.icmp_type, error.code) {
            (2, _) => too_big,
            (1, 4) if from_peer => Answer::FromPeer,
            _ if from_peer => Answer::RejectedByPeer(icmp(true)),
            _ => Answer::Unreachable(icmp(true)),
        }),
        _ => None,
    }
}

/// A UDP socket connected to the peer that sends DF probes of one size and reports
/// the ICMP errors about them.
struct ProbeSocket {
    socket: UdpSocket,
    to: SocketAddr,
    payload: Vec<u8>,
}

impl ProbeSocket {
    fn open(peer: IpAddr, port: u16, payload_len: u32) -> Result<ProbeSocket, PathError> {
        let any: SocketAddr = match peer {
            IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let socket = UdpSocket::bind(any).map_err(PathError::Socket)?;
        let options: &[(i32, i32, i32, &'static str)] = match peer {
            IpAddr::V4(_) => &[
                (
                    libc::SOL_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_PROBE,
                    "IP_MTU_DISCOVER",
                ),
                (libc::SOL_IP, libc::IP_RECVERR, 1, "IP_RECVERR"),
            ],
            // IPv6 hosts fragment themselves unless told not to: DONTFRAG too.
            IpAddr::V6(_) => &[
                (
                    libc::SOL_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_PROBE,
                    "IPV6_MTU_DISCOVER",
                ),
                (libc::SOL_IPV6, libc::IPV6_DONTFRAG, 1, "IPV6_DONTFRAG"),
                (libc::SOL_IPV6, libc::IPV6_RECVERR, 1, "IPV6_RECVERR"),
            ],
        };
        for &(level, name, value, option) in options {
            set_int_option(&socket, level, name, value)
                .map_err(|source| PathError::SocketOption { option, source })?;
        }
        let to = SocketAddr::new(peer, port);
        socket
            .connect(to)
            .map_err(|source| PathError::Connect { to, source })?;
        Ok(ProbeSocket {
            socket,
            to,
            payload: vec![0; payload_len as usize],
        })
    }

    /// Sends one probe. `Some` when the send itself answers: this host's MTU is
    /// smaller, or an answer to an earlier probe was pending (the kernel reports it
    /// on the next send, which then sends nothing).
    fn send(&self) -> Result<Option<Answer>, PathError> {
        let error = match self.socket.send(&self.payload) {
            Ok(_) => return Ok(None),
            // Dropped on the way out (a full queue; on a veth, the peer end refusing a
            // frame above its MTU): with IP_RECVERR the kernel says so. A lost probe.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(None),
            Err(e) => e,
        };
        if let Some(answer) = self.read_answers()?.into_iter().next() {
            return Ok(Some(answer));
        }
        if error.raw_os_error() == Some(libc::EMSGSIZE) {
            // Nothing queued (it would hold the MTU): ask the route.
            return Ok(Some(Answer::LocalMtuTooSmall {
                mtu: self.route_mtu()?,
            }));
        }
        Err(PathError::Send {
            to: self.to,
            source: error,
        })
    }

    /// Empties the error queue and the receive queue: the answers they hold.
    fn read_answers(&self) -> Result<Vec<Answer>, PathError> {
        let peer = self.to.ip();
        let mut answers: Vec<Answer> = self
            .drain_error_queue()
            .map_err(PathError::Receive)?
            .iter()
            .filter_map(|e| classify(e, peer))
            .collect();
        // A reply (something listens on the port): the probe arrived too.
        let mut reply = [0u8; 64];
        // SAFETY: recv into a buffer of the length given; MSG_DONTWAIT never blocks.
        let n = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                reply.as_mut_ptr().cast(),
                reply.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if n >= 0 {
            answers.push(Answer::FromPeer);
        }
        // A pending socket error with nothing queued would keep poll() waking us.
        let _ = self.socket.take_error();
        Ok(answers)
    }

    /// `recvmsg(MSG_ERRQUEUE)` until the queue is empty: the extended errors read.
    fn drain_error_queue(&self) -> io::Result<Vec<ExtendedError>> {
        let mut errors = Vec::new();
        loop {
            // The quoted datagram is not needed: a small buffer, truncated.
            let mut quoted = [0u8; 64];
            // u64 elements: aligned for cmsghdr.
            let mut control = [0u64; 64];
            let mut iov = libc::iovec {
                iov_base: quoted.as_mut_ptr().cast(),
                iov_len: quoted.len(),
            };
            // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: msg points to buffers that outlive the call, with their lengths.
            let n = unsafe {
                libc::recvmsg(
                    self.socket.as_raw_fd(),
                    &mut msg,
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(errors),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let control_start = control.as_ptr() as usize;
            let control_end =
                control_start + (msg.msg_controllen as usize).min(std::mem::size_of_val(&control));
            // SAFETY: the CMSG macros walk the control buffer the kernel filled, within
            // msg_controllen; each data slice is clamped to the buffer's end.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
                while !cmsg.is_null() {
                    let data = libc::CMSG_DATA(cmsg);
                    let declared =
                        ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    let len = declared.min(control_end.saturating_sub(data as usize));
                    let bytes = std::slice::from_raw_parts(data, len);
                    if let Some(e) =
                        parse_extended_error((*cmsg).cmsg_level, (*cmsg).cmsg_type, bytes)
                    {
                        errors.push(e);
                    }
                    cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
                }
            }
        }
    }

    /// `IP_MTU` / `IPV6_MTU`: the MTU of the connected route.
    fn route_mtu(&self) -> Result<u32, PathError> {
        let (level, name, option) = match self.to {
            SocketAddr::V4(_) => (libc::SOL_IP, libc::IP_MTU, "IP_MTU"),
            SocketAddr::V6(_) => (libc::SOL_IPV6, libc::IPV6_MTU, "IPV6_MTU"),
        };
        let mut mtu: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into an int of the length given.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                level,
                name,
                (&mut mtu as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(PathError::SocketOption {
                option,
                source: io::Error::last_os_error(),
            });
        }
        Ok(u32::try_from(mtu).unwrap_or(0))
    }
}

/// Which socket has something to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ready {
    Full,
    Control,
}

/// Waits until one of the sockets has an error queued or a reply, or `until` passes
/// (`None`).
fn wait_readable(
    full: &ProbeSocket,
    control: Option<&ProbeSocket>,
    until: Instant,
) -> Result<Option<Ready>, PathError> {
    // POLLERR is always reported; POLLIN for a reply.
    let pollfd = |s: &ProbeSocket| libc::pollfd {
        fd: s.socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = vec![pollfd(full)];
    fds.extend(control.map(pollfd));
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        // Rounded up: a sub-millisecond rest must not turn into a busy loop.
        let ms = i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        // SAFETY: poll on a vector of pollfds of the length given.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(PathError::Receive(e));
        }
        if let Some(i) = fds.iter().position(|p| p.revents != 0) {
            return Ok(Some(if i == 0 { Ready::Full } else { Ready::Control }));
        }
    }
}

fn set_int_option(socket: &UdpSocket, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to an int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER4: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 2, 2));
    const HOP4: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 1, 1));
    const PEER6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 2));
    const HOP6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1));

    /// The bytes the kernel puts in an IP_RECVERR control message: the C struct,
    /// then a sockaddr_in / sockaddr_in6 (or AF_UNSPEC).
    fn cmsg_data(ee: libc::sock_extended_err, offender: Option<IpAddr>) -> Vec<u8> {
        // SAFETY: sock_extended_err is plain old data without padding (4+1+1+1+1+4+4).
        let mut bytes = unsafe {
            std::slice::from_raw_parts(
                (&ee as *const libc::sock_extended_err).cast::<u8>(),
                std::mem::size_of::<libc::sock_extended_err>(),
            )
        }
        .to_vec();
        match offender {
            Some(IpAddr::V4(a)) => {
                let mut sin = vec![0u8; 16];
                sin[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
                sin[4..8].copy_from_slice(&a.octets());
                bytes.extend(sin);
            }
            Some(IpAddr::V6(a)) => {
                let mut sin6 = vec![0u8; 28];
                sin6[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
                sin6[8..24].copy_from_slice(&a.octets());
                bytes.extend(sin6);
            }
            None => bytes.extend([0u8; 16]),
        }
        bytes
    }

    fn ee(errno: i32, origin: u8, icmp_type: u8, code: u8, info: u32) -> libc::sock_extended_err {
        libc::sock_extended_err {
            ee_errno: errno as u32,
            ee_origin: origin,
            ee_type: icmp_type,
            ee_code: code,
            ee_pad: 0,
            ee_info: info,
            ee_data: 0,
        }
    }

    fn parsed_v4(e: libc::sock_extended_err, offender: Option<IpAddr>) -> ExtendedError {
        let data = cmsg_data(e, offender);
        parse_extended_error(libc::SOL_IP, libc::IP_RECVERR, &data).expect("parses")
    }

    fn parsed_v6(e: libc::sock_extended_err, offender: Option<IpAddr>) -> ExtendedError {
        let data = cmsg_data(e, offender);
        parse_extended_error(libc::SOL_IPV6, libc::IPV6_RECVERR, &data).expect("parses")
    }

    #[test]
    fn extended_error_layout_matches_the_c_struct() {
        assert_eq!(
            std::mem::size_of::<libc::sock_extended_err>(),
            EXTENDED_ERROR_LEN
        );
        let e = parsed_v4(
            ee(libc::EMSGSIZE, libc::SO_EE_ORIGIN_ICMP, 3, 4, 1500),
            Some(HOP4),
        );
        assert_eq!(
            e,
            ExtendedError {
                errno: libc::EMSGSIZE as u32,
                origin: libc::SO_EE_ORIGIN_ICMP,
                icmp_type: 3,
                code: 4,
                info: 1500,
                offender: Some(HOP4),
            }
        );
        let e = parsed_v6(
            ee(libc::EMSGSIZE, libc::SO_EE_ORIGIN_ICMP6, 2, 0, 1500),
            Some(HOP6),
        );
        assert_eq!((e.icmp_type, e.info, e.offender), (2, 1500, Some(HOP6)));
    }

    #[test]
    fn local_errors_have_no_offender() {
        let e = parsed_v4(
            ee(libc::EMSGSIZE, libc::SO_EE_ORIGIN_LOCAL, 0, 0, 1500),
            None,
        );
        assert_eq!(e.offender, None);
        assert_eq!(
            classify(&e, PEER4),
            Some(Answer::LocalMtuTooSmall { mtu: 1500 })
        );
    }

    #[test]
    fn other_control_messages_and_short_data_are_ignored() {
        let data = cmsg_data(ee(0, libc::SO_EE_ORIGIN_ICMP, 3, 3, 0), Some(PEER4));
        assert_eq!(
            parse_extended_error(libc::SOL_IP, libc::IP_TTL, &data),
            None
        );
        assert_eq!(
            parse_extended_error(libc::SOL_SOCKET, libc::IP_RECVERR, &data),
            None
        );
        for len in [0, 1, 7, 11] {
            assert_eq!(
                parse_extended_error(libc::SOL_IP, libc::IP_RECVERR, &data[..len]),
                None,
                "{len} bytes"
            );
        }
        // The struct alone: no offender, still an error.
        let e = parse_extended_error(libc::SOL_IP, libc::IP_RECVERR, &data[..16]);
        assert_eq!(e.map(|e| e.offender), Some(None));
        // A truncated sockaddr: no offender rather than garbage.
        let e = parse_extended_error(libc::SOL_IP, libc::IP_RECVERR, &data[..22]);
        assert_eq!(e.map(|e| e.offender), Some(None));
    }

    #[test]
    fn port_unreachable_from_the_peer_means_it_arrived() {
        let v4 = parsed_v4(
            ee(libc::ECONNREFUSED, libc::SO_EE_ORIGIN_ICMP, 3, 3, 0),
            Some(PEER4),
        );
        assert_eq!(classify(&v4, PEER4), Some(Answer::FromPeer));
        let v6 = parsed_v6(
            ee(libc::ECONNREFUSED, libc::SO_EE_ORIGIN_ICMP6, 1, 4, 0),
            Some(PEER6),
        );
        assert_eq!(classify(&v6, PEER6), Some(Answer::FromPeer));
    }

    #[test]
    fn port_unreachable_from_someone_else_is_no_arrival() {
        let e = parsed_v4(
            ee(libc::ECONNREFUSED, libc::SO_EE_ORIGIN_ICMP, 3, 3, 0),
            Some(HOP4),
        );
        assert!(matches!(
            classify(&e, PEER4),
            Some(Answer::Unreachable(IcmpError {
                reported_by: Some(HOP4),
                ..
            }))
        ));
    }

    #[test]
    fn too_big_carries_the_mtu_and_the_hop() {
        let v4 = parsed_v4(
            ee(libc::EMSGSIZE, libc::SO_EE_ORIGIN_ICMP, 3, 4, 1500),
            Some(HOP4),
        );
        assert_eq!(
            classify(&v4, PEER4),
            Some(Answer::TooBig {
                path_mtu: Some(1500),
                reported_by: Some(HOP4)
            })
        );
        let v6 = parsed_v6(
            ee(libc::EMSGSIZE, libc::SO_EE_ORIGIN_ICMP6, 2, 0, 1500),
            Some(HOP6),
        );
        assert_eq!(
            classify(&v6, PEER6),
            Some(Answer::TooBig {
                path_mtu: Some(1500),
                reported_by: Some(HOP6)
            })
        );
        // A hop that does not say its MTU.
        let silent = parsed_v4(
            ee(libc::EMSGSIZE, libc::SO_EE_ORIGIN_ICMP, 3, 4, 0),
            Some(HOP4),
        );
        assert_eq!(
            classify(&silent, PEER4),
            Some(Answer::TooBig {
                path_mtu: None,
                reported_by: Some(HOP4)
            })
        );
    }

    #[test]
    fn other_errors_from_the_peer_are_rejections_from_elsewhere_unreachable() {
        let prohibited = parsed_v4(
            ee(libc::EHOSTUNREACH, libc::SO_EE_ORIGIN_ICMP, 3, 13, 0),
            Some(PEER4),
        );
        let Some(Answer::RejectedByPeer(icmp)) = classify(&prohibited, PEER4) else {
            panic!("{:?}", classify(&prohibited, PEER4));
        };
        assert!(icmp.is_administrative());
        assert_eq!(
            icmp.to_string(),
            "ICMP communication administratively prohibited (type 3 code 13) from 198.18.2.2"
        );
        let host_unreachable = parsed_v4(
            ee(libc::EHOSTUNREACH, libc::SO_EE_ORIGIN_ICMP, 3, 1, 0),
            Some(HOP4),
        );
        let Some(Answer::Unreachable(icmp)) = classify(&host_unreachable, PEER4) else {
            panic!("{:?}", classify(&host_unreachable, PEER4));
        };
        assert!(!icmp.is_administrative());
        assert_eq!(icmp.description(), "host unreachable");
        let address_unreachable = parsed_v6(
            ee(libc::EHOSTUNREACH, libc::SO_EE_ORIGIN_ICMP6, 1, 3, 0),
            Some(HOP6),
        );
        assert!(matches!(
            classify(&address_unreachable, PEER6),
            Some(Answer::Unreachable(IcmpError { icmpv6: true, .. }))
        ));
        let hop_limit = parsed_v6(
            ee(libc::EHOSTUNREACH, libc::SO_EE_ORIGIN_ICMP6, 3, 0, 0),
            Some(HOP6),
        );
        let Some(Answer::Unreachable(icmp)) = classify(&hop_limit, PEER6) else {
            panic!("{:?}", classify(&hop_limit, PEER6));
        };
        assert_eq!(icmp.description(), "time exceeded (hop limit)");
    }

    #[test]
    fn entries_that_are_no_answer_are_ignored() {
        let timestamp = parsed_v4(
            ee(libc::ENOMSG, libc::SO_EE_ORIGIN_TIMESTAMPING, 0, 0, 0),
            None,
        );
        assert_eq!(classify(&timestamp, PEER4), None);
        let none = parsed_v4(ee(0, libc::SO_EE_ORIGIN_NONE, 0, 0, 0), None);
        assert_eq!(classify(&none, PEER4), None);
    }

    #[test]
    fn impossible_sizes_are_refused_before_any_socket() {
        for (peer, size) in [(PEER4, 27), (PEER4, 65_536), (PEER6, 47), (PEER6, 65_576)] {
            assert!(
                matches!(
                    probe(peer, size, Duration::from_millis(1)),
                    Err(PathError::Size { .. })
                ),
                "{peer} {size}"
            );
        }
    }

    fn audited(probe: Result<Probe, PathError>) -> Option<Finding> {
        audit(PEER4, 9000, Some("eth1"), &probe)
    }

    #[test]
    fn a_carried_probe_is_no_finding() {
        assert_eq!(audited(Ok(Probe::Carried)), None);
    }

    #[test]
    fn too_big_names_the_mtu_and_the_hop() {
        let f = audited(Ok(Probe::TooBig {
            path_mtu: Some(1500),
            reported_by: Some(HOP4),
        }))
        .expect("a finding");
        assert_eq!(f.check, "mtu_path");
        assert_eq!(f.interface.as_deref(), Some("eth1"));
        assert_eq!(f.severity, Severity::Error);
        assert_eq!(
            f.found,
            "path MTU 1500 towards 198.18.2.2 (ICMP from 198.18.1.1)"
        );
        assert_eq!(f.expected, "path MTU >= 9000");
        assert_eq!(
            f.fix,
            "raise the MTU of the router at 198.18.1.1 on its link towards 198.18.2.2 (and of \
             every hop after it) to 9000 or more"
        );
        assert_eq!(f.flows, None);
    }

    #[test]
    fn too_big_without_mtu_or_source_still_says_what_to_do() {
        let f = audited(Ok(Probe::TooBig {
            path_mtu: None,
            reported_by: None,
        }))
        .expect("a finding");
        assert_eq!(f.severity, Severity::Error);
        assert!(f.found.contains("did not say its MTU"), "{}", f.found);
        assert!(
            f.fix.contains("tracepath -n -l 9000 198.18.2.2"),
            "{}",
            f.fix
        );
    }

    #[test]
    fn a_small_local_mtu_names_the_interface() {
        let f = audited(Ok(Probe::LocalMtuTooSmall { mtu: 1500 })).expect("a finding");
        assert_eq!(f.severity, Severity::Error);
        assert_eq!(
            f.found,
            "the route towards 198.18.2.2 leaves through eth1, MTU 1500"
        );
        assert_eq!(f.fix, "raise the MTU of eth1 to 9000 or more");
        let f = audit(
            PEER4,
            9000,
            None,
            &Ok(Probe::LocalMtuTooSmall { mtu: 1500 }),
        )
        .expect("a finding");
        assert_eq!(f.interface, None);
        assert!(f.fix.contains("the interface the route to 198.18.2.2 uses"));
    }

    #[test]
    fn a_black_hole_is_an_error() {
        let f = audited(Ok(Probe::DroppedSilently {
            answered_size: 576,
            tries: 4,
        }))
        .expect("a finding");
        assert_eq!(f.severity, Severity::Error);
        assert_eq!(
            f.found,
            "198.18.2.2 answers a probe of 576 bytes but none of 9000 bytes with DF (4 sent): \
             a hop drops large packets without ICMP"
        );
    }

    #[test]
    fn no_answer_is_a_warning_saying_what_the_peer_must_answer() {
        let f = audited(Ok(Probe::NoAnswer { tries: 3 })).expect("a finding");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.found.contains("not confirmed"), "{}", f.found);
        assert_eq!(
            f.expected,
            "ICMP port unreachable from 198.18.2.2 for UDP to port 33434"
        );
        assert!(f.fix.contains("33434-33435"), "{}", f.fix);
    }

    #[test]
    fn icmp_errors_name_their_source() {
        let rejected = IcmpError {
            icmpv6: false,
            icmp_type: 3,
            code: 13,
            reported_by: Some(PEER4),
        };
        let f = audited(Ok(Probe::RejectedByPeer(rejected))).expect("a finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.found.contains("reached 198.18.2.2"), "{}", f.found);
        let unreachable = IcmpError {
            icmpv6: false,
            icmp_type: 3,
            code: 1,
            reported_by: Some(HOP4),
        };
        let f = audited(Ok(Probe::Unreachable(unreachable))).expect("a finding");
        assert_eq!(f.severity, Severity::Error);
        assert_eq!(
            f.found,
            "the DF probe of 9000 bytes did not reach 198.18.2.2: ICMP host unreachable \
             (type 3 code 1) from 198.18.1.1"
        );
        let filtered = IcmpError {
            code: 13,
            ..unreachable
        };
        let f = audited(Ok(Probe::Unreachable(filtered))).expect("a finding");
        assert_eq!(f.severity, Severity::Warning);
        assert!(
            f.fix.contains("filter at the hop at 198.18.1.1"),
            "{}",
            f.fix
        );
    }

    #[test]
    fn errors_name_the_source_and_no_route_is_an_error() {
        let to = SocketAddr::new(PEER4, PROBE_PORT);
        let no_route = PathError::Connect {
            to,
            source: io::Error::from_raw_os_error(libc::ENETUNREACH),
        };
        let f = audited(Err(no_route)).expect("a finding");
        assert_eq!(f.severity, Severity::Error);
        assert!(f
            .found
            .starts_with("no route to 198.18.2.2: connecting the probe socket"));
        let denied = PathError::SocketOption {
            option: "IP_RECVERR",
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        let f = audited(Err(denied)).expect("a finding");
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.found.contains("setting IP_RECVERR"), "{}", f.found);
        let size = PathError::Size {
            size: 70_000,
            family: "IPv4",
            min: 28,
            max: 65_535,
        };
        let f = audit(PEER4, 70_000, None, &Err(size)).expect("a finding");
        assert_eq!(f.severity, Severity::Error);
    }
}
