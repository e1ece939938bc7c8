//! The `mtu_path` check: a pure function from what [`probe`](super::probe) found
//! (or why it could not run) to the finding.

use std::net::IpAddr;

use super::{PathError, Probe, CHECK, CONTROL_PORT, PROBE_PORT};
use crate::audit::{finding, Finding, Severity};

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

#[cfg(test)]
mod tests {
    use super::super::IcmpError;
    use super::*;
    use std::io;
    use std::net::{Ipv4Addr, SocketAddr};

    const PEER4: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 2, 2));
    const HOP4: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 1, 1));

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
