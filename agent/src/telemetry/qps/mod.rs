//! The host's QP table (RDMA netlink, read by `crate::rdma`) joined with the wire: which
//! flow belongs to which local queue pair, what each QP sent and received as XDP and
//! tc counted it, which QPs never showed on the wire (offloaded), and what the agent
//! can see of RoCE on each interface. What `GET /qps`, the owners of `GET /flows`,
//! the `roce_qp_*` and `roce_visibility` metrics and `top` show.
//!
//! The join's rules (`join`):
//! - A flow is joined on the netdev of the QP's port: a flow counted on interface N
//!   can only belong to a QP whose port's netdev is N (one netdev per RoCE port).
//! - An INGRESS flow is packets to a local QP: its destination QP is the QP's local
//!   QPN. Local QPNs are unique per device; should two QPs on N share one (two
//!   devices on one netdev, which rxe and mlx5 never make), the addresses of rdma_cm
//!   (the QP's local address must be the packet's destination) tell them apart, else
//!   the flow is a tie: counted, not joined.
//! - An EGRESS flow is packets a local QP sent: its destination QP is the QP's remote
//!   QPN AND its destination address is the QP's remote address. The remote address
//!   is rdma_cm's destination when rdma_cm made the QP, else the source of the
//!   ingress flows already joined to the QP (a request's responder answers from its
//!   address; a QP whose ingress flows come from several addresses, a UD QP, has
//!   none). When no QP with that remote QPN has the destination as its remote
//!   address, the flow joins only if exactly one QP on N has that remote QPN and its
//!   remote address is unknown; when several have it, the flow is ambiguous: counted,
//!   never guessed.
//! - An EGRESS flow to QP 1 is management datagrams (rdma_cm's handshake among
//!   them), which a device sends from its own QP 1, the GSI QP, to any peer: it joins
//!   the local QP 1 on N.
//! - A flow in VXLAN is counted on the underlay, not on the VXLAN device the QP is
//!   on: it is joined by the same rules on its inner addresses, among the QPs of every
//!   netdev but the one it was counted on.
//! - A flow of mirrored traffic (ERSPAN, GRE) is a copy of other hosts' packets: never
//!   joined.
//!
//! A QP is `seen_on_wire` when the flows joined to it counted packets; its `wire` is
//! their sums (sent: the egress flows; received: the ingress ones). The join is one
//! pass over the flows with hash maps keyed by (netdev, QPN), no loop over the QPs per
//! flow: a whole refresh at 10,000 QPs and 100,000 flows stays well inside 100 ms
//! (bench line `qp_table_10k`, BENCHMARKS.md).
//!
//! The parts: `join` (the rules, pure), `visibility` (the mode of each interface from
//! the evidence since the start, pure decision), and here [`QpRounds`], which makes
//! one [`QpView`] per refresh of the table.

pub mod join;
pub mod visibility;

use crate::doc::qp::{Qp, QpDocument, RdmaPort};
use crate::telemetry::live::LiveDocument;

pub use join::{join, FlowOwners, JoinCounts, Joined, WireSeen};
pub use visibility::{decide, Change, Evidence, Mode, Tracker, Watched};

/// What the agent serves of the QP table after a refresh.
#[derive(Debug, Default)]
pub struct QpView {
    /// `GET /qps`: the table joined with the flows of the same poll.
    pub document: QpDocument,
    /// The owner of each flow joined (`GET /flows`).
    pub owners: FlowOwners,
    pub counts: JoinCounts,
    /// The mode of each watched interface.
    pub visibility: Vec<(String, Mode)>,
}

/// One refresh of the QP table as read: the QPs and ports, or why they could not be
/// read.
#[derive(Debug)]
pub enum TableRead {
    Read {
        qps: Vec<Qp>,
        ports: Vec<RdmaPort>,
    },
    /// The host has no RDMA subsystem: an empty table, no error.
    NoRdma,
    Failed(String),
}

/// Makes a [`QpView`] of each refresh, keeping the visibility evidence between them.
#[derive(Debug, Default)]
pub struct QpRounds {
    tracker: Tracker,
}

impl QpRounds {
    /// The view of one refresh joined with `flows` (the poll it follows), and the
    /// interfaces whose visibility is to be reported. Blocking: a pass over every
    /// flow.
    pub fn round(
        &mut self,
        read: TableRead,
        flows: &LiveDocument,
        watched: &Watched,
    ) -> (QpView, Vec<Change>) {
        let (qps, ports, error) = match read {
            TableRead::Read { qps, ports } => (qps, ports, None),
            TableRead::NoRdma => (Vec::new(), Vec::new(), None),
            TableRead::Failed(e) => (Vec::new(), Vec::new(), Some(e)),
        };
        let joined = join(qps, flows.flows());
        let changes = self.tracker.observe(watched, &joined.interfaces, &ports);
        let view = QpView {
            document: QpDocument {
                qps: joined.qps,
                ports,
                error,
            },
            owners: joined.owners,
            counts: joined.counts,
            visibility: self.tracker.modes(watched),
        };
        (view, changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{test_flow, Direction, Document};

    #[test]
    fn a_round_joins_the_table_with_the_poll_and_keeps_the_evidence() {
        let mut q = join::tests::qp("rxe0", "eth1", 17, Some(18));
        q.counters.insert("rx_write_requests".into(), 5);
        let flows = LiveDocument::from(Document {
            flows: vec![crate::doc::Flow {
                packets: 3,
                ..test_flow("eth1", "198.18.0.2", "198.18.0.1", 17)
            }],
            ..Document::default()
        });
        let watched = Watched {
            interfaces: vec!["eth1".into(), "eth2".into()],
            mirrors: Vec::new(),
        };
        let mut rounds = QpRounds::default();
        let read = || TableRead::Read {
            qps: vec![q.clone()],
            ports: Vec::new(),
        };
        let (view, changes) = rounds.round(read(), &flows, &watched);
        assert!(changes.is_empty(), "reported after the first interval");
        assert_eq!(view.document.qps.len(), 1);
        assert!(view.document.qps[0].seen_on_wire);
        assert_eq!(view.document.error, None);
        assert_eq!(view.counts.joined, 1);
        assert_eq!(
            view.visibility,
            vec![
                ("eth1".to_string(), Mode::KernelPath),
                ("eth2".to_string(), Mode::None)
            ]
        );
        let (_, changes) = rounds.round(read(), &flows, &watched);
        assert_eq!(changes.len(), 2);
        // A table that could not be read says why and has no QPs; the evidence of
        // the earlier rounds stays.
        let (view, changes) = rounds.round(
            TableRead::Failed("RDMA netlink: Permission denied".into()),
            &LiveDocument::default(),
            &watched,
        );
        assert!(changes.is_empty());
        assert!(view.document.qps.is_empty());
        assert_eq!(
            view.document.error.as_deref(),
            Some("RDMA netlink: Permission denied")
        );
        assert_eq!(view.visibility[0], ("eth1".to_string(), Mode::KernelPath));
        let (view, _) = rounds.round(TableRead::NoRdma, &flows, &watched);
        assert_eq!(view.document.error, None);
    }

    /// The table as `crate::rdma` reads it from replies encoded as the kernel sends
    /// them: two mlx5 devices, mlx5_0 on eth0 (QPs 0x100 and 0x102, rdma_cm's) whose
    /// port counters move while XDP sees nothing, mlx5_1 on eth1 (QPs 0x101 and 0x103,
    /// no rdma_cm) whose QP 0x101 talks to 198.18.2.9 through the kernel's stack.
    #[test]
    fn offloaded_and_kernel_path_devices_from_synthetic_netlink_replies() {
        use crate::rdma::netlink::decode::PortCountersRecord;
        use crate::rdma::netlink::synthetic::SynthHost;
        use crate::rdma::{QpTable, QpTableOptions};

        let mut host = SynthHost::many_qps(4, None);
        let mut table = QpTable::new(QpTableOptions::default());
        let flow = |dir, src: &str, dst: &str, qp: u32| crate::doc::Flow {
            direction: Some(dir),
            packets: 8,
            bytes: 800,
            ..test_flow("eth1", src, dst, qp)
        };
        let flows = LiveDocument::from(Document {
            flows: vec![
                flow(Direction::Ingress, "198.18.2.9", "198.18.0.7", 0x101),
                flow(Direction::Egress, "198.18.0.7", "198.18.2.9", 0x20_0001),
            ],
            ..Document::default()
        });
        let watched = Watched {
            interfaces: vec!["eth0".into(), "eth1".into()],
            mirrors: Vec::new(),
        };
        let mut rounds = QpRounds::default();
        let mut read = |host: &SynthHost| {
            let snapshot = table.refresh_from(&host.dump()).unwrap();
            TableRead::Read {
                qps: snapshot.qps,
                ports: snapshot.ports,
            }
        };
        let moved = |host: &mut SynthHost, v: u64| {
            host.devices[0].port_counters = vec![PortCountersRecord {
                device_index: 1,
                device: "mlx5_0".into(),
                port: 1,
                hwcounters: vec![("rx_write_requests".into(), v)],
            }];
        };
        moved(&mut host, 10);
        let (view, _) = rounds.round(read(&host), &flows, &watched);
        assert_eq!(view.document.qps.len(), 4);
        moved(&mut host, 25);
        let (view, changes) = rounds.round(read(&host), &flows, &watched);
        assert_eq!(
            changes,
            vec![
                Change {
                    ifname: "eth0".into(),
                    before: None,
                    now: Mode::Offloaded
                },
                Change {
                    ifname: "eth1".into(),
                    before: None,
                    now: Mode::KernelPath
                }
            ]
        );
        let seen: Vec<(String, u32, bool)> = view
            .document
            .qps
            .iter()
            .map(|q| (q.device.clone(), q.lqpn, q.seen_on_wire))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("mlx5_0".to_string(), 0x100, false),
                ("mlx5_0".to_string(), 0x102, false),
                ("mlx5_1".to_string(), 0x101, true),
                ("mlx5_1".to_string(), 0x103, false),
            ]
        );
        let wire = view.document.qps[2].wire.clone().unwrap();
        assert_eq!(
            (wire.flows, wire.tx_packets, wire.rx_packets),
            (2, 8, 8),
            "the egress flow joined through the address its responses came from"
        );
        // rdma_cm's addresses came through.
        assert_eq!(
            view.document.qps[0].dst,
            Some("198.18.1.2".parse().unwrap())
        );
        let doc = flows.to_document();
        for f in &doc.flows {
            assert_eq!(
                view.owners.owner_of(f).map(|o| o.lqpn),
                Some(0x101),
                "{f:?}"
            );
        }
    }
}
