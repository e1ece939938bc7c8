//! Log lines that repeat every interval (a map that cannot be read, an audit that
//! fails) are written at most once a minute per kind, with the count of those left out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often one kind of repeated line is written.
pub const EVERY: Duration = Duration::from_secs(60);

/// Per kind: when a line was last written and how many were left out since.
#[derive(Debug, Default)]
pub struct Throttle {
    kinds: HashMap<&'static str, (Instant, u64)>,
}

impl Throttle {
    /// Whether to write a line of `kind` now: `Some(left_out)` (lines of this kind left
    /// out since the last one written), or None to leave this one out.
    pub fn allow(&mut self, kind: &'static str, now: Instant) -> Option<u64> {
        match self.kinds.get_mut(kind) {
            Some((last, left_out)) if now.duration_since(*last) < EVERY => {
                *left_out += 1;
                None
            }
            Some((last, left_out)) => {
                let n = *left_out;
                *last = now;
                *left_out = 0;
                Some(n)
            }
            None => {
                self.kinds.insert(kind, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_a_minute_per_kind_with_the_count_left_out() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(t.allow("poll", t0), Some(0));
        assert_eq!(t.allow("poll", t0 + Duration::from_secs(1)), None);
        assert_eq!(t.allow("poll", t0 + Duration::from_secs(2)), None);
        assert_eq!(t.allow("other", t0 + Duration::from_secs(2)), Some(0));
        assert_eq!(t.allow("poll", t0 + EVERY), Some(2));
        assert_eq!(t.allow("poll", t0 + EVERY + Duration::from_secs(1)), None);
    }
}
