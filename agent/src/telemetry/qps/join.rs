//! The join of the QP table with the wire (the rules are in the module doc of
//! `telemetry::qps`): one pass over the flows, hash maps from (netdev, QPN) to the
//! QPs, no loop over QPs per flow.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::doc::qp::{Qp, QpOwner, QpWire};
use crate::doc::{Direction, Flow};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The general services QP: every port's QP 1, to which management datagrams go.
const GSI_QPN: u32 = 1;

/// What the wire showed on one interface in the flows joined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireSeen {
    /// RoCE packets counted on a flow of it that was not mirrored.
    pub roce_packets: bool,
    /// A flow of mirrored traffic (ERSPAN, GRE) counted on it.
    pub mirrored: bool,
}

/// Flows the rules could not give one QP: counted, never guessed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinCounts {
    /// Flows given an owner.
    pub joined: u64,
    /// Ingress flows whose QPN more than one local QP has on the interface (the
    /// addresses, where known, not telling them apart).
    pub ties: u64,
    /// Egress flows whose remote QPN more than one local QP has on the interface,
    /// none of them with a known remote address that matches.
    pub ambiguous: u64,
}

/// The QP table joined with the flows of one poll.
#[derive(Debug, Default)]
pub struct Joined {
    /// The QPs with `seen_on_wire` and `wire` set.
    pub qps: Vec<Qp>,
    pub owners: FlowOwners,
    pub counts: JoinCounts,
    /// What each interface's flows showed, by interface name.
    pub interfaces: BTreeMap<String, WireSeen>,
}

/// A flow as the owners' map tells flows apart on one interface: the document's key
/// less the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FlowId {
    egress: bool,
    src: IpAddr,
    dst: IpAddr,
    vni: Option<u32>,
    inner_src: Option<IpAddr>,
    inner_dst: Option<IpAddr>,
    dest_qp: u32,
}

impl FlowId {
    fn of(f: &Flow) -> FlowId {
        FlowId {
            egress: f.direction == Some(Direction::Egress),
            src: f.src,
            dst: f.dst,
            vni: f.vni,
            inner_src: f.inner_src,
            inner_dst: f.inner_dst,
            dest_qp: f.dest_qp,
        }
    }
}

/// The owner of each flow joined, found again from any record of the same flow (a
/// later poll's document, as `GET /flows` serves it).
#[derive(Debug, Default)]
pub struct FlowOwners {
    by_iface: Map<String, Map<FlowId, u32>>,
    owners: Vec<QpOwner>,
}

impl FlowOwners {
    /// The owner of `f`'s QP; None for a flow not joined and for every mirrored flow
    /// (other hosts' QPs).
    pub fn owner_of(&self, f: &Flow) -> Option<&QpOwner> {
        if f.mirror.is_some() {
            return None;
        }
        let i = self
            .by_iface
            .get(f.ifname.as_deref()?)?
            .get(&FlowId::of(f))?;
        self.owners.get(*i as usize)
    }

    /// Flows that have an owner.
    pub fn len(&self) -> usize {
        self.by_iface.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_iface.values().all(HashMap::is_empty)
    }
}

/// Interface names as small numbers, the QPs' netdevs and the flows' interfaces in
/// one numbering.
#[derive(Default)]
struct Names {
    ids: Map<String, u32>,
    names: Vec<String>,
}

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }
}

/// The QPs a key names: nearly always one.
#[derive(Clone, Debug)]
enum Hits {
    One(u32),
    Many(Vec<u32>),
}

impl Hits {
    fn push(&mut self, i: u32) {
        match self {
            Hits::One(first) => *self = Hits::Many(vec![*first, i]),
            Hits::Many(v) => v.push(i),
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            Hits::One(i) => std::slice::from_ref(i),
            Hits::Many(v) => v,
        }
    }
}

fn add<K: std::hash::Hash + Eq>(map: &mut Map<K, Hits>, key: K, i: u32) {
    match map.get_mut(&key) {
        Some(h) => h.push(i),
        None => {
            map.insert(key, Hits::One(i));
        }
    }
}

/// The QPs by (netdev, local QPN) and (netdev, remote QPN) for flows seen on the
/// QP's netdev, and by QPN alone for tunnelled flows (seen on an underlay, not on the
/// VXLAN device the QP is on).
#[derive(Default)]
struct Index {
    local: Map<(u32, u32), Hits>,
    local_any: Map<u32, Hits>,
    remote: Map<(u32, u32), Hits>,
    remote_any: Map<u32, Hits>,
}

/// What the join learns about one QP.
#[derive(Clone, Debug, Default)]
struct QpState {
    /// Its netdev's number, None when its port has no netdev (it never meets a flow).
    netdev: Option<u32>,
    /// rdma_cm's addresses, canonical.
    local: Option<IpAddr>,
    cm_remote: Option<IpAddr>,
    /// The source of the ingress flows joined to it.
    learned: Learned,
    wire: QpWire,
    /// Its index in `FlowOwners::owners` once a flow joined it.
    owner: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Learned {
    #[default]
    Nothing,
    One(IpAddr),
    /// Ingress flows from more than one address (a UD QP): no remote.
    Several,
}

impl QpState {
    /// The QP's remote address: rdma_cm's, else the one address its ingress flows
    /// came from.
    fn remote(&self) -> Option<IpAddr> {
        self.cm_remote.or(match self.learned {
            Learned::One(a) => Some(a),
            Learned::Nothing | Learned::Several => None,
        })
    }
}

/// The figures of one flow that a QP's wire sums take.
#[derive(Clone, Copy, Debug)]
struct Figures {
    packets: u64,
    bytes: u64,
    ce: u64,
    cnps: u64,
    naks: u64,
    psn_gaps: u64,
    retransmitted_packets: u64,
    retransmit_timeouts: u64,
    rtt: Option<crate::doc::Rtt>,
}

impl Figures {
    fn of(f: &Flow) -> Figures {
        Figures {
            packets: f.packets,
            bytes: f.bytes,
            ce: f.ecn.ce,
            cnps: f.cnps,
            naks: f.naks.saturating_add(f.rnr_naks),
            psn_gaps: f.psn_gaps,
            retransmitted_packets: f.retransmitted_packets,
            retransmit_timeouts: f.retransmit_timeouts,
            rtt: f.rtt,
        }
    }
}

/// An egress flow kept for the second step (after the ingress flows taught the QPs
/// their remote addresses).
struct Pending {
    iface: u32,
    id: FlowId,
    tunnelled: bool,
    local: IpAddr,
    remote: IpAddr,
    figures: Figures,
}

/// The outcome of the rules for one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Match {
    Qp(u32),
    Tie,
    Ambiguous,
    Nothing,
}

/// Joins `qps` with `flows` (any order): each QP's `seen_on_wire` and `wire`, each
/// flow's owner, the flows the rules could not give one QP, and what each interface's
/// flows showed.
pub fn join(mut qps: Vec<Qp>, flows: impl IntoIterator<Item = Flow>) -> Joined {
    let mut names = Names::default();
    let mut index = Index::default();
    let mut states: Vec<QpState> = Vec::with_capacity(qps.len());
    for (i, qp) in qps.iter().enumerate() {
        let i = i as u32;
        let netdev = qp.netdev.as_deref().map(|n| names.id(n));
        if let Some(n) = netdev {
            add(&mut index.local, (n, qp.lqpn), i);
            add(&mut index.local_any, qp.lqpn, i);
            if let Some(r) = qp.rqpn {
                add(&mut index.remote, (n, r), i);
                add(&mut index.remote_any, r, i);
            }
        }
        states.push(QpState {
            netdev,
            local: qp.src.map(|a| a.to_canonical()),
            cm_remote: qp.dst.map(|a| a.to_canonical()),
            ..QpState::default()
        });
    }

    let mut work = Work {
        qps: &qps,
        states,
        seen: Vec::new(),
        owners_by_iface: Vec::new(),
        owners: Vec::new(),
        counts: JoinCounts::default(),
    };
    let mut pending: Vec<Pending> = Vec::new();
    for f in flows {
        let Some(ifname) = f.ifname.as_deref() else {
            continue; // a capture's flow: no interface, no local QP
        };
        let iface = names.id(ifname);
        let seen = work.seen_mut(iface);
        if f.mirror.is_some() {
            // Copies of other hosts' packets: their QPs are not this host's.
            seen.mirrored = true;
            continue;
        }
        seen.roce_packets |= f.packets > 0;
        let tunnelled = f.vni.is_some();
        let (src, dst) = if tunnelled {
            match (f.inner_src, f.inner_dst) {
                (Some(s), Some(d)) => (s, d),
                _ => continue,
            }
        } else {
            (f.src, f.dst)
        };
        let (src, dst) = (src.to_canonical(), dst.to_canonical());
        match f.direction {
            Some(Direction::Ingress) => {
                let found = match_ingress(&index, &work.states, iface, tunnelled, f.dest_qp, dst);
                work.settle(found, iface, FlowId::of(&f), |state| {
                    add_figures(&mut state.wire, Figures::of(&f), false);
                    state.learned = match state.learned {
                        Learned::Nothing => Learned::One(src),
                        Learned::One(a) if a == src => Learned::One(a),
                        Learned::One(_) | Learned::Several => Learned::Several,
                    };
                });
            }
            Some(Direction::Egress) => pending.push(Pending {
                iface,
                id: FlowId::of(&f),
                tunnelled,
                local: src,
                remote: dst,
                figures: Figures::of(&f),
            }),
            None => {}
        }
    }
    let remotes = Remotes::of(&qps, &work.states);
    for p in pending {
        let found = if p.id.dest_qp == GSI_QPN {
            // Management datagrams (rdma_cm's handshake among them) go from the GSI
            // QP to the peer's QP 1, whatever the peer: the sender is this device's
            // QP 1, which has no remote QPN of its own.
            match_ingress(&index, &work.states, p.iface, p.tunnelled, GSI_QPN, p.local)
        } else {
            match_egress(&index, &remotes, &work.states, &p)
        };
        work.settle(found, p.iface, p.id, |state| {
            add_figures(&mut state.wire, p.figures, true)
        });
    }

    let Work {
        states,
        seen,
        owners_by_iface,
        owners,
        counts,
        ..
    } = work;
    let interfaces = seen
        .into_iter()
        .enumerate()
        .filter_map(|(id, s)| Some((names.name(id as u32).to_string(), s?)))
        .collect();
    let by_iface = owners_by_iface
        .into_iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(id, m)| (names.name(id as u32).to_string(), m))
        .collect();
    for (qp, state) in qps.iter_mut().zip(states) {
        let packets = state.wire.rx_packets.saturating_add(state.wire.tx_packets);
        qp.seen_on_wire = packets > 0;
        qp.wire = qp.seen_on_wire.then_some(state.wire);
    }
    Joined {
        qps,
        owners: FlowOwners { by_iface, owners },
        counts,
        interfaces,
    }
}

/// The join's state while it goes over the flows; interfaces by their number.
struct Work<'q> {
    qps: &'q [Qp],
    states: Vec<QpState>,
    /// What each interface's flows showed; None: no flow on it.
    seen: Vec<Option<WireSeen>>,
    /// The flows joined on each interface, to their owner in `owners`.
    owners_by_iface: Vec<Map<FlowId, u32>>,
    owners: Vec<QpOwner>,
    counts: JoinCounts,
}

impl Work<'_> {
    fn seen_mut(&mut self, iface: u32) -> &mut WireSeen {
        let i = iface as usize;
        if self.seen.len() <= i {
            self.seen.resize(i + 1, None);
        }
        // In range: resized above.
        let slot = &mut self.seen[i];
        slot.get_or_insert_with(WireSeen::default)
    }

    /// Counts the outcome for one flow; a flow given a QP is added to it (`add`) and
    /// to the owners' map.
    fn settle(&mut self, found: Match, iface: u32, id: FlowId, add: impl FnOnce(&mut QpState)) {
        match found {
            Match::Qp(i) => {
                let (Some(state), Some(qp)) =
                    (self.states.get_mut(i as usize), self.qps.get(i as usize))
                else {
                    return;
                };
                add(state);
                let owners = &mut self.owners;
                let slot = *state.owner.get_or_insert_with(|| {
                    owners.push(owner_of(qp));
                    (owners.len() - 1) as u32
                });
                let at = iface as usize;
                if self.owners_by_iface.len() <= at {
                    self.owners_by_iface.resize_with(at + 1, Map::default);
                }
                if let Some(m) = self.owners_by_iface.get_mut(at) {
                    m.insert(id, slot);
                }
                self.counts.joined += 1;
            }
            Match::Tie => self.counts.ties += 1,
            Match::Ambiguous => self.counts.ambiguous += 1,
            Match::Nothing => {}
        }
    }
}

fn owner_of(qp: &Qp) -> QpOwner {
    QpOwner {
        device: qp.device.clone(),
        lqpn: qp.lqpn,
        pid: qp.pid,
        comm: qp.comm.clone(),
        cgroup: qp.cgroup.clone(),
        pod_uid: qp.pod_uid.clone(),
        container_id: qp.container_id.clone(),
    }
}

fn add_figures(w: &mut QpWire, f: Figures, egress: bool) {
    w.flows += 1;
    if egress {
        w.tx_packets = w.tx_packets.saturating_add(f.packets);
        w.tx_bytes = w.tx_bytes.saturating_add(f.bytes);
        w.cnps_sent = w.cnps_sent.saturating_add(f.cnps);
        w.retransmitted_packets = w
            .retransmitted_packets
            .saturating_add(f.retransmitted_packets);
        w.retransmit_timeouts = w.retransmit_timeouts.saturating_add(f.retransmit_timeouts);
    } else {
        w.rx_packets = w.rx_packets.saturating_add(f.packets);
        w.rx_bytes = w.rx_bytes.saturating_add(f.bytes);
        w.rx_ce = w.rx_ce.saturating_add(f.ce);
        w.cnps_received = w.cnps_received.saturating_add(f.cnps);
        // The responses to this QP's requests arrive on its ingress flows.
        if let Some(r) = f.rtt {
            if w.rtt.is_none_or(|have| r.samples > have.samples) {
                w.rtt = Some(r);
            }
        }
    }
    w.naks = w.naks.saturating_add(f.naks);
    w.psn_gaps = w.psn_gaps.saturating_add(f.psn_gaps);
}

/// The QPs that may own a flow of QPN `qpn` on interface `iface`: those on it, or for
/// a tunnelled flow those on any other netdev.
fn candidates<'a>(
    on_iface: &'a Map<(u32, u32), Hits>,
    any: &'a Map<u32, Hits>,
    states: &'a [QpState],
    iface: u32,
    tunnelled: bool,
    qpn: u32,
) -> impl Iterator<Item = u32> + 'a {
    let hits = if tunnelled {
        any.get(&qpn)
    } else {
        on_iface.get(&(iface, qpn))
    };
    hits.map_or(&[][..], Hits::as_slice)
        .iter()
        .copied()
        .filter(move |&i| {
            !tunnelled || states.get(i as usize).and_then(|s| s.netdev) != Some(iface)
        })
}

/// An ingress packet's destination QP is a local QP: the one with that local QPN,
/// unless rdma_cm says the QP's address is not the packet's destination.
fn match_ingress(
    index: &Index,
    states: &[QpState],
    iface: u32,
    tunnelled: bool,
    qpn: u32,
    local: IpAddr,
) -> Match {
    let mut found = Match::Nothing;
    let cands = candidates(
        &index.local,
        &index.local_any,
        states,
        iface,
        tunnelled,
        qpn,
    );
    for i in cands {
        let Some(s) = states.get(i as usize) else {
            continue;
        };
        if s.local.is_some_and(|a| a != local) {
            continue;
        }
        found = match found {
            Match::Nothing => Match::Qp(i),
            _ => return Match::Tie,
        };
    }
    found
}

/// The local QPs by their remote address, known once the ingress flows are in:
/// (netdev, remote QPN, remote address), and (remote QPN, remote address) for
/// tunnelled flows.
#[derive(Default)]
struct Remotes {
    on_iface: Map<(u32, u32, IpAddr), Hits>,
    any: Map<(u32, IpAddr), Hits>,
    /// How many QPs of each (netdev, remote QPN), and of each remote QPN, have no
    /// known remote address.
    unknown: Map<(u32, u32), u32>,
    unknown_any: Map<u32, u32>,
}

impl Remotes {
    fn of(qps: &[Qp], states: &[QpState]) -> Remotes {
        let mut r = Remotes::default();
        for (i, (qp, s)) in qps.iter().zip(states).enumerate() {
            let (Some(netdev), Some(rqpn)) = (s.netdev, qp.rqpn) else {
                continue;
            };
            match s.remote() {
                Some(addr) => {
                    add(&mut r.on_iface, (netdev, rqpn, addr), i as u32);
                    add(&mut r.any, (rqpn, addr), i as u32);
                }
                None => {
                    *r.unknown.entry((netdev, rqpn)).or_default() += 1;
                    *r.unknown_any.entry(rqpn).or_default() += 1;
                }
            }
        }
        r
    }
}

/// An egress packet's destination QP is the remote QP of a local QP: the one whose
/// remote QPN it is and whose remote address is the packet's destination; when no
/// such QP is known, the only local QP with that remote QPN, if there is only one.
/// A QP with no known remote address has no rdma_cm addresses, so the local address
/// tells only the addressed ones apart.
fn match_egress(index: &Index, remotes: &Remotes, states: &[QpState], p: &Pending) -> Match {
    let qpn = p.id.dest_qp;
    let addressed = if p.tunnelled {
        remotes.any.get(&(qpn, p.remote))
    } else {
        remotes.on_iface.get(&(p.iface, qpn, p.remote))
    };
    let mut found = Match::Nothing;
    for &i in addressed.map_or(&[][..], Hits::as_slice) {
        let Some(s) = states.get(i as usize) else {
            continue;
        };
        if s.local.is_some_and(|a| a != p.local) || (p.tunnelled && s.netdev == Some(p.iface)) {
            continue;
        }
        found = match found {
            Match::Nothing => Match::Qp(i),
            _ => return Match::Tie,
        };
    }
    if found != Match::Nothing {
        return found;
    }
    let unknown = if p.tunnelled {
        remotes.unknown_any.get(&qpn)
    } else {
        remotes.unknown.get(&(p.iface, qpn))
    };
    if unknown.is_none_or(|n| *n == 0) {
        return Match::Nothing; // every QP with that remote QPN talks to another host
    }
    let all = if p.tunnelled {
        index.remote_any.get(&qpn)
    } else {
        index.remote.get(&(p.iface, qpn))
    };
    match all.map(Hits::as_slice) {
        Some(&[i]) => {
            let own_netdev = states.get(i as usize).and_then(|s| s.netdev) == Some(p.iface);
            if p.tunnelled && own_netdev {
                Match::Nothing
            } else {
                Match::Qp(i)
            }
        }
        _ => Match::Ambiguous,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::doc::{test_flow, Ecn, Mirror, MirrorKind};

    /// A QP of `device` on `netdev`, RC, RTS, owned by `comm`[pid 100 + lqpn].
    pub(crate) fn qp(device: &str, netdev: &str, lqpn: u32, rqpn: Option<u32>) -> Qp {
        Qp {
            device: device.to_string(),
            port: Some(1),
            lqpn,
            rqpn,
            qp_type: "RC".to_string(),
            state: "RTS".to_string(),
            sq_psn: Some(0),
            rq_psn: Some(0),
            pid: Some(100 + lqpn),
            comm: Some(format!("app{lqpn}")),
            cgroup: None,
            pod_uid: None,
            container_id: None,
            src: None,
            dst: None,
            counters: BTreeMap::new(),
            counter_id: None,
            seen_on_wire: false,
            netdev: Some(netdev.to_string()),
            src_port: None,
            dst_port: None,
            gone: false,
            wire: None,
        }
    }

    fn cm(mut q: Qp, src: &str, dst: &str) -> Qp {
        q.src = Some(src.parse().unwrap());
        q.dst = Some(dst.parse().unwrap());
        q
    }

    /// A flow on `ifname` with 10 packets of 100 bytes.
    fn flow(ifname: &str, dir: Direction, src: &str, dst: &str, qp: u32) -> Flow {
        Flow {
            direction: Some(dir),
            packets: 10,
            bytes: 1000,
            ecn: Ecn {
                ect0: 10,
                ..Ecn::default()
            },
            ..test_flow(ifname, src, dst, qp)
        }
    }

    fn ingress(ifname: &str, src: &str, dst: &str, qp: u32) -> Flow {
        flow(ifname, Direction::Ingress, src, dst, qp)
    }

    fn egress(ifname: &str, src: &str, dst: &str, qp: u32) -> Flow {
        flow(ifname, Direction::Egress, src, dst, qp)
    }

    /// (device, lqpn) of the owner of each flow, in order.
    fn owners(j: &Joined, flows: &[Flow]) -> Vec<Option<(String, u32)>> {
        flows
            .iter()
            .map(|f| j.owners.owner_of(f).map(|o| (o.device.clone(), o.lqpn)))
            .collect()
    }

    fn some(device: &str, lqpn: u32) -> Option<(String, u32)> {
        Some((device.to_string(), lqpn))
    }

    #[test]
    fn ingress_flows_join_the_qp_with_their_qpn_on_its_netdev_only() {
        let qps = vec![
            qp("rxe0", "eth1", 17, Some(18)),
            qp("rxe1", "eth2", 17, Some(40)),
        ];
        let flows = vec![
            ingress("eth1", "198.18.0.2", "198.18.0.1", 17),
            ingress("eth2", "198.18.1.2", "198.18.1.1", 17),
            // No QP 18 here; and an interface without RDMA device.
            ingress("eth1", "198.18.0.2", "198.18.0.1", 18),
            ingress("eth3", "198.18.0.2", "198.18.0.1", 17),
        ];
        let j = join(qps, flows.clone());
        assert_eq!(
            owners(&j, &flows),
            vec![some("rxe0", 17), some("rxe1", 17), None, None]
        );
        assert_eq!(
            j.counts,
            JoinCounts {
                joined: 2,
                ties: 0,
                ambiguous: 0
            }
        );
        let o = j.owners.owner_of(&flows[0]).unwrap();
        assert_eq!(
            (o.pid, o.comm.as_deref()),
            (Some(117), Some("app17")),
            "{o:?}"
        );
    }

    #[test]
    fn wire_sums_say_what_each_qp_sent_and_received() {
        let mut rx = ingress("eth1", "198.18.0.2", "198.18.0.1", 17);
        rx.ecn.ce = 3;
        rx.cnps = 2;
        rx.naks = 1;
        rx.rnr_naks = 1;
        rx.psn_gaps = 4;
        let rtt = crate::doc::Rtt {
            samples: 9,
            min_us: 10.0,
            p50_us: 12.5,
            p99_us: 40.0,
        };
        rx.rtt = Some(rtt);
        // Another ingress flow of the QP (another interface) with fewer samples.
        let mut tx = egress("eth1", "198.18.0.1", "198.18.0.2", 18);
        tx.packets = 7;
        tx.bytes = 700;
        tx.cnps = 5;
        tx.psn_gaps = 1;
        tx.retransmitted_packets = 3;
        tx.retransmit_timeouts = 1;
        let qps = vec![
            cm(qp("rxe0", "eth1", 17, Some(18)), "198.18.0.1", "198.18.0.2"),
            qp("rxe0", "eth1", 30, Some(31)),
        ];
        let j = join(qps, vec![rx, tx]);
        assert!(j.qps[0].seen_on_wire);
        assert_eq!(
            j.qps[0].wire,
            Some(QpWire {
                flows: 2,
                tx_packets: 7,
                tx_bytes: 700,
                rx_packets: 10,
                rx_bytes: 1000,
                rx_ce: 3,
                cnps_sent: 5,
                cnps_received: 2,
                naks: 2,
                psn_gaps: 5,
                retransmitted_packets: 3,
                retransmit_timeouts: 1,
                rtt: Some(rtt),
            })
        );
        // No packet of it crossed the stack: offloaded, or idle.
        assert!(!j.qps[1].seen_on_wire);
        assert_eq!(j.qps[1].wire, None);
        assert_eq!(j.counts.joined, 2);
    }

    #[test]
    fn egress_flows_join_by_remote_qpn_and_the_cm_ids_remote_address() {
        // Two QPs that talk to QP 18 of two different hosts.
        let qps = vec![
            cm(qp("rxe0", "eth1", 17, Some(18)), "198.18.0.1", "198.18.0.2"),
            cm(qp("rxe0", "eth1", 19, Some(18)), "198.18.0.1", "198.18.0.3"),
        ];
        let flows = vec![
            egress("eth1", "198.18.0.1", "198.18.0.3", 18),
            egress("eth1", "198.18.0.1", "198.18.0.2", 18),
            // A host neither QP talks to.
            egress("eth1", "198.18.0.1", "198.18.0.4", 18),
        ];
        let j = join(qps, flows.clone());
        assert_eq!(
            owners(&j, &flows),
            vec![some("rxe0", 19), some("rxe0", 17), None]
        );
        assert_eq!(
            j.counts.ambiguous, 0,
            "known addresses that differ: not ours"
        );
    }

    #[test]
    fn without_rdma_cm_the_remote_address_is_learnt_from_the_ingress_flow() {
        // Two QPs (no rdma_cm) whose peers both have QPN 18: the responses they get
        // say which peer is whose.
        let qps = vec![
            qp("rxe0", "eth1", 17, Some(18)),
            qp("rxe0", "eth1", 19, Some(18)),
        ];
        let flows = vec![
            // The egress flows come first in the document; the rules still see the
            // ingress ones first.
            egress("eth1", "198.18.0.1", "198.18.0.3", 18),
            egress("eth1", "198.18.0.1", "198.18.0.2", 18),
            ingress("eth1", "198.18.0.2", "198.18.0.1", 17),
            ingress("eth1", "198.18.0.3", "198.18.0.1", 19),
        ];
        let j = join(qps, flows.clone());
        assert_eq!(
            owners(&j, &flows),
            vec![
                some("rxe0", 19),
                some("rxe0", 17),
                some("rxe0", 17),
                some("rxe0", 19)
            ]
        );
        assert_eq!(j.counts.joined, 4);
    }

    #[test]
    fn with_neither_address_an_egress_flow_joins_only_the_one_qp_with_that_rqpn() {
        let one = vec![qp("rxe0", "eth1", 17, Some(18))];
        let flows = vec![egress("eth1", "198.18.0.1", "198.18.0.2", 18)];
        let j = join(one, flows.clone());
        assert_eq!(owners(&j, &flows), vec![some("rxe0", 17)]);

        // Two QPs with remote QPN 18 and nothing to tell them apart: counted, not
        // guessed.
        let two = vec![
            qp("rxe0", "eth1", 17, Some(18)),
            qp("rxe0", "eth1", 19, Some(18)),
        ];
        let j = join(two, flows.clone());
        assert_eq!(owners(&j, &flows), vec![None]);
        assert_eq!(
            j.counts,
            JoinCounts {
                joined: 0,
                ties: 0,
                ambiguous: 1
            }
        );
        assert!(j.qps.iter().all(|q| !q.seen_on_wire));

        // One of the two is known to talk to another host: the other is the one.
        let two = vec![
            qp("rxe0", "eth1", 17, Some(18)),
            cm(qp("rxe0", "eth1", 19, Some(18)), "198.18.0.1", "198.18.0.9"),
        ];
        let j = join(two, flows.clone());
        assert_eq!(owners(&j, &flows), vec![None], "two QPs have rqpn 18");
        assert_eq!(j.counts.ambiguous, 1);
    }

    #[test]
    fn two_qps_with_one_qpn_on_one_netdev_are_a_tie_counted_and_not_joined() {
        let qps = vec![
            qp("rxe0", "eth1", 17, Some(18)),
            qp("rxe1", "eth1", 17, Some(20)),
        ];
        let flows = vec![ingress("eth1", "198.18.0.2", "198.18.0.1", 17)];
        let j = join(qps.clone(), flows.clone());
        assert_eq!(owners(&j, &flows), vec![None]);
        assert_eq!(
            j.counts,
            JoinCounts {
                joined: 0,
                ties: 1,
                ambiguous: 0
            }
        );
        // rdma_cm's addresses tell them apart.
        let qps = vec![
            cm(qps[0].clone(), "198.18.0.1", "198.18.0.2"),
            cm(qps[1].clone(), "198.18.0.5", "198.18.0.2"),
        ];
        let j = join(qps, flows.clone());
        assert_eq!(owners(&j, &flows), vec![some("rxe0", 17)]);
        assert_eq!(j.counts.ties, 0);
    }

    /// `f` as its packets cross the underlay in VXLAN 5001: outer addresses of the
    /// VTEPs, the flow's own inside.
    fn in_vxlan(mut f: Flow, underlay: &str, outer_src: &str, outer_dst: &str) -> Flow {
        f.inner_src = Some(f.src);
        f.inner_dst = Some(f.dst);
        f.inner_family = Some(f.family);
        f.src = outer_src.parse().unwrap();
        f.dst = outer_dst.parse().unwrap();
        f.vni = Some(5001);
        f.ifname = Some(underlay.to_string());
        f
    }

    #[test]
    fn tunnelled_flows_join_on_their_inner_addresses_from_the_underlay() {
        // rxe0 sits on the VXLAN device; the agent counts on the underlay eth0.
        let qps = vec![
            cm(
                qp("rxe0", "vxlan0", 17, Some(18)),
                "198.19.0.1",
                "198.19.0.2",
            ),
            cm(
                qp("rxe0", "vxlan0", 19, Some(18)),
                "198.19.0.1",
                "198.19.0.3",
            ),
        ];
        let flows = vec![
            in_vxlan(
                ingress("x", "198.19.0.2", "198.19.0.1", 17),
                "eth0",
                "198.18.0.2",
                "198.18.0.1",
            ),
            in_vxlan(
                egress("x", "198.19.0.1", "198.19.0.3", 18),
                "eth0",
                "198.18.0.1",
                "198.18.0.3",
            ),
            // To an inner address no QP has.
            in_vxlan(
                ingress("x", "198.19.0.2", "198.19.0.7", 17),
                "eth0",
                "198.18.0.2",
                "198.18.0.1",
            ),
        ];
        let j = join(qps.clone(), flows.clone());
        assert_eq!(
            owners(&j, &flows),
            vec![some("rxe0", 17), some("rxe0", 19), None]
        );
        // A tunnelled flow on the QP's own netdev is not its (the QP's packets
        // cross that netdev unencapsulated).
        let on_own = vec![in_vxlan(
            ingress("x", "198.19.0.2", "198.19.0.1", 17),
            "vxlan0",
            "198.18.0.2",
            "198.18.0.1",
        )];
        let j = join(qps, on_own.clone());
        assert_eq!(owners(&j, &on_own), vec![None]);
    }

    #[test]
    fn mirrored_flows_never_join_and_mark_their_interface() {
        let qps = vec![qp("rxe0", "eth1", 17, Some(18))];
        let mut m = ingress("eth1", "198.18.0.2", "198.18.0.1", 17);
        m.mirror = Some(Mirror {
            kind: MirrorKind::Erspan2,
            session: 7,
            source: "198.18.9.9".parse().unwrap(),
        });
        let j = join(qps, vec![m.clone()]);
        assert_eq!(owners(&j, &[m]), vec![None]);
        assert_eq!(j.counts.joined, 0);
        assert_eq!(
            j.interfaces["eth1"],
            WireSeen {
                roce_packets: false,
                mirrored: true
            }
        );
        assert!(!j.qps[0].seen_on_wire);
    }

    #[test]
    fn interfaces_say_whether_roce_packets_crossed_them() {
        let mut idle = ingress("eth2", "198.18.0.2", "198.18.0.1", 5);
        idle.packets = 0;
        let j = join(
            Vec::new(),
            vec![ingress("eth1", "198.18.0.2", "198.18.0.1", 5), idle],
        );
        assert!(j.interfaces["eth1"].roce_packets);
        assert!(!j.interfaces["eth2"].roce_packets);
        assert!(!j.interfaces.contains_key("eth3"));
    }

    #[test]
    fn owners_are_found_again_from_a_later_record_of_the_flow() {
        let qps = vec![qp("rxe0", "eth1", 17, Some(18))];
        let f = ingress("eth1", "198.18.0.2", "198.18.0.1", 17);
        let j = join(qps, vec![f.clone()]);
        let mut later = f.clone();
        later.packets = 99;
        later.rates = None;
        assert_eq!(j.owners.owner_of(&later).map(|o| o.lqpn), Some(17));
        // Another direction, interface or QPN is another flow.
        let mut other = f.clone();
        other.direction = Some(Direction::Egress);
        assert!(j.owners.owner_of(&other).is_none());
        let mut other = f;
        other.ifname = Some("eth2".into());
        assert!(j.owners.owner_of(&other).is_none());
        assert_eq!(j.owners.len(), 1);
    }

    /// `n` QPs on 4 netdevs (RC, rdma_cm for every other one) and for each an ingress
    /// and an egress flow, plus flows of no QP.
    fn large(n: u32, extra: u32) -> (Vec<Qp>, Vec<Flow>) {
        let addr = |host: u32| format!("198.18.{}.{}", (host >> 8) & 255, host & 255);
        let mut qps = Vec::new();
        let mut flows = Vec::new();
        for i in 0..n {
            let netdev = format!("eth{}", i % 4);
            let (lqpn, rqpn) = (1000 + i, 500_000 + i % 7);
            let peer = addr(1 + i % 5000);
            let mut q = qp("mlx5_0", &netdev, lqpn, Some(rqpn));
            if i % 2 == 0 {
                q = cm(q, "198.19.0.1", &peer);
            }
            qps.push(q);
            flows.push(ingress(&netdev, &peer, "198.19.0.1", lqpn));
            flows.push(egress(&netdev, "198.19.0.1", &peer, rqpn));
        }
        for i in 0..extra {
            flows.push(ingress("eth9", &addr(i), "198.19.0.1", i));
        }
        (qps, flows)
    }

    #[test]
    fn management_datagrams_sent_to_qp_1_belong_to_the_local_gsi_qp() {
        let mut gsi = qp("rxe0", "eth1", 1, None);
        gsi.qp_type = "GSI".into();
        gsi.pid = None;
        gsi.comm = Some("ib_core".into());
        let other = qp("rxe1", "eth2", 1, None);
        let flows = vec![
            egress("eth1", "198.18.0.1", "198.18.0.2", 1),
            egress("eth1", "198.18.0.1", "198.18.0.3", 1),
            ingress("eth1", "198.18.0.2", "198.18.0.1", 1),
        ];
        let j = join(vec![gsi, other], flows.clone());
        for f in &flows {
            let owner = j.owners.owner_of(f).map(|o| (o.device.as_str(), o.lqpn));
            assert_eq!(owner, Some(("rxe0", 1)), "{f:?}");
        }
        assert_eq!(j.counts.joined, 3);
        assert_eq!(j.qps[0].wire.as_ref().map(|w| w.tx_packets > 0), Some(true));
        assert!(!j.qps[1].seen_on_wire);
    }

    #[test]
    fn a_large_table_joins_every_flow_to_its_qp() {
        let (qps, flows) = large(2000, 1000);
        let j = join(qps, flows.clone());
        for (k, f) in flows.iter().take(4000).enumerate() {
            let want = 1000 + (k as u32) / 2;
            assert_eq!(
                j.owners.owner_of(f).map(|o| o.lqpn),
                Some(want),
                "flow {k}: {f:?}"
            );
        }
        assert_eq!(j.counts.joined, 4000);
        assert_eq!((j.counts.ties, j.counts.ambiguous), (0, 0));
        assert!(j.qps.iter().all(|q| q.seen_on_wire));
    }
}
