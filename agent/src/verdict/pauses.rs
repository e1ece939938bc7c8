//! Pause storms and slow receivers (PFC): a lossless priority stops its sender with
//! pause frames when the receiver's buffer fills. Microsoft's RoCEv2 deployment
//! (SIGCOMM 2016) met both ends of it: a NIC whose receive pipeline stalled sent
//! pauses without end and froze its switch port and, through it, the fabric (a pause
//! storm: the NIC's watchdog now stops pausing after 100 ms of it); and slow receivers
//! that paused their switch thousands of times a second, spreading congestion
//! upstream. Per interface and priority, from the NIC's pause counters (mlx5's
//! `{rx,tx}_prio{p}_pause[_duration]`, or DCB's frames):
//! - `pause_storm`: the port was paused (by its switch: rx) for more than
//!   [`STORM_SHARE`] of the time, round after round, [`STORM_ROUNDS`] rounds running
//!   (needs the pause durations, which mlx5 keeps);
//! - `slow_receiver`: the port sent (tx) more than [`SLOW_RECEIVER_PER_S`] pause
//!   frames a second over the window.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Window;
use crate::doc::finding::{Finding, Severity};

/// A round paused for more than this share of its time counts towards a storm.
pub const STORM_SHARE: f64 = 0.5;
/// Rounds running that make a storm.
pub const STORM_ROUNDS: u32 = 3;
/// Pause frames sent a second, over the window, that make a slow receiver.
pub const SLOW_RECEIVER_PER_S: f64 = 1000.0;

/// One priority's pause counters on one interface, as read now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PauseReading {
    pub ifname: String,
    pub priority: u8,
    /// Pause frames received (the switch paused this port) and sent (this port paused
    /// its switch).
    pub rx_frames: Option<u64>,
    pub tx_frames: Option<u64>,
    /// Time this port was paused, µs (mlx5 only).
    pub rx_paused_us: Option<u64>,
}

type Key = (String, u8);

/// The readings of one round, by interface and priority.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    readings: BTreeMap<Key, PauseReading>,
}

impl Totals {
    pub fn of(readings: &[PauseReading]) -> Totals {
        Totals {
            readings: readings
                .iter()
                .map(|r| ((r.ifname.clone(), r.priority), r.clone()))
                .collect(),
        }
    }
}

/// What is kept from round to round: each priority's rounds running in a storm.
#[derive(Clone, Debug, Default)]
pub struct Storms {
    running: BTreeMap<Key, u32>,
}

fn delta(now: Option<u64>, before: Option<u64>) -> Option<u64> {
    Some(now?.saturating_sub(before.unwrap_or(0)))
}

impl Storms {
    /// One round of `round` length: counts the rounds running in which each priority
    /// was paused more than [`STORM_SHARE`] of the time, and says `pause_storm` for
    /// those at [`STORM_ROUNDS`] or more.
    pub fn round(&mut self, now: &Totals, last: &Totals, round: Duration) -> Vec<Finding> {
        let mut out = Vec::new();
        let round_us = round.as_micros().max(1) as f64;
        for (key, r) in &now.readings {
            let before = last.readings.get(key);
            let paused = delta(r.rx_paused_us, before.and_then(|b| b.rx_paused_us));
            let share = paused.map_or(0.0, |us| us as f64 / round_us);
            let running = self.running.entry(key.clone()).or_default();
            *running = if share > STORM_SHARE { *running + 1 } else { 0 };
            if *running < STORM_ROUNDS {
                continue;
            }
            out.push(Finding {
                check: "pause_storm".to_string(),
                interface: Some(r.ifname.clone()),
                severity: Severity::Error,
                found: format!(
                    "priority {} of {} paused {:.0}% of the last {}, more than {:.0}% for {} rounds running",
                    r.priority,
                    r.ifname,
                    100.0 * share.min(1.0),
                    super::span(round),
                    100.0 * STORM_SHARE,
                    running
                ),
                expected: format!(
                    "pauses that come and go: a priority paused more than {:.0}% of the time, round after round, is a storm that stalls every flow of the class",
                    100.0 * STORM_SHARE
                ),
                fix: "find what pauses: the switch port's peer (a host whose NIC stalled, a slow receiver: `slow_receiver` on that host), and let the NICs' PFC storm watchdog stop a storm (ethtool --set-tunable IF pfc-prevention-tout 100 on mlx5)".to_string(),
                flows: None,
                flow_keys: Vec::new(),
            });
        }
        self.running.retain(|k, _| now.readings.contains_key(k));
        out
    }
}

/// `slow_receiver` for every interface and priority that sent more than
/// [`SLOW_RECEIVER_PER_S`] pause frames a second over the window.
pub fn slow_receivers(
    now: &Totals,
    before: &Totals,
    window: Window,
    span: Duration,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let secs = span.as_secs_f64().max(1e-3);
    for (key, r) in &now.readings {
        let Some(sent) = delta(
            r.tx_frames,
            before.readings.get(key).and_then(|b| b.tx_frames),
        ) else {
            continue;
        };
        let rate = sent as f64 / secs;
        if rate <= SLOW_RECEIVER_PER_S {
            continue;
        }
        out.push(Finding {
            check: "slow_receiver".to_string(),
            interface: Some(r.ifname.clone()),
            severity: Severity::Error,
            found: format!(
                "{} sent {sent} pause frames on priority {} {window}, {rate:.0} a second",
                r.ifname, r.priority
            ),
            expected: format!(
                "a receiver that keeps up: at most {SLOW_RECEIVER_PER_S:.0} pause frames a second (Microsoft's slow receivers sent thousands)"
            ),
            fix: format!(
                "find why {} cannot take its traffic (receive buffers, CPU or PCIe of the host, a stalled receive pipeline); meanwhile its pauses spread congestion upstream",
                r.ifname
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

    fn reading(rx_us: u64, tx: u64) -> Totals {
        Totals::of(&[PauseReading {
            ifname: "eth1".into(),
            priority: 3,
            rx_frames: Some(0),
            tx_frames: Some(tx),
            rx_paused_us: Some(rx_us),
        }])
    }

    #[test]
    fn a_priority_paused_most_of_three_rounds_running_is_a_storm_and_two_are_not() {
        let round = Duration::from_secs(1);
        let mut storms = Storms::default();
        let mut last = reading(0, 0);
        // 0.6 s paused a second: three rounds make a storm.
        let mut found = Vec::new();
        for i in 1..=3u64 {
            let now = reading(i * 600_000, 0);
            found = storms.round(&now, &last, round);
            last = now;
            if i < 3 {
                assert!(found.is_empty(), "round {i}: {found:?}");
            }
        }
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].check, "pause_storm");
        assert!(
            found[0].found.starts_with("priority 3 of eth1 paused 60% of the last 1.0 s, more than 50% for 3 rounds running"),
            "{}",
            found[0].found
        );
        // A round at 40% ends the run; two more at 60% are not yet a storm.
        let mut storms = Storms::default();
        let mut at = 0;
        for share in [600_000, 600_000, 400_000, 600_000, 600_000] {
            let now = reading(at + share, 0);
            assert!(storms.round(&now, &reading(at, 0), round).is_empty());
            at += share;
        }
    }

    #[test]
    fn more_than_a_thousand_pause_frames_a_second_sent_is_a_slow_receiver() {
        let window = Duration::from_secs(10);
        let w = Window::Live(window);
        let found = slow_receivers(&reading(0, 10_010), &reading(0, 0), w, window);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].check, "slow_receiver");
        assert_eq!(
            found[0].found,
            "eth1 sent 10010 pause frames on priority 3 in the last 10.0 s, 1001 a second"
        );
        assert!(slow_receivers(&reading(0, 10_000), &reading(0, 0), w, window).is_empty());
        // Counts from before the window are not this window's.
        assert!(slow_receivers(&reading(0, 1_000_000), &reading(0, 995_000), w, window).is_empty());
    }
}
