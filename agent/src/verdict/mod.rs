//! Fabric verdicts: what the flows say is broken in the fabric's loops, named as
//! findings (check name, subject, evidence with its numbers and window, severity, the
//! fix), live (`GET /findings`, `roce_check_findings`) and in `analyze`. Each verdict
//! reads the same few facts of each flow ([`FlowFacts`]), so the live table (rows,
//! no `Flow` made) and a capture's flows feed them alike.
//!
//! - [`ce_loop`]: CE marks that no CNP answers (`ce_unanswered`).
//! - [`cnp_class`]: CNPs off the policy's CNP DSCP (`cnp_wrong_class`).
//! - [`entropy`]: many queue pairs on few UDP source ports (`ecmp_low_entropy`).
//! - [`overlay`]: underlay CE marks decapsulation could not carry (`inner_ce_lost`).
//! - [`pauses`]: PFC pause storms and slow receivers (`pause_storm`, `slow_receiver`).
//! - [`rnic_loop`]: the ECN -> CNP loop from the RNIC's counters, where the RNIC
//!   offloads RoCE (`ce_unanswered` of a port).
//!
//! Beside them, [`tunnels`] sums each VXLAN tunnel's flows and puts their PSN gaps on
//! the underlay or on this host's VTEP (`counters.tunnels`: numbers, not a verdict).

pub mod ce_loop;
pub mod cnp_class;
pub mod entropy;
pub mod overlay;
pub mod pauses;
pub mod rnic_loop;
pub mod tunnels;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use roce_common::cnp::CnpWrongClass;
use roce_common::policy::Policy;

use crate::config::VerdictThresholds;

use crate::doc::finding::Finding;
use crate::doc::{Direction, Flow, VtepRecord};

/// What the verdicts read of one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowFacts<'a> {
    /// None in `analyze`.
    pub ifname: Option<&'a str>,
    /// None in `analyze` and for mirrored flows.
    pub direction: Option<Direction>,
    /// Outer addresses.
    pub src: IpAddr,
    pub dst: IpAddr,
    pub vni: Option<u32>,
    pub inner_src: Option<IpAddr>,
    pub inner_dst: Option<IpAddr>,
    pub dest_qp: u32,
    /// The RoCE UDP source port (the inner one when tunnelled).
    pub sport: u16,
    /// A tunnelled flow's outer UDP source port, when known.
    pub outer_sport: Option<u16>,
    pub packets: u64,
    /// Packets with CE in the outer or the inner header, and of those, in the inner.
    pub ce: u64,
    pub inner_ce: u64,
    pub psn_gaps: u64,
    pub cnps: u64,
    /// Of `cnps`, those off the policy's CNP DSCP.
    pub cnps_wrong_class: CnpWrongClass,
}

impl<'a> FlowFacts<'a> {
    pub fn of(f: &'a Flow) -> FlowFacts<'a> {
        FlowFacts {
            ifname: f.ifname.as_deref(),
            // A mirror session's copies hold both directions, as a capture does.
            direction: f.direction.filter(|_| f.mirror.is_none()),
            src: f.src,
            dst: f.dst,
            vni: f.vni,
            inner_src: f.inner_src,
            inner_dst: f.inner_dst,
            dest_qp: f.dest_qp,
            sport: f.sport,
            outer_sport: f.outer_sport,
            packets: f.packets,
            ce: f.ecn.ce + f.inner_ecn.map_or(0, |e| e.ce),
            inner_ce: f.inner_ecn.map_or(0, |e| e.ce),
            psn_gaps: f.psn_gaps,
            cnps: f.cnps,
            cnps_wrong_class: CnpWrongClass {
                packets: f.cnps_wrong_class,
                dscps: f
                    .cnp_wrong_dscps
                    .iter()
                    .fold(0, |m, d| m | roce_common::cnp::dscp_bit(*d)),
            },
        }
    }
}

/// The hosts and window the verdicts' tests judge.
#[cfg(test)]
pub(crate) mod tests_common {
    use super::Window;
    use std::time::Duration;

    pub const A: &str = "198.18.0.1";
    pub const B: &str = "198.18.0.2";
    pub const WINDOW: Window = Window::Live(Duration::from_secs(1));
}

/// A plain flow for the verdicts' tests: `src` to `dst`, QP 0x11 from port 49152, 100
/// packets, seen on eth1 when it has a direction.
#[cfg(test)]
pub(crate) fn test_flow<'a>(src: &str, dst: &str, direction: Option<Direction>) -> FlowFacts<'a> {
    FlowFacts {
        ifname: direction.map(|_| "eth1"),
        direction,
        src: src.parse().expect("an address"),
        dst: dst.parse().expect("an address"),
        vni: None,
        inner_src: None,
        inner_dst: None,
        dest_qp: 0x11,
        sport: 49152,
        outer_sport: None,
        packets: 100,
        ce: 0,
        inner_ce: 0,
        psn_gaps: 0,
        cnps: 0,
        cnps_wrong_class: CnpWrongClass::default(),
    }
}

/// Two hosts as the verdicts name a path between them: outer addresses, and the VNI
/// and inner addresses when tunnelled. `from` sends, `to` receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Path {
    pub from: IpAddr,
    pub to: IpAddr,
    pub vni: Option<u32>,
    pub inner_from: Option<IpAddr>,
    pub inner_to: Option<IpAddr>,
}

impl Path {
    /// The path `f` travels.
    pub fn of(f: &FlowFacts<'_>) -> Path {
        Path {
            from: f.src,
            to: f.dst,
            vni: f.vni,
            inner_from: f.inner_src,
            inner_to: f.inner_dst,
        }
    }

    /// The way back.
    pub fn reversed(&self) -> Path {
        Path {
            from: self.to,
            to: self.from,
            vni: self.vni,
            inner_from: self.inner_to,
            inner_to: self.inner_from,
        }
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}→{}", self.from, self.to)?;
        if let (Some(vni), Some(a), Some(b)) = (self.vni, self.inner_from, self.inner_to) {
            write!(f, " (vni {vni} {a}→{b})")?;
        }
        Ok(())
    }
}

/// The window a verdict's numbers were counted in, as its evidence says it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Window {
    /// The live agent's, between two rounds.
    Live(Duration),
    /// A whole capture, `Some(span)` of frame time when it has two frames or more.
    Capture(Option<Duration>),
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Window::Live(d) => write!(f, "in the last {}", span(*d)),
            Window::Capture(Some(d)) => write!(f, "in the capture ({})", span(*d)),
            Window::Capture(None) => write!(f, "in the capture"),
        }
    }
}

/// `39 µs`, `2.5 ms`, `1.0 s`.
fn span(d: Duration) -> String {
    let us = d.as_micros();
    if us < 1000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// The verdicts of the live agent, round after round: they keep the loop totals of the
/// rounds of the last window (`[verdicts] window_secs`, at least one round back), so
/// that each round judges that window, not everything since the flows began.
#[derive(Debug)]
pub struct Live {
    thresholds: VerdictThresholds,
    /// Totals of earlier rounds, oldest first.
    rounds: std::collections::VecDeque<(Instant, Snapshot)>,
    /// The priorities in a pause storm, round after round.
    storms: pauses::Storms,
}

/// What a round keeps for the rounds after it.
#[derive(Debug, Default)]
struct Snapshot {
    /// What the datapath counts: the flows, and the decapsulation records per VTEP.
    loops: ce_loop::Totals,
    cnps: cnp_class::Totals,
    vteps: overlay::Totals,
    /// What the NICs and RDMA ports count. None in the zero a datapath started from
    /// (`Live::counting_from_zero`): their counters did not start with it.
    nic: Option<NicTotals>,
}

#[derive(Debug)]
struct NicTotals {
    pauses: pauses::Totals,
    np: rnic_loop::Totals,
}

/// What the live verdicts read of the host beside the flows, each round.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostFacts<'a> {
    /// The decapsulation counters per remote VTEP.
    pub vteps: &'a [VtepRecord],
    /// The NICs' pause counters, per interface and priority, and their PFC storm
    /// watchdogs' events.
    pub pauses: &'a [pauses::PauseReading],
    pub watchdogs: &'a [pauses::WatchdogReading],
    /// The RDMA ports' notification-point counters.
    pub np: &'a [rnic_loop::NpReading],
}

impl Default for Live {
    fn default() -> Live {
        Live::new(VerdictThresholds::default())
    }
}

impl Live {
    /// Verdicts whose first round is their start: what the datapath counted before it
    /// (an adopted pinned datapath's history) is not judged.
    pub fn new(thresholds: VerdictThresholds) -> Live {
        Live {
            thresholds,
            rounds: Default::default(),
            storms: Default::default(),
        }
    }

    /// The thresholds the next round judges with.
    pub fn thresholds(&self) -> VerdictThresholds {
        self.thresholds
    }

    /// New thresholds (a reload): the rounds kept so far stay, and the next round
    /// judges its window with these.
    pub fn set_thresholds(&mut self, thresholds: VerdictThresholds) {
        self.thresholds = thresholds;
    }

    /// These verdicts on a datapath that began counting from zero at `started` (made by
    /// this agent, not adopted): the first round judges all it counted since, so that
    /// what came before that round is in a window too. For a new `Live` only.
    pub fn counting_from_zero(mut self, started: Instant) -> Live {
        if self.rounds.is_empty() {
            self.rounds.push_back((started, Snapshot::default()));
        }
        self
    }

    /// The verdicts of this round, from every flow of the table now (`for_each` calls
    /// its argument with each) and the host's counters, against its QoS `policy`.
    pub fn round(
        &mut self,
        for_each: impl FnOnce(&mut dyn FnMut(FlowFacts<'_>)),
        host: &HostFacts<'_>,
        policy: &Policy,
    ) -> Vec<Finding> {
        self.round_at(Instant::now(), for_each, host, policy)
    }

    fn round_at(
        &mut self,
        now: Instant,
        for_each: impl FnOnce(&mut dyn FnMut(FlowFacts<'_>)),
        host: &HostFacts<'_>,
        policy: &Policy,
    ) -> Vec<Finding> {
        let mut loops = ce_loop::Totals::default();
        let mut cnps = cnp_class::Totals::default();
        let mut ports = entropy::Ports::default();
        for_each(&mut |f| {
            loops.add(&f);
            cnps.add(&f);
            ports.add(&f);
        });
        let vteps = overlay::Totals::of(host.vteps);
        let nic = NicTotals {
            pauses: pauses::Totals::of(host.pauses, host.watchdogs),
            np: rnic_loop::Totals::of(host.np),
        };
        let t = self.thresholds;
        let mut out = Vec::new();
        // Storms are judged round by round, against the last round.
        if let Some((then, Some(last))) = self.rounds.back().map(|(at, s)| (at, s.nic.as_ref())) {
            let round = now.duration_since(*then);
            out.extend(self.storms.round(&nic.pauses, &last.pauses, round, &t));
        }
        // The oldest round still within the window is the one to compare with.
        while self.rounds.len() > 1
            && self
                .rounds
                .get(1)
                .is_some_and(|(at, _)| now.duration_since(*at) >= t.window)
        {
            self.rounds.pop_front();
        }
        if let Some((then, before)) = self.rounds.front() {
            let window = Window::Live(now.duration_since(*then));
            out.extend(ce_loop::unanswered(
                &loops,
                Some(&before.loops),
                window,
                t.min_ce,
            ));
            out.extend(cnp_class::wrong_class(
                &cnps,
                Some(&before.cnps),
                window,
                policy,
            ));
            out.extend(overlay::inner_ce_lost(&vteps, &before.vteps, window));
        }
        // The NICs' counters against their oldest reading in the window.
        let nic_before = self
            .rounds
            .iter()
            .find_map(|(at, s)| s.nic.as_ref().map(|n| (at, n, &s.loops)));
        if let Some((then, before, before_loops)) = nic_before {
            let span = now.duration_since(*then);
            let window = Window::Live(span);
            out.extend(rnic_loop::unanswered(
                &nic.np,
                &before.np,
                window,
                t.min_ce,
                &|ifname| loops.ce_on(Some(before_loops), ifname),
            ));
            out.extend(pauses::watchdog_events(&nic.pauses, &before.pauses, window));
            out.extend(pauses::slow_receivers(
                &nic.pauses,
                &before.pauses,
                window,
                span,
                &t,
            ));
        }
        out.extend(entropy::low_entropy(&ports, false, &t));
        self.rounds.push_back((
            now,
            Snapshot {
                loops,
                cnps,
                vteps,
                nic: Some(nic),
            },
        ));
        out
    }
}

/// The verdicts of a capture's flows, over the capture's `span` of frame time, against
/// the QoS `policy`, with thresholds `t`.
pub fn of_capture<'a>(
    flows: impl Iterator<Item = &'a Flow>,
    span: Option<Duration>,
    policy: &Policy,
    t: &VerdictThresholds,
) -> Vec<Finding> {
    let mut loops = ce_loop::Totals::default();
    let mut cnps = cnp_class::Totals::default();
    let mut ports = entropy::Ports::default();
    for f in flows {
        let facts = FlowFacts::of(f);
        loops.add(&facts);
        cnps.add(&facts);
        ports.add(&facts);
    }
    let window = Window::Capture(span);
    let mut out = ce_loop::unanswered(&loops, None, window, t.min_ce);
    out.extend(cnp_class::wrong_class(&cnps, None, window, policy));
    out.extend(entropy::low_entropy(&ports, true, t));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(ce: u64, cnps: u64) -> impl FnOnce(&mut dyn FnMut(FlowFacts<'_>)) {
        move |f: &mut dyn FnMut(FlowFacts<'_>)| {
            let flow = |src, dst, direction| FlowFacts {
                packets: 100 + ce,
                ..test_flow(src, dst, Some(direction))
            };
            f(FlowFacts {
                ce,
                ..flow("198.18.0.1", "198.18.0.2", Direction::Ingress)
            });
            f(FlowFacts {
                cnps,
                ..flow("198.18.0.2", "198.18.0.1", Direction::Egress)
            });
        }
    }

    impl Live {
        fn round_at_flows(
            &mut self,
            now: Instant,
            for_each: impl FnOnce(&mut dyn FnMut(FlowFacts<'_>)),
        ) -> Vec<Finding> {
            self.round_at(now, for_each, &HostFacts::default(), &Policy::default())
        }

        /// A round of no flows, with eth1's priority 3 having sent `tx_frames` pause
        /// frames and been paused `rx_paused_us` so far.
        fn round_at_pauses(
            &mut self,
            now: Instant,
            tx_frames: u64,
            rx_paused_us: u64,
        ) -> Vec<Finding> {
            let r = pauses::PauseReading {
                ifname: "eth1".into(),
                priority: 3,
                rx_frames: Some(0),
                tx_frames: Some(tx_frames),
                rx_paused_us: Some(rx_paused_us),
            };
            let host = HostFacts {
                pauses: &[r],
                ..HostFacts::default()
            };
            self.round_at(now, |_| {}, &host, &Policy::default())
        }
    }

    #[test]
    fn pause_counters_make_storms_round_by_round_and_slow_receivers_over_the_window() {
        let t0 = Instant::now();
        let mut live = Live::default();
        let mut checks = Vec::new();
        for i in 0..5u64 {
            let found =
                live.round_at_pauses(t0 + Duration::from_millis(200 * i), i * 1000, i * 180_000);
            checks.push(found.into_iter().map(|f| f.check).collect::<Vec<_>>());
        }
        // 90% paused: a storm from the third round on; 5,000 frames a second sent.
        assert_eq!(checks[0], Vec::<String>::new());
        assert_eq!(checks[1], ["slow_receiver"]);
        assert_eq!(checks[3], ["pause_storm", "slow_receiver"]);
    }

    #[test]
    fn a_datapath_counting_from_zero_has_its_first_round_judged_an_adopted_one_not() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // Marks and their way back all counted before the first round: judged.
        let mut live = Live::default().counting_from_zero(t0);
        let found = live.round_at_flows(ms(200), marked(50, 0));
        assert_eq!(found.len(), 1);
        assert!(
            found[0].found.starts_with(
                "50 CE-marked RoCE packets 198.18.0.1→198.18.0.2 in the last 200.0 ms"
            ),
            "{}",
            found[0].found
        );
        // And still in the window a round later.
        assert_eq!(live.round_at_flows(ms(400), marked(50, 0)).len(), 1);
        // The near miss: an adopted datapath's counts are history of unknown age.
        let mut adopted = Live::default();
        assert!(adopted.round_at_flows(ms(200), marked(50, 0)).is_empty());
        assert!(adopted.round_at_flows(ms(400), marked(50, 0)).is_empty());
    }

    #[test]
    fn the_nics_counters_are_judged_from_their_first_reading_not_from_zero() {
        let t0 = Instant::now();
        let mut live = Live::default().counting_from_zero(t0);
        let mut found = Vec::new();
        // A million pause frames sent since boot, then 1,000 in 0.2 s (5,000 a second).
        for (i, tx) in [1_000_000, 1_001_000].into_iter().enumerate() {
            let round =
                live.round_at_pauses(t0 + Duration::from_millis(200 * (i as u64 + 1)), tx, 0);
            found.push(round.into_iter().map(|f| f.found).collect::<Vec<_>>());
        }
        assert_eq!(found[0], Vec::<String>::new());
        assert_eq!(found[1].len(), 1, "{:?}", found[1]);
        assert!(found[1][0].contains("1000"), "{}", found[1][0]);
    }

    #[test]
    fn a_live_verdict_stands_for_its_window_and_goes_when_the_loop_mends() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut live = Live::default();
        // The first round has nothing to compare with.
        assert!(live.round_at_flows(s(0), marked(0, 0)).is_empty());
        let found = live.round_at_flows(s(1), marked(50, 0));
        assert_eq!(found.len(), 1);
        assert!(
            found[0].found.contains("in the last 1.0 s"),
            "{}",
            found[0].found
        );
        // No new marks, but the window still holds the 50.
        let found = live.round_at_flows(s(20), marked(50, 0));
        assert!(
            found[0].found.contains("in the last 20.0 s"),
            "{}",
            found[0].found
        );
        // Past the window: the marks are old, nothing to say.
        assert!(live.round_at_flows(s(40), marked(50, 0)).is_empty());
        assert!(live.round_at_flows(s(75), marked(50, 0)).is_empty());
        // New marks answered by a CNP: the loop works.
        assert!(live.round_at_flows(s(76), marked(90, 1)).is_empty());
    }
}
