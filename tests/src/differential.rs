//! Differential runs: every generated frame (`crate::gen`) goes through the real
//! programs (BPF_PROG_TEST_RUN) and through the pure reference, and the two must agree.
//!
//! - `xdp_classify` against `ReferenceTable`: verdict XDP_PASS, bytes unchanged, and
//!   after every batch the STATS vector and the whole FLOWS table (timestamps aside;
//!   `expect::modelled_stats` names the counters the reference does not keep).
//! - `xdp_mirror` against `ReferenceTable::with_mirrors`, on mirror copies (GRE, ERSPAN
//!   II/III, cut, mutated: `gen::mirror_copy`) of the same frames: the same, and the
//!   mirrored flows with their sessions.
//! - `tc_egress` with the host policy in audit mode, in enforce mode, on a VTEP
//!   underlay, and on a VTEP underlay in enforce mode (RFC 6040), each in an object
//!   of its own (the test interface configured once): per frame the verdict
//!   (TC_NEXT: the programs never drop), the output bytes (`policy::apply`: the DSCP/ECN
//!   rewrite and its RFC 1624 checksum update), skb->priority (through the `__sk_buff`
//!   context); a valid IPv4 header checksum stays valid; after every batch STATS
//!   (the QoS counters `policy::action_stats` names, nothing else) and the egress flows
//!   (the reference classifier over the bytes the reference wrote).
//! - `tc_ingress` on a VTEP underlay: verdict, bytes and priority unchanged, STATS
//!   (`policy::decap_stats`) and the VTEPS table (`VtepStats::record`).
//!
//! A disagreement does not stop the run: it is recorded (the lane, the batch, the
//! first frame that shows it, in hex) and the next batch starts from empty maps.
//! A table that differs at the end of a batch is narrowed down by replaying the
//! batch one frame at a time. `tests/tests/differential.rs` runs 100,000 frames in
//! `cargo xtask test`; `cargo xtask fuzz` (`roce-fuzz`) runs a million.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roce_agent::datapath::loader::{LoadOptions, TC_EGRESS, TC_INGRESS};
use roce_common::config::RuntimeConfig;
use roce_common::counters::{STATS_LEN, STAT_FLOW_CREATED};
use roce_common::flow::FlowStats;
use roce_common::key::{FlowKey, FlowKeyMirror, KEY_EGRESS};
use roce_common::packet::SlicePacket;
use roce_common::parsed::Outcome;
use roce_common::policy::{
    action_stats, apply, decap_check, decap_stats, ipv4_checksum, DscpEntry, IfaceQos, Kind,
    Policy, VtepKey, VtepStats, ECN_KERNEL, ECN_RFC6040, HOST_AUDIT, HOST_ENFORCE, HOST_OFF,
};
use roce_common::reference::ReferenceTable;
use roce_testkit::frame::{roce_frame_to, Eth, RoceMsg, L3};

use crate::expect::{compare_with_reference, describe, modelled_stats, untimed};
use crate::gen::{Gen, Sample};
use crate::harness::{Harness, XDP_PASS};
use crate::hex;
use crate::tc::{refuses_skb_test_run, TcHarness, TC_NEXT, TEST_RUN_IFINDEX};

/// Frames between two comparisons of the tables.
pub const BATCH: usize = 500;

/// skb->priority on the way into the tc programs: not 0, so that "left alone" shows.
pub const PRIO_IN: u32 = 0x1234;

/// Disagreements kept in full (the count goes on).
const KEEP: usize = 10;

/// What one run compares.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// The policy (and runtime config) the kernel objects are loaded with.
    pub policy: Policy,
    /// The policy the reference computes with: `policy` unless a test asks for a
    /// deliberately wrong reference, to show that a disagreement is caught.
    pub reference_policy: Policy,
    /// Run the tc lanes too (the XDP lane always runs).
    pub tc: bool,
}

impl DiffOptions {
    pub fn new(policy: Policy) -> Self {
        DiffOptions {
            policy,
            reference_policy: policy,
            tc: true,
        }
    }
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions::new(Policy::default())
    }
}

/// One place where kernel and reference parted.
#[derive(Clone, Debug)]
pub struct Disagreement {
    /// `xdp`, `tc_egress/audit`, ...
    pub lane: &'static str,
    pub batch: u64,
    /// The first frame that shows it, by its place in the batch, when known.
    pub index: Option<usize>,
    pub frame: Vec<u8>,
    pub detail: String,
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => writeln!(
                f,
                "{}: batch {}, frame #{i} of the batch ({} bytes):",
                self.lane,
                self.batch,
                self.frame.len()
            )?,
            None => writeln!(f, "{}: batch {}:", self.lane, self.batch)?,
        }
        write!(f, "{}{}", hex(&self.frame), self.detail)
    }
}

/// Per-frame figures of one tc lane.
#[derive(Clone, Debug, Default)]
pub struct LaneTotals {
    /// Frames by the decision's kind (`Kind` as Debug text), egress lanes.
    pub kinds: BTreeMap<String, u64>,
    /// Frames whose bytes the reference changed.
    pub rewritten: u64,
    /// Frames whose skb->priority the reference set.
    pub priority_set: u64,
    /// VXLAN frames checked, ingress lane.
    pub decap_checked: u64,
    /// Frames BPF_PROG_TEST_RUN refuses for tc programs (`tc::refuses_skb_test_run`:
    /// an IP EtherType without a whole IP header), not run in this lane.
    pub refused: u64,
    /// STATS summed over the batches (the reference's).
    pub stats: Vec<u64>,
    /// Egress flows created (the reference's), summed over the batches.
    pub flows: u64,
}

/// What the flows of all batches counted, to show the run exercised every counter.
#[derive(Debug, Default, Clone)]
pub struct FlowTotals {
    pub packets: u64,
    pub cnps: u64,
    pub acks: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub psn_gaps: u64,
    pub retransmitted_packets: u64,
    pub retransmit_timeouts: u64,
    /// Go-backs that a NAK asked for (found in the NAK memory).
    pub naks_answered: u64,
    pub inner_ce: u64,
    pub pmtu_learnt: u64,
}

impl FlowTotals {
    fn add(&mut self, r: &ReferenceTable) {
        for s in r.flows.values() {
            self.packets += s.packets;
            self.cnps += s.cnps;
            self.acks += s.acks;
            self.naks += s.naks;
            self.rnr_naks += s.rnr_naks;
            self.psn_gaps += s.psn_gaps;
            self.retransmitted_packets += s.retransmitted_packets;
            self.retransmit_timeouts += s.retransmit_timeouts;
            self.inner_ce += s.inner_ecn[3];
            self.pmtu_learnt += (s.psn.pmtu_log2 != 0) as u64;
        }
        self.naks_answered += r.naks.taken;
    }
}

/// The result of a run so far.
#[derive(Debug, Clone)]
pub struct Report {
    pub seed: u64,
    pub packets: u64,
    /// The reference's STATS of the XDP lane, summed over the batches: frames per
    /// class and per parse-error reason.
    pub xdp_stats: Vec<u64>,
    /// The same of the mirror lane (`xdp_mirror` on copies of the frames).
    pub mirror_stats: Vec<u64>,
    /// Mirrored flows the mirror lane's reference made, summed over the batches.
    pub mirrored_flows: u64,
    pub flows: FlowTotals,
    /// BTH opcodes of the frames the classifier took for RoCE.
    pub opcodes: BTreeSet<u8>,
    pub lanes: Vec<(&'static str, LaneTotals)>,
    /// Disagreements found (each frame or table that differed counts once).
    pub disagreements: u64,
    /// The first `KEEP` of them.
    pub first: Vec<Disagreement>,
    pub elapsed: Duration,
}

impl Report {
    pub fn packets_per_s(&self) -> f64 {
        self.packets as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The first disagreement in full, with the seed that reproduces it.
    pub fn first_disagreement(&self) -> Option<String> {
        self.first.first().map(|d| {
            format!(
                "seed {} (ROCE_DIFF_SEED={} to replay): {} disagreement(s); the first:\n{d}",
                self.seed, self.seed, self.disagreements
            )
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} packets, {} disagreements, {:.2?} ({:.0} packets/s)",
            self.seed,
            self.packets,
            self.disagreements,
            self.elapsed,
            self.packets_per_s()
        )?;
        writeln!(f, "  xdp counters: {}", describe(&self.xdp_stats))?;
        writeln!(
            f,
            "  xdp_mirror counters: {}; mirrored flows {}",
            describe(&self.mirror_stats),
            self.mirrored_flows
        )?;
        writeln!(
            f,
            "  xdp flows: {:?}; {} BTH opcodes seen",
            self.flows,
            self.opcodes.len()
        )?;
        for (name, t) in &self.lanes {
            writeln!(
                f,
                "  {name}: kinds {:?}, rewritten {}, priority set {}, decap checked {}, egress flows {}, refused by the test run {}\n    counters: {}",
                t.kinds,
                t.rewritten,
                t.priority_set,
                t.decap_checked,
                t.flows,
                t.refused,
                describe(&t.stats)
            )?;
        }
        Ok(())
    }
}

/// A policy unlike the default in every table the programs read.
pub fn other_policy() -> Policy {
    let mut p = Policy::default();
    p.qos.roce_dscp = 24;
    p.qos.cnp_dscp = 56;
    p.qos.remark_dscp = 8;
    p.set_lossless(&[24, 46, 0]);
    p.table[24].priority = 4;
    p.table[56].priority = 7;
    p.table[10] = DscpEntry {
        priority: 2,
        vtep_outer: 26,
        flags: 0,
        _pad: [0; 2],
    };
    p.config.roce_port = 4792;
    p.config.vxlan_port = 8472;
    p.config.default_pmtu_log2 = 10;
    p
}

/// The interface modes of the tc lanes, each loaded in an object of its own.
pub fn tc_lanes() -> Vec<(&'static str, &'static str, IfaceQos)> {
    let iface = |host, vtep, ecn| IfaceQos {
        host,
        vtep,
        ecn,
        _pad: 0,
    };
    vec![
        (
            "tc_egress/audit",
            TC_EGRESS,
            iface(HOST_AUDIT, 0, ECN_KERNEL),
        ),
        (
            "tc_egress/enforce",
            TC_EGRESS,
            iface(HOST_ENFORCE, 0, ECN_KERNEL),
        ),
        ("tc_egress/vtep", TC_EGRESS, iface(HOST_OFF, 1, ECN_KERNEL)),
        (
            "tc_egress/vtep_enforce_rfc6040",
            TC_EGRESS,
            iface(HOST_ENFORCE, 1, ECN_RFC6040),
        ),
        (
            "tc_ingress/vtep",
            TC_INGRESS,
            iface(HOST_OFF, 1, ECN_KERNEL),
        ),
    ]
}

/// One tc program in one interface mode, and what the reference expects of it in the
/// current batch.
struct TcLane {
    name: &'static str,
    program: &'static str,
    mode: IfaceQos,
    h: TcHarness,
    reference: Policy,
    want_stats: Vec<u64>,
    /// Egress flows: the reference classifier over the bytes the reference wrote.
    flows: ReferenceTable,
    vteps: BTreeMap<VtepKey, VtepStats>,
    totals: LaneTotals,
}

impl TcLane {
    fn new(name: &'static str, program: &'static str, mode: IfaceQos, o: &DiffOptions) -> Self {
        TcLane {
            name,
            program,
            mode,
            h: TcHarness::load(&o.policy, mode),
            reference: o.reference_policy,
            want_stats: vec![0; STATS_LEN as usize],
            flows: ReferenceTable::new(o.reference_policy.config),
            vteps: BTreeMap::new(),
            totals: LaneTotals {
                stats: vec![0; STATS_LEN as usize],
                ..LaneTotals::default()
            },
        }
    }

    fn reset(&mut self) {
        self.h.reset();
        self.want_stats.iter_mut().for_each(|v| *v = 0);
        self.flows = ReferenceTable::new(self.reference.config);
        self.vteps.clear();
    }

    /// Runs one frame through the program and the reference; Err says how the output
    /// of this frame differs (the tables are compared by `check_tables`).
    fn step(&mut self, frame: &[u8]) -> Result<(), String> {
        let out = match self.h.try_run_on(self.program, frame, PRIO_IN, 0) {
            Ok(out) => out,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && refuses_skb_test_run(frame) => {
                self.totals.refused += 1;
                return Ok(());
            }
            Err(e) => return Err(format!("BPF_PROG_TEST_RUN failed: {e}")),
        };
        let mut expected = frame.to_vec();
        let mut priority = PRIO_IN;
        if self.program == TC_INGRESS {
            if self.mode.vtep != 0 {
                let check = decap_check(
                    &SlicePacket(frame),
                    &self.reference.config,
                    &self.reference.table,
                );
                if let Some(c) = check {
                    self.totals.decap_checked += 1;
                    for s in decap_stats(&c).into_iter().flatten() {
                        self.want_stats[s as usize] += 1;
                    }
                    self.vteps.entry(c.remote).or_default().record(&c);
                }
            }
        } else {
            let action = apply(&mut expected, &self.reference, &self.mode);
            *self
                .totals
                .kinds
                .entry(format!("{:?}", action.kind))
                .or_default() += 1;
            for s in action_stats(&action).into_iter().flatten() {
                self.want_stats[s as usize] += 1;
            }
            if let Some(p) = action.sets_priority() {
                priority = p;
                self.totals.priority_set += 1;
            }
            if action.writes() {
                self.totals.rewritten += 1;
                if let Some(e) = checksum_broken(frame, &expected, action.l3, action.v6) {
                    return Err(format!("the reference broke a valid checksum: {e}"));
                }
            }
            // tc_egress tail-calls the flow counter for RoCE on the --iface interfaces.
            if action.roce && self.mode.counts_flows() {
                self.flows.process(&expected, TEST_RUN_IFINDEX, 0);
            }
            if action.kind == Kind::Untouched && expected != frame {
                return Err("the reference changed an untouched frame".to_string());
            }
        }
        let mut why = Vec::new();
        if out.retval != TC_NEXT {
            why.push(format!(
                "verdict {} (expected TC_NEXT {})",
                out.retval as i32, TC_NEXT as i32
            ));
        }
        if out.data != expected {
            why.push(format!(
                "output bytes differ\n  kernel:\n{}  reference:\n{}",
                hex(&out.data),
                hex(&expected)
            ));
        }
        if out.priority != priority {
            why.push(format!(
                "skb->priority {:#x} (reference {priority:#x})",
                out.priority
            ));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }

    /// The reference's egress flows as the kernel keys them.
    fn want_flows(&self) -> BTreeMap<FlowKey, FlowStats> {
        self.flows
            .flows
            .iter()
            .map(|(k, v)| {
                let mut k = *k;
                k.flags |= KEY_EGRESS;
                (k, untimed(*v))
            })
            .collect()
    }

    fn want_stats(&self) -> Vec<u64> {
        let mut want = self.want_stats.clone();
        want[STAT_FLOW_CREATED as usize] += self.flows.stats[STAT_FLOW_CREATED as usize];
        want
    }

    /// STATS, egress flows and VTEPS against the reference's.
    fn check_tables(&self) -> Result<(), String> {
        let (got, want) = (modelled_stats(&self.h.stats()), self.want_stats());
        if got != want {
            return Err(format!(
                "STATS differ\n  kernel:    {}\n  reference: {}",
                describe(&got),
                describe(&want)
            ));
        }
        let flows: BTreeMap<FlowKey, FlowStats> = self
            .h
            .flows()
            .into_iter()
            .map(|(k, v)| (k, untimed(v)))
            .collect();
        let want_flows = self.want_flows();
        if flows != want_flows {
            return Err(first_flow_difference(&flows, &want_flows));
        }
        let vteps = self.h.vteps();
        let want_vteps: Vec<(VtepKey, VtepStats)> =
            self.vteps.iter().map(|(k, v)| (*k, *v)).collect();
        if vteps != want_vteps {
            return Err(format!(
                "VTEPS differ\n  kernel:    {vteps:?}\n  reference: {want_vteps:?}"
            ));
        }
        Ok(())
    }

    fn end_batch(&mut self) {
        let want = self.want_stats();
        for (t, v) in self.totals.stats.iter_mut().zip(want) {
            *t += v;
        }
        self.totals.flows += self.flows.flows.len() as u64;
    }
}

/// When `before` had a valid IPv4 header checksum at `l3`, `after` must have one too.
fn checksum_broken(before: &[u8], after: &[u8], l3: usize, v6: bool) -> Option<String> {
    if v6 {
        return None;
    }
    let ihl = (*before.get(l3)? & 0x0F) as usize * 4;
    let (b, a) = (before.get(l3..l3 + ihl)?, after.get(l3..l3 + ihl)?);
    if ihl < 20 || ipv4_checksum(b) != 0 || ipv4_checksum(a) == 0 {
        return None;
    }
    Some(format!("IPv4 header at {l3}: {a:02x?}"))
}

fn first_flow_difference(
    got: &BTreeMap<FlowKey, FlowStats>,
    want: &BTreeMap<FlowKey, FlowStats>,
) -> String {
    for (k, v) in got {
        match want.get(k) {
            None => return format!("kernel flow not in the reference: {k:?} {v:?}"),
            Some(w) if w != v => {
                return format!("flow {k:?} differs\n  kernel:    {v:?}\n  reference: {w:?}")
            }
            Some(_) => {}
        }
    }
    for (k, v) in want {
        if !got.contains_key(k) {
            return format!("reference flow not in the kernel: {k:?} {v:?}");
        }
    }
    "flows differ".to_string()
}

/// The mirror lane: `xdp_mirror` (and the `xdp_mirror_flows` it tail-calls) against
/// `ReferenceTable::with_mirrors`, on mirror copies of the generated frames
/// (`gen::mirror_copy`) and, now and then, the frames themselves.
struct MirrorLane {
    h: Harness,
    rng: rand::rngs::StdRng,
    reference: ReferenceTable,
    config: RuntimeConfig,
    ifindex: u32,
}

impl MirrorLane {
    fn new(o: &DiffOptions, seed: u64, ifindex: u32) -> Self {
        use rand::SeedableRng;
        let opts = LoadOptions {
            config: o.policy.config,
            ..LoadOptions::default()
        };
        MirrorLane {
            h: Harness::load_mirror_with(&opts),
            rng: rand::rngs::StdRng::seed_from_u64(seed ^ 0x4D49_5252_4F52),
            reference: ReferenceTable::with_mirrors(o.reference_policy.config),
            config: o.reference_policy.config,
            ifindex,
        }
    }

    fn reset(&mut self) {
        self.h.reset();
        self.reference = ReferenceTable::with_mirrors(self.config);
    }

    /// The frame the lane runs for `frame`: a copy of it, or (one in ten) itself.
    fn frame_for(&mut self, frame: &[u8]) -> Vec<u8> {
        use rand::Rng;
        if self.rng.random_bool(0.1) {
            frame.to_vec()
        } else {
            crate::gen::mirror_copy(&mut self.rng, frame)
        }
    }

    /// Verdict XDP_PASS, the frame unchanged; counted by the reference.
    fn step(&mut self, frame: &[u8]) -> Result<(), String> {
        self.reference.process(frame, self.ifindex, 0);
        let out = self.h.run(frame);
        if out.retval != XDP_PASS || out.data != frame {
            return Err(format!(
                "verdict {} (expected XDP_PASS) or the packet changed:
{}",
                out.retval,
                hex(&out.data)
            ));
        }
        Ok(())
    }

    /// STATS, plain flows and mirrored flows against the reference's.
    fn check_tables(&self) -> Result<(), String> {
        compare_with_reference(&self.h.flows(), &self.h.stats(), &self.reference)?;
        let got: BTreeMap<FlowKeyMirror, FlowStats> = self
            .h
            .mirrored_flows()
            .into_iter()
            .map(|(k, v)| (k, untimed(v)))
            .collect();
        let want: BTreeMap<FlowKeyMirror, FlowStats> = self
            .reference
            .mirror_flows
            .iter()
            .map(|(k, v)| (*k, untimed(*v)))
            .collect();
        if got != want {
            for (k, v) in &got {
                match want.get(k) {
                    None => {
                        return Err(format!(
                            "kernel mirrored flow not in the reference: {k:?} {v:?}"
                        ))
                    }
                    Some(w) if w != v => {
                        return Err(format!(
                            "mirrored flow {k:?} differs\n  kernel:    {v:?}\n  reference: {w:?}"
                        ))
                    }
                    Some(_) => {}
                }
            }
            return Err(format!(
                "the reference has {} mirrored flows, the kernel {}",
                want.len(),
                got.len()
            ));
        }
        Ok(())
    }
}

/// The XDP lane: `xdp_classify` against `ReferenceTable`.
struct XdpLane {
    h: Harness,
    ifindex: u32,
    config: RuntimeConfig,
}

impl XdpLane {
    fn new(o: &DiffOptions) -> Self {
        let opts = LoadOptions {
            config: o.policy.config,
            ..LoadOptions::default()
        };
        let mut h = Harness::load_with(&opts);
        let ifindex = kernel_ifindex(&mut h, &o.policy.config);
        XdpLane {
            h,
            ifindex,
            config: o.reference_policy.config,
        }
    }

    /// Verdict XDP_PASS and the frame unchanged.
    fn step(&mut self, frame: &[u8]) -> Result<(), String> {
        let out = self.h.run(frame);
        let mut why = Vec::new();
        if out.retval != XDP_PASS {
            why.push(format!("verdict {} (expected XDP_PASS)", out.retval));
        }
        if out.data != frame {
            why.push(format!(
                "the program changed the packet:\n{}",
                hex(&out.data)
            ));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }
}

/// The ifindex the kernel puts into keys under BPF_PROG_TEST_RUN, read from a key.
pub fn kernel_ifindex(h: &mut Harness, config: &RuntimeConfig) -> u32 {
    let f = roce_frame_to(
        &Eth::default(),
        &L3::v4(Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(2, 2, 2, 2)),
        1,
        config.roce_port,
        &RoceMsg::send_only(1, 0, 0),
    );
    h.pass(&f);
    let flows = h.flows();
    let ifindex = match flows.keys().next() {
        Some(k) => k.ifindex,
        None => panic!("the probe frame made no flow"),
    };
    h.reset();
    ifindex
}

/// Replays `batch` through the XDP lane one frame at a time, comparing after each:
/// the first frame after which the tables differ is the culprit (with the frames
/// before it as the state it met). `reference_ifindex` is the ifindex the reference
/// keys flows with (the kernel's, unless a test asks for a wrong one).
pub fn narrow_down_xdp(
    h: &mut Harness,
    config: RuntimeConfig,
    reference_ifindex: u32,
    batch: &[Sample],
) -> (Option<usize>, String) {
    h.reset();
    let mut reference = ReferenceTable::new(config);
    for (i, s) in batch.iter().enumerate() {
        h.pass(&s.frame);
        let outcome = reference.process(&s.frame, reference_ifindex, 0).outcome;
        if let Err(diff) = compare_with_reference(&h.flows(), &h.stats(), &reference) {
            // Does it fail on its own, too?
            h.reset();
            let mut alone = ReferenceTable::new(config);
            h.pass(&s.frame);
            alone.process(&s.frame, reference_ifindex, 0);
            let alone_diff = compare_with_reference(&h.flows(), &h.stats(), &alone);
            return (
                Some(i),
                format!(
                    "first differing packet: #{i} of the batch, {} bytes, reference outcome {outcome:?}\n{}\n{diff}\non its own: {}",
                    s.frame.len(),
                    hex(&s.frame),
                    match alone_diff {
                        Ok(()) => "agrees (depends on the packets before it)".to_string(),
                        Err(d) => format!("differs too: {d}"),
                    }
                ),
            );
        }
    }
    (
        None,
        "replayed one by one, the batch agreed (the difference depends on batching)".to_string(),
    )
}

/// Replays `batch` through one tc lane one frame at a time: the first frame after
/// which its tables differ from the reference's.
fn narrow_down_tc(lane: &mut TcLane, batch: &[Sample]) -> (Option<usize>, String) {
    lane.reset();
    for (i, s) in batch.iter().enumerate() {
        let _ = lane.step(&s.frame);
        if let Err(diff) = lane.check_tables() {
            return (Some(i), format!("after this frame: {diff}"));
        }
    }
    (
        None,
        "replayed one by one, the batch agreed (the difference depends on batching)".to_string(),
    )
}

/// A differential run: the generator, the loaded programs and the reference, and the
/// report so far.
pub struct Differential {
    gen: Gen,
    xdp: XdpLane,
    mirror: MirrorLane,
    tc: Vec<TcLane>,
    report: Report,
    batch_no: u64,
    start: Instant,
}

impl Differential {
    /// Loads the programs (one object for XDP, one per tc lane). Needs root.
    pub fn new(o: &DiffOptions, seed: u64) -> Self {
        let xdp = XdpLane::new(o);
        let mirror = MirrorLane::new(o, seed, xdp.ifindex);
        let tc: Vec<TcLane> = if o.tc {
            tc_lanes()
                .into_iter()
                .map(|(name, program, mode)| TcLane::new(name, program, mode, o))
                .collect()
        } else {
            Vec::new()
        };
        let report = Report {
            seed,
            packets: 0,
            xdp_stats: vec![0; STATS_LEN as usize],
            mirror_stats: vec![0; STATS_LEN as usize],
            mirrored_flows: 0,
            flows: FlowTotals::default(),
            opcodes: BTreeSet::new(),
            lanes: tc.iter().map(|l| (l.name, LaneTotals::default())).collect(),
            disagreements: 0,
            first: Vec::new(),
            elapsed: Duration::ZERO,
        };
        Differential {
            gen: Gen::new(seed, o.reference_policy.config),
            xdp,
            mirror,
            tc,
            report,
            batch_no: 0,
            start: Instant::now(),
        }
    }

    /// The ifindex the XDP program keys flows with.
    pub fn ifindex(&self) -> u32 {
        self.xdp.ifindex
    }

    fn disagree(&mut self, d: Disagreement) {
        self.report.disagreements += 1;
        if self.report.first.len() < KEEP {
            self.report.first.push(d);
        }
    }

    /// Generates `count` frames and runs them as one batch.
    pub fn run_batch(&mut self, count: usize) {
        let batch: Vec<Sample> = (0..count).map(|_| self.gen.sample()).collect();
        self.run_frames(&batch);
    }

    /// Runs `batch` through every lane and the reference, from empty maps.
    pub fn run_frames(&mut self, batch: &[Sample]) {
        let batch_no = self.batch_no;
        self.batch_no += 1;
        self.xdp.h.reset();
        self.mirror.reset();
        for lane in &mut self.tc {
            lane.reset();
        }
        let mut mirror_frames = Vec::with_capacity(batch.len());
        let mut reference = ReferenceTable::new(self.xdp.config);
        let mut found = Vec::new();
        for (i, s) in batch.iter().enumerate() {
            if let Err(detail) = self.xdp.step(&s.frame) {
                found.push(("xdp", i, detail));
            }
            let walk = reference.process(&s.frame, self.xdp.ifindex, 0);
            if matches!(walk.outcome, Outcome::Flow(_)) || walk.layers.roce {
                self.report.opcodes.insert(walk.layers.bth_opcode);
            }
            for lane in &mut self.tc {
                if let Err(detail) = lane.step(&s.frame) {
                    found.push((lane.name, i, detail));
                }
            }
            let m = self.mirror.frame_for(&s.frame);
            if let Err(detail) = self.mirror.step(&m) {
                found.push(("xdp_mirror", i, detail));
            }
            mirror_frames.push(m);
        }
        for (lane, i, detail) in found {
            let frame = if lane == "xdp_mirror" {
                mirror_frames[i].clone()
            } else {
                batch[i].frame.clone()
            };
            self.disagree(Disagreement {
                lane,
                batch: batch_no,
                index: Some(i),
                frame,
                detail,
            });
        }
        if let Err(diff) = self.mirror.check_tables() {
            let (index, culprit) = self.narrow_down_mirror(&mirror_frames);
            self.disagree(Disagreement {
                lane: "xdp_mirror",
                batch: batch_no,
                index,
                frame: index.map(|i| mirror_frames[i].clone()).unwrap_or_default(),
                detail: format!("tables differ after the batch: {diff}\n{culprit}"),
            });
        }
        for (t, v) in self
            .report
            .mirror_stats
            .iter_mut()
            .zip(self.mirror.reference.stats.iter())
        {
            *t += v;
        }
        self.report.mirrored_flows += self.mirror.reference.mirror_flows.len() as u64;
        // The tables after the batch.
        if let Err(diff) =
            compare_with_reference(&self.xdp.h.flows(), &self.xdp.h.stats(), &reference)
        {
            let (index, culprit) =
                narrow_down_xdp(&mut self.xdp.h, self.xdp.config, self.xdp.ifindex, batch);
            self.disagree(Disagreement {
                lane: "xdp",
                batch: batch_no,
                index,
                frame: index.map(|i| batch[i].frame.clone()).unwrap_or_default(),
                detail: format!("tables differ after the batch: {diff}\n{culprit}"),
            });
        }
        self.report.flows.add(&reference);
        for (t, v) in self.report.xdp_stats.iter_mut().zip(reference.stats.iter()) {
            *t += v;
        }
        for li in 0..self.tc.len() {
            if let Err(diff) = self.tc[li].check_tables() {
                // Narrowing down replays the batch into the lane: keep its totals.
                self.tc[li].end_batch();
                let totals = self.tc[li].totals.clone();
                let (index, culprit) = narrow_down_tc(&mut self.tc[li], batch);
                self.tc[li].totals = totals;
                let lane = self.tc[li].name;
                self.disagree(Disagreement {
                    lane,
                    batch: batch_no,
                    index,
                    frame: index.map(|i| batch[i].frame.clone()).unwrap_or_default(),
                    detail: format!("tables differ after the batch: {diff}\n{culprit}"),
                });
            } else {
                self.tc[li].end_batch();
            }
        }
        self.report.packets += batch.len() as u64;
        self.report.elapsed = self.start.elapsed();
    }

    /// Replays the mirror lane's frames one at a time: the first after which its
    /// tables differ from the reference's.
    fn narrow_down_mirror(&mut self, frames: &[Vec<u8>]) -> (Option<usize>, String) {
        self.mirror.reset();
        for (i, f) in frames.iter().enumerate() {
            let _ = self.mirror.step(f);
            if let Err(diff) = self.mirror.check_tables() {
                return (Some(i), format!("after this frame: {diff}"));
            }
        }
        (
            None,
            "replayed one by one, the batch agreed (the difference depends on batching)"
                .to_string(),
        )
    }

    /// Runs `n` frames in batches of `BATCH`, calling `progress` after each batch.
    pub fn run(&mut self, n: u64, mut progress: impl FnMut(&Report)) -> &Report {
        let mut done = 0;
        while done < n {
            let count = (BATCH as u64).min(n - done) as usize;
            self.run_batch(count);
            done += count as u64;
            progress(self.report());
        }
        self.report()
    }

    /// The report so far, with the lanes' totals.
    pub fn report(&mut self) -> &Report {
        for (slot, lane) in self.report.lanes.iter_mut().zip(&self.tc) {
            slot.1 = lane.totals.clone();
        }
        &self.report
    }
}
