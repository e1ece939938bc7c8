//! The `dcb_app`, `pfc` and `dcb_unsupported` checks: pure functions from what
//! [`query`](super::query) returned and the policy to findings.

use roce_common::policy::{Policy, DSCP_COUNT};

use super::{priorities_of_mask, DcbError, DcbState, PRIORITIES};
use crate::audit::{finding, Finding, Severity};

/// The policy's priority for `dscp`, when it is an 802.1Q priority (0..7): a larger
/// skb priority has no app-table or PFC counterpart to compare with.
fn policy_priority(policy: &Policy, dscp: u8) -> Option<u8> {
    let p = policy.table.get(dscp as usize)?.priority;
    u8::try_from(p).ok().filter(|p| *p < PRIORITIES)
}

/// The DSCPs whose priority the fabric depends on: the lossless ones, RoCE data's and
/// the CNPs', ascending, each with the priority the policy gives it.
pub(super) fn dscps_that_matter(policy: &Policy) -> Vec<(u8, u8)> {
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
pub(super) fn lossless_priority_mask(policy: &Policy) -> u8 {
    (0..DSCP_COUNT as u8)
        .filter(|d| policy.is_lossless(*d))
        .filter_map(|d| policy_priority(policy, d))
        .fold(0, |m, p| m | 1 << p)
}

pub(super) fn join(items: &[u8]) -> String {
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
pub(super) fn pfc_text(mask: u8) -> String {
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
pub(super) fn pfc_fix_command(ifname: &str, mask: u8) -> String {
    let map: Vec<String> = (0..PRIORITIES)
        .map(|p| format!("{p}:{}", if mask & (1 << p) != 0 { "on" } else { "off" }))
        .collect();
    format!("dcb pfc set dev {ifname} prio-pfc {}", map.join(" "))
}

/// The findings of the `dcb_app`, `pfc` and `dcb_unsupported` checks for `ifname`,
/// from what [`query`](super::query) returned.
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

#[cfg(test)]
mod tests {
    //! The checks on hand-made states.
    use super::super::test_states::{right, state};
    use super::super::{DcbApp, IeeePfc};
    use super::*;
    use roce_common::policy::ENTRY_LOSSLESS;

    const IF: &str = "eth1";
    const APP_SEL_ETHERTYPE: u8 = 1;

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
}
