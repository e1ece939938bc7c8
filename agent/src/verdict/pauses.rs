//! Pause storms and slow receivers (PFC): a lossless priority stops its sender with
//! pause frames when the receiver's buffer fills. Microsoft's RoCEv2 deployment
//! (SIGCOMM 2016) met both ends of it: a NIC whose receive pipeline stalled sent
//! pauses without end and froze its switch port and, through it, the fabric (a pause
//! storm: the NIC's watchdog now stops pausing after 100 ms of it); and slow receivers
//! that paused their switch thousands of times a second, spreading congestion
//! upstream. Per interface and priority, from the NIC's pause counters (mlx5's
//! `{rx,tx}_prio{p}_pause[_duration]`, or DCB's frames):
//! - `pause_storm`: the port was paused (by its switch: rx) for more than
//!   `pause_storm_share` of the time (50%), round after round, `pause_storm_rounds` (3) rounds running
//!   (needs the pause durations, which mlx5 keeps);
//! - `slow_receiver`: the port sent (tx) more than `slow_receiver_pauses_per_s` (1,000) pause
//!   frames a second over the window;
//! - `pause_storm` of this host's own port: its PFC storm watchdog counted pauses it
//!   kept sending past the warning threshold (a warning) or past the timeout, after
//!   which it stopped pausing and dropped instead (an error), in the window (mlx5's
//!   `tx_pause_storm_{warning,error}_events`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Window;
use crate::config::VerdictThresholds;
use crate::doc::finding::{Finding, Severity};

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

/// One interface's PFC storm watchdog counters, as read now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchdogReading {
    pub ifname: String,
    /// Pauses sent past the warning threshold, and past the timeout.
    pub warning_events: Option<u64>,
    pub error_events: Option<u64>,
}

type Key = (String, u8);

/// The readings of one round, by interface and priority, and the watchdogs' by
/// interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    readings: BTreeMap<Key, PauseReading>,
    watchdogs: BTreeMap<String, WatchdogReading>,
}

impl Totals {
    pub fn of(readings: &[PauseReading], watchdogs: &[WatchdogReading]) -> Totals {
        Totals {
            readings: readings
                .iter()
                .map(|r| ((r.ifname.clone(), r.priority), r.clone()))
                .collect(),
            watchdogs: watchdogs
                .iter()
                .map(|w| (w.ifname.clone(), w.clone()))
                .collect(),
        }
    }
}

/// `pause_storm` for every interface whose storm watchdog counted events in the
/// window (since `before`): an error for pauses it had to stop, else a warning.
pub fn watchdog_events(now: &Totals, before: &Totals, window: Window) -> Vec<Finding> {
    let mut out = Vec::new();
    for (ifname, w) in &now.watchdogs {
        let b = before.watchdogs.get(ifname);
        let errors = delta(w.error_events, b.and_then(|b| b.error_events)).unwrap_or(0);
        let warnings = delta(w.warning_events, b.and_then(|b| b.warning_events)).unwrap_or(0);
        // Nothing to compare with: the counts are from before the agent looked.
        if b.is_none() || (errors == 0 && warnings == 0) {
            continue;
        }
        let (severity, found) = if errors > 0 {
            (
                Severity::Error,
                format!("{ifname}'s PFC storm watchdog stopped its pauses {errors} times {window} (tx_pause_storm_error_events): the port paused its switch past the watchdog's timeout, then dropped instead"),
            )
        } else {
            (
                Severity::Warning,
                format!("{ifname} kept pausing its switch past its PFC storm watchdog's warning threshold {warnings} times {window} (tx_pause_storm_warning_events)"),
            )
        };
        out.push(Finding {
            check: "pause_storm".to_string(),
            interface: Some(ifname.clone()),
            severity,
            found,
            expected: "a receive pipeline that keeps up: pauses short enough that the storm watchdog never counts them".to_string(),
            fix: format!("find why {ifname}'s receive pipeline stalls (host memory, PCIe, a hung driver or firmware: `ethtool -S {ifname}`, `dmesg`); the watchdog keeps the fabric running meanwhile, at the cost of this port's drops"),
            flows: None,
            flow_keys: Vec::new(),
        });
    }
    out
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
    /// was paused more than `pause_storm_share` of the time, and says `pause_storm` for
    /// those at `pause_storm_rounds` or more.
    pub fn round(
        &mut self,
        now: &Totals,
        last: &Totals,
        round: Duration,
        t: &VerdictThresholds,
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        let round_us = round.as_micros().max(1) as f64;
        for (key, r) in &now.readings {
            let before = last.readings.get(key);
            let paused = delta(r.rx_paused_us, before.and_then(|b| b.rx_paused_us));
            let share = paused.map_or(0.0, |us| us as f64 / round_us);
            let running = self.running.entry(key.clone()).or_default();
            *running = if share > t.pause_storm_share {
                *running + 1
            } else {
                0
            };
            if *running < t.pause_storm_rounds {
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
                    100.0 * t.pause_storm_share,
                    running
                ),
                expected: format!(
                    "pauses that come and go: a priority paused more than {:.0}% of the time, round after round, is a storm that stalls every flow of the class",
                    100.0 * t.pause_storm_share
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
/// `slow_receiver_pauses_per_s` pause frames a second over the window.
pub fn slow_receivers(
    now: &Totals,
    before: &Totals,
    window: Window,
    span: Duration,
    t: &VerdictThresholds,
) -> Vec<Finding> {
    let per_s = t.slow_receiver_pauses_per_s;
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
        if rate <= per_s {
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
                "a receiver that keeps up: at most {per_s:.0} pause frames a second (Microsoft's slow receivers sent thousands)"
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
        Totals::of(
            &[PauseReading {
                ifname: "eth1".into(),
                priority: 3,
                rx_frames: Some(0),
                tx_frames: Some(tx),
                rx_paused_us: Some(rx_us),
            }],
            &[],
        )
    }

    fn watchdog(warning: u64, error: Option<u64>) -> Totals {
        Totals::of(
            &[],
            &[WatchdogReading {
                ifname: "eth1".into(),
                warning_events: Some(warning),
                error_events: error,
            }],
        )
    }

    #[test]
    fn the_watchdogs_events_in_the_window_are_a_storm_of_this_port() {
        let w = Window::Live(Duration::from_secs(30));
        let found = watchdog_events(&watchdog(3, Some(2)), &watchdog(1, Some(1)), w);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].check.as_str(), found[0].severity),
            ("pause_storm", Severity::Error)
        );
        assert!(
            found[0].found.starts_with(
                "eth1's PFC storm watchdog stopped its pauses 1 times in the last 30.0 s"
            ),
            "{}",
            found[0].found
        );
        let warned = watchdog_events(&watchdog(3, None), &watchdog(1, None), w);
        assert_eq!(warned[0].severity, Severity::Warning);
        assert!(
            warned[0].found.contains(" warning threshold 2 times "),
            "{}",
            warned[0].found
        );
        // Near misses: nothing new; nothing to compare with.
        assert!(watchdog_events(&watchdog(3, Some(2)), &watchdog(3, Some(2)), w).is_empty());
        assert!(watchdog_events(&watchdog(3, Some(2)), &Totals::default(), w).is_empty());
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
            found = storms.round(&now, &last, round, &VerdictThresholds::default());
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
            assert!(storms
                .round(&now, &reading(at, 0), round, &VerdictThresholds::default())
                .is_empty());
            at += share;
        }
    }

    #[test]
    fn more_than_a_thousand_pause_frames_a_second_sent_is_a_slow_receiver() {
        let window = Duration::from_secs(10);
        let w = Window::Live(window);
        let found = slow_receivers(
            &reading(0, 10_010),
            &reading(0, 0),
            w,
            window,
            &VerdictThresholds::default(),
        );
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].check, "slow_receiver");
        assert_eq!(
            found[0].found,
            "eth1 sent 10010 pause frames on priority 3 in the last 10.0 s, 1001 a second"
        );
        assert!(slow_receivers(
            &reading(0, 10_000),
            &reading(0, 0),
            w,
            window,
            &VerdictThresholds::default()
        )
        .is_empty());
        // Counts from before the window are not this window's.
        assert!(slow_receivers(
            &reading(0, 1_000_000),
            &reading(0, 995_000),
            w,
            window,
            &VerdictThresholds::default()
        )
        .is_empty());
    }
}
