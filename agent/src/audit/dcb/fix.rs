//! `check --fix` for DCB: the app entries and PFC mask the policy needs, planned from
//! the state [`query`](super::query) returned and written over dcbnl.

use roce_common::policy::Policy;

use super::check::{dscps_that_matter, join, lossless_priority_mask, pfc_fix_command, pfc_text};
use super::socket::{delete_apps, set_apps, set_pfc};
use super::{DcbApp, DcbError, DcbState, IeeePfc};
use crate::audit::Change;

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

/// The `dcb` commands (iproute2) that do what [`fix`] does over dcbnl, in its order:
/// `dcb app del dev IF dscp-prio 26:0`, `dcb app add dev IF dscp-prio 26:3`,
/// `dcb pfc set dev IF prio-pfc 0:off ... 3:on ...` (`check --dry-run`).
pub fn commands(ifname: &str, state: &DcbState, policy: &Policy) -> Vec<String> {
    let (repairs, pfc) = plan(state, policy);
    let entries = |apps: &[DcbApp]| -> String {
        apps.iter()
            .map(|a| format!("{}:{}", a.protocol, a.priority))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut out = Vec::new();
    for r in repairs {
        if !r.remove.is_empty() {
            out.push(format!(
                "dcb app del dev {ifname} dscp-prio {}",
                entries(&r.remove)
            ));
        }
        if let Some(add) = r.add {
            out.push(format!(
                "dcb app add dev {ifname} dscp-prio {}",
                entries(&[add])
            ));
        }
    }
    if let Some(new) = pfc {
        out.push(pfc_fix_command(ifname, new.enabled));
    }
    out
}

/// Makes `ifname`'s DCB state what the policy needs: the app entries of the DSCPs
/// that matter (a wrong entry of the same DSCP deleted first) and the PFC mask.
/// Returns each change made. Only for devices with DCB (`query` succeeded); needs
/// CAP_NET_ADMIN. Other DSCPs' entries (the `dcb_app` Warning) are left alone.
///
/// On an error, the changes made before it stay made (a new [`query`](super::query)
/// shows them).
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
    use super::super::test_states::{right, state};
    use super::*;

    #[test]
    fn the_dry_run_commands_are_the_fix_in_its_order() {
        assert_eq!(
            commands("eth1", &state(&[(26, 0)], Some(1 << 4)), &Policy::default()),
            [
                "dcb app add dev eth1 dscp-prio 48:6",
                "dcb app del dev eth1 dscp-prio 26:0",
                "dcb app add dev eth1 dscp-prio 26:3",
                "dcb pfc set dev eth1 prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off",
            ]
        );
    }

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
        assert!(commands("eth1", &right(), &Policy::default()).is_empty());
        let (changes, result) = fix("eth1", &right(), &Policy::default());
        assert!(changes.is_empty() && result.is_ok());
    }
}
