//! `rate_limit`: a token bucket over all requests, as exporter-toolkit's (Go's
//! `rate.NewLimiter(rate.Every(interval), burst)`): it starts full with `burst`
//! tokens, gains one every `interval`, and each request takes one or is refused.
//! `interval: 0` (or no `rate_limit`) is no limit.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::WebConfigError;

/// `rate_limit` as written: `interval` a Go duration ("1s", "250ms", "1m30s") or an
/// integer of nanoseconds, as Go's YAML reads a `time.Duration`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping (interval, burst)")]
pub(super) struct RateLimitSection {
    #[serde(default)]
    interval: Option<serde_norway::Value>,
    #[serde(default)]
    burst: Option<i64>,
}

/// Allows `burst` requests at once, then one per `interval`.
#[derive(Debug)]
pub struct RateLimiter {
    interval: Duration,
    burst: u32,
    /// Tokens left, and when they were counted.
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// A full bucket of `burst` tokens, one more every `interval` (not zero).
    pub fn new(interval: Duration, burst: u32) -> RateLimiter {
        RateLimiter {
            interval,
            burst,
            state: Mutex::new((f64::from(burst), Instant::now())),
        }
    }

    /// Whether a request may go now (it takes a token if so).
    pub fn allow(&self) -> bool {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, since) = *state;
        let gained =
            now.saturating_duration_since(since).as_secs_f64() / self.interval.as_secs_f64();
        let tokens = (tokens + gained).min(f64::from(self.burst));
        let allowed = tokens >= 1.0;
        *state = (if allowed { tokens - 1.0 } else { tokens }, now.max(since));
        allowed
    }

    /// E.g. "burst 20, then 1 request per 1s".
    pub fn describe(&self) -> String {
        format!(
            "burst {}, then 1 request per {:?}",
            self.burst, self.interval
        )
    }
}

/// The limiter `section` asks for; None for `interval: 0` or none.
pub(super) fn build(
    path: &Path,
    section: RateLimitSection,
) -> Result<Option<RateLimiter>, WebConfigError> {
    let invalid = |key: &str, message: String| {
        WebConfigError::invalid(path, format!("rate_limit.{key}"), message)
    };
    let interval = match &section.interval {
        None | Some(serde_norway::Value::Null) => Duration::ZERO,
        Some(serde_norway::Value::Number(n)) => match n.as_u64() {
            Some(ns) => Duration::from_nanos(ns),
            None => {
                return Err(invalid(
                    "interval",
                    format!("{n} is not a duration (e.g. 1s, 250ms)"),
                ))
            }
        },
        Some(serde_norway::Value::String(s)) => go_duration(s).ok_or_else(|| {
            invalid(
                "interval",
                format!("{s:?} is not a duration (e.g. 1s, 250ms, 1m30s)"),
            )
        })?,
        Some(_) => {
            return Err(invalid(
                "interval",
                "not a duration (e.g. 1s, 250ms)".to_string(),
            ))
        }
    };
    if interval.is_zero() {
        return Ok(None);
    }
    let burst = section.burst.unwrap_or(0);
    let burst = u32::try_from(burst)
        .ok()
        .filter(|b| *b > 0)
        .ok_or_else(|| {
            invalid(
                "burst",
                format!("{burst}: must be at least 1 (0 refuses every request)"),
            )
        })?;
    Ok(Some(RateLimiter::new(interval, burst)))
}

/// A non-negative Go duration: "0", or numbers (with a fraction) each followed by a
/// unit among ns, us, µs, ms, s, m, h ("1h30m", "1.5s").
fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::super::WebConfig;
    use super::*;
    use roce_testkit::temp::TempDir;

    #[test]
    fn go_durations_are_read() {
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("0s"), Some(Duration::ZERO));
        assert_eq!(go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("1.5h"), Some(Duration::from_secs(5400)));
        for bad in ["", "1", "s", "1x", "-1s", "1s2"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_bucket_allows_a_burst_then_one_per_interval() {
        let limiter = RateLimiter::new(Duration::from_secs(1), 2);
        let t0 = Instant::now();
        assert!(limiter.allow_at(t0));
        assert!(limiter.allow_at(t0));
        assert!(!limiter.allow_at(t0));
        assert!(!limiter.allow_at(t0 + Duration::from_millis(900)));
        assert!(limiter.allow_at(t0 + Duration::from_millis(1000)));
        assert!(!limiter.allow_at(t0 + Duration::from_millis(1100)));
        // Idle time refills up to the burst, no more.
        let later = t0 + Duration::from_secs(60);
        assert!(limiter.allow_at(later) && limiter.allow_at(later) && !limiter.allow_at(later));
    }

    #[test]
    fn rate_limit_is_read_from_the_file_or_refused() {
        let dir = TempDir::new("web-config-rate");
        let path = dir.path().join("web.yml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            WebConfig::load(&path).map_err(|e| e.to_string())
        };
        assert!(load("rate_limit:\n  interval: 0\n  burst: 0\n")
            .unwrap()
            .rate_limit
            .is_none());
        assert!(load("rate_limit:\n  interval: \"0s\"\n")
            .unwrap()
            .rate_limit
            .is_none());
        let c = load("rate_limit:\n  interval: 1s\n  burst: 20\n").unwrap();
        assert_eq!(
            c.rate_limit.unwrap().describe(),
            "burst 20, then 1 request per 1s"
        );
        let e = load("rate_limit:\n  interval: \"1s\"\n  burst: 0\n").unwrap_err();
        assert!(e.contains("rate_limit.burst: 0: must be at least 1"), "{e}");
        let e = load("rate_limit:\n  interval: soon\n  burst: 1\n").unwrap_err();
        assert!(
            e.contains("rate_limit.interval: \"soon\" is not a duration"),
            "{e}"
        );
        let e = load("rate_limit:\n  every: 1s\n").unwrap_err();
        assert!(e.contains("unknown field `every`"), "{e}");
    }
}
