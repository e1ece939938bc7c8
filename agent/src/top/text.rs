//! How the view writes numbers, durations, times of day and text from the network:
//! small pure functions shared by the drawing and the fetch's error messages.

use std::time::{Duration, SystemTime};

/// A rate with an SI prefix: `0`, `0.5`, `12`, `950`, `1.23k`, `10.3G`.
pub fn si(v: f64) -> String {
    const PREFIXES: [&str; 6] = ["", "k", "M", "G", "T", "P"];
    if !v.is_finite() || v < 0.0 {
        return "-".to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    if v < 10.0 {
        return format!("{v:.1}");
    }
    let mut v = v;
    let mut prefix = 0;
    while v >= 1000.0 && prefix + 1 < PREFIXES.len() {
        v /= 1000.0;
        prefix += 1;
    }
    let p = PREFIXES[prefix];
    if prefix == 0 || v >= 100.0 {
        format!("{v:.0}{p}")
    } else if v >= 10.0 {
        format!("{v:.1}{p}")
    } else {
        format!("{v:.2}{p}")
    }
}

/// A total: exact up to 99999, then with an SI prefix (the column stays narrow).
pub fn count(n: u64) -> String {
    if n < 100_000 {
        n.to_string()
    } else {
        si(n as f64)
    }
}

/// Text from the network with control characters replaced: an escape sequence in an
/// interface name or an error must not reach the terminal.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `1 error`, `0 errors`, `2 errors`.
pub fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// A duration in seconds: `1s`, `0.5s`.
pub fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s}s")
    }
}

/// Local wall-clock time of day, `HH:MM:SS`.
pub fn clock(t: SystemTime) -> String {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs(),
        Err(_) => return "??:??:??".to_string(),
    };
    let Ok(time) = libc::time_t::try_from(secs) else {
        return "??:??:??".to_string();
    };
    // SAFETY: localtime_r only writes the `tm` we own; a zeroed tm is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is thread-safe.
    if unsafe { libc::localtime_r(&time, &mut tm) }.is_null() {
        return "??:??:??".to_string();
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_human_units() {
        assert_eq!(si(0.0), "0");
        assert_eq!(si(0.5), "0.5");
        assert_eq!(si(12.0), "12");
        assert_eq!(si(950.0), "950");
        assert_eq!(si(1234.0), "1.23k");
        assert_eq!(si(10.3e9), "10.3G");
        assert_eq!(si(400e9), "400G");
        assert_eq!(si(f64::NAN), "-");
        assert_eq!(count(99_999), "99999");
        assert_eq!(count(123_456), "123k");
        assert_eq!(plural(1, "error"), "1 error");
        assert_eq!(plural(0, "error"), "0 errors");
    }
}
