//! Overlay against underlay (VXLAN): a CE mark the underlay put on the outer header
//! must reach the inner packet when the VTEP decapsulates, or the receiver's RNIC never
//! sees it. RFC 6040 (and Linux) carry outer CE into an ECN-capable inner header; over
//! a Not-ECT inner header there is nothing to carry it in, and Linux drops the packet
//! (`ip_tunnel_ecn_decapsulate`): the mark and the packet are both lost. The `--vtep`
//! ingress program counts such packets per remote VTEP and VNI (`counters.qos.vteps`:
//! `ce_over_not_ect`); a window with any is `inner_ce_lost` of that VNI.

use std::collections::BTreeMap;

use super::Window;
use crate::doc::finding::{Finding, Severity};
use crate::doc::VtepRecord;

/// Per remote VTEP and VNI: packets, and outer CE over inner Not-ECT.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    remotes: BTreeMap<(String, u32), (u64, u64)>,
}

impl Totals {
    pub fn of(vteps: &[VtepRecord]) -> Totals {
        Totals {
            remotes: vteps
                .iter()
                .map(|v| ((v.remote.clone(), v.vni), (v.packets, v.ce_over_not_ect)))
                .collect(),
        }
    }
}

/// `inner_ce_lost` for every remote VTEP and VNI whose packets in the window (since
/// `before`) brought outer CE over an inner Not-ECT header.
pub fn inner_ce_lost(now: &Totals, before: &Totals, window: Window) -> Vec<Finding> {
    let mut out = Vec::new();
    for ((remote, vni), (packets, lost)) in &now.remotes {
        let (p0, l0) = before
            .remotes
            .get(&(remote.clone(), *vni))
            .copied()
            .unwrap_or((0, 0));
        let (packets, lost) = (packets.saturating_sub(p0), lost.saturating_sub(l0));
        if lost == 0 {
            continue;
        }
        out.push(Finding {
            check: "inner_ce_lost".to_string(),
            interface: None,
            severity: Severity::Error,
            found: format!(
                "{lost} of {packets} VXLAN packets from VTEP {remote} (vni {vni}) {window} had CE on the outer header over a Not-ECT inner one: decapsulation dropped them, mark and packet"
            ),
            expected: "inner packets that are ECN-capable (ECT), so that decapsulation carries an underlay CE mark into them (RFC 6040)".to_string(),
            fix: format!(
                "make the traffic behind VTEP {remote} in VNI {vni} ECN-capable (RoCE: ECT(0), the RNIC's ECN on; other traffic on this path: off the ECN-marked queues), or stop the underlay marking traffic that is not"
            ),
            flows: None,
            flow_keys: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn vtep(packets: u64, lost: u64) -> Vec<VtepRecord> {
        vec![VtepRecord {
            remote: "198.19.0.1".into(),
            vni: 5001,
            packets,
            ce_over_not_ect: lost,
            ..VtepRecord::default()
        }]
    }

    #[test]
    fn outer_ce_over_not_ect_in_the_window_is_lost_and_earlier_losses_are_not_judged_again() {
        let w = Window::Live(Duration::from_secs(5));
        let found = inner_ce_lost(&Totals::of(&vtep(100, 3)), &Totals::default(), w);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].severity, Severity::Error);
        assert!(
            found[0].found.starts_with(
                "3 of 100 VXLAN packets from VTEP 198.19.0.1 (vni 5001) in the last 5.0 s"
            ),
            "{}",
            found[0].found
        );
        let before = Totals::of(&vtep(100, 3));
        assert!(inner_ce_lost(&Totals::of(&vtep(500, 3)), &before, w).is_empty());
        assert_eq!(
            inner_ce_lost(&Totals::of(&vtep(500, 4)), &before, w).len(),
            1
        );
        // Another VNI of the same VTEP is judged on its own: its losses are new.
        let mut two = vtep(500, 3);
        two.push(VtepRecord {
            vni: 5002,
            ..two[0].clone()
        });
        let found = inner_ce_lost(&Totals::of(&two), &before, w);
        assert_eq!(found.len(), 1);
        assert!(found[0].found.contains("(vni 5002)"), "{}", found[0].found);
    }
}
