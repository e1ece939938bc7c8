//! What the socket's error queue says: `IP_RECVERR` / `IPV6_RECVERR` control
//! messages read (`struct sock_extended_err` and the offender's address) and each
//! ICMP or local error classified as an answer to the probe. No I/O: `socket` reads
//! the queue.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Probe;

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

/// What one entry of the error queue (or a reply) says about the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
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
    pub(super) fn into_probe(self) -> Probe {
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
pub(super) struct ExtendedError {
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
pub(super) fn parse_extended_error(level: i32, kind: i32, data: &[u8]) -> Option<ExtendedError> {
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
pub(super) fn classify(error: &ExtendedError, peer: IpAddr) -> Option<Answer> {
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
}
