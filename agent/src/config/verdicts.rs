//! The fabric verdicts' thresholds (the `[verdicts]` table): the defaults come from
//! the deployments the verdicts are named after (README, "Fabric verdicts"); a fabric
//! tuned for its own traffic sets its own.

use std::time::Duration;

use toml::Spanned;

use super::file::{ConfigError, ConfigFile};

/// How far back the live verdicts look: long enough for a scrape to see a verdict,
/// short enough that it goes when the fabric mends.
pub const DEFAULT_VERDICT_WINDOW_SECS: f64 = 30.0;
/// CE-marked packets in a window before no CNP says more than chance: below, a burst
/// may end before the notification point's first CNP (DCQCN sends at most one per QP
/// per `min_time_between_cnps`, 4 µs to 50 µs).
pub const DEFAULT_MIN_CE: u64 = 10;
/// A round paused for more than this share of its time counts towards a storm.
pub const DEFAULT_PAUSE_STORM_SHARE: f64 = 0.5;
/// Rounds running that make a storm.
pub const DEFAULT_PAUSE_STORM_ROUNDS: u32 = 3;
/// Pause frames sent a second, over the window, that make a slow receiver
/// (Microsoft's slow receivers sent thousands).
pub const DEFAULT_SLOW_RECEIVER_PAUSES_PER_S: f64 = 1000.0;
/// Queue pairs on one path before their source ports are judged: fewer get few paths
/// whatever their ports.
pub const DEFAULT_ECMP_MIN_QPS: u32 = 8;
/// Queue pairs per source port, on average, that make a path's entropy low.
pub const DEFAULT_ECMP_QPS_PER_PORT: u32 = 4;

/// The thresholds of the verdicts (`crate::verdict`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VerdictThresholds {
    /// `window_secs`: how far back the live verdicts look.
    pub window: Duration,
    /// `min_ce`: `ce_unanswered` needs this many CE-marked packets in the window.
    pub min_ce: u64,
    /// `pause_storm_share`, `pause_storm_rounds`: paused more than this share of a
    /// round, this many rounds running.
    pub pause_storm_share: f64,
    pub pause_storm_rounds: u32,
    /// `slow_receiver_pauses_per_s`: pause frames sent a second over the window.
    pub slow_receiver_pauses_per_s: f64,
    /// `ecmp_min_qps`, `ecmp_qps_per_port`: a path with this many queue pairs or more,
    /// and this many or more a source port.
    pub ecmp_min_qps: u32,
    pub ecmp_qps_per_port: u32,
}

impl Default for VerdictThresholds {
    fn default() -> Self {
        VerdictThresholds {
            window: Duration::from_secs_f64(DEFAULT_VERDICT_WINDOW_SECS),
            min_ce: DEFAULT_MIN_CE,
            pause_storm_share: DEFAULT_PAUSE_STORM_SHARE,
            pause_storm_rounds: DEFAULT_PAUSE_STORM_ROUNDS,
            slow_receiver_pauses_per_s: DEFAULT_SLOW_RECEIVER_PAUSES_PER_S,
            ecmp_min_qps: DEFAULT_ECMP_MIN_QPS,
            ecmp_qps_per_port: DEFAULT_ECMP_QPS_PER_PORT,
        }
    }
}

impl VerdictThresholds {
    /// The defaults, overridden by the file's `[verdicts]` table; every value checked.
    pub(super) fn resolve(file: Option<&ConfigFile>) -> Result<VerdictThresholds, ConfigError> {
        let mut t = VerdictThresholds::default();
        let Some((f, v)) = file.and_then(|f| f.values.verdicts.as_ref().map(|v| (f, v))) else {
            return Ok(t);
        };
        // A value of `key` within `ok`, or refused with where it was written.
        fn take<T: Copy + std::fmt::Display>(
            f: &ConfigFile,
            key: &'static str,
            value: Option<&Spanned<T>>,
            ok: impl Fn(T) -> bool,
            range: &str,
        ) -> Result<Option<T>, ConfigError> {
            let Some(v) = value else {
                return Ok(None);
            };
            let x = *v.get_ref();
            if ok(x) {
                return Ok(Some(x));
            }
            Err(ConfigError::Invalid {
                origin: f.origin(v.span()),
                field: key,
                message: format!("{x} is out of range ({range})"),
            })
        }
        if let Some(s) = take(
            f,
            "window_secs",
            v.window_secs.as_ref(),
            |s| (1.0..=3600.0).contains(&s),
            "1 to 3600 seconds",
        )? {
            t.window = Duration::from_secs_f64(s);
        }
        if let Some(n) = take(f, "min_ce", v.min_ce.as_ref(), |n| n >= 1, "1 or more")? {
            t.min_ce = n;
        }
        if let Some(x) = take(
            f,
            "pause_storm_share",
            v.pause_storm_share.as_ref(),
            |x| x > 0.0 && x < 1.0,
            "above 0, below 1",
        )? {
            t.pause_storm_share = x;
        }
        if let Some(n) = take(
            f,
            "pause_storm_rounds",
            v.pause_storm_rounds.as_ref(),
            |n| (1..=1000).contains(&n),
            "1 to 1000",
        )? {
            t.pause_storm_rounds = n;
        }
        if let Some(x) = take(
            f,
            "slow_receiver_pauses_per_s",
            v.slow_receiver_pauses_per_s.as_ref(),
            |x| x > 0.0 && x.is_finite(),
            "above 0",
        )? {
            t.slow_receiver_pauses_per_s = x;
        }
        if let Some(n) = take(
            f,
            "ecmp_min_qps",
            v.ecmp_min_qps.as_ref(),
            |n| (2..=1_000_000).contains(&n),
            "2 to 1000000",
        )? {
            t.ecmp_min_qps = n;
        }
        if let Some(n) = take(
            f,
            "ecmp_qps_per_port",
            v.ecmp_qps_per_port.as_ref(),
            |n| (2..=1_000_000).contains(&n),
            "2 to 1000000",
        )? {
            t.ecmp_qps_per_port = n;
        }
        Ok(t)
    }
}
