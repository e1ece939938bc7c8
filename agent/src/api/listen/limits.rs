//! The bounds of the API's HTTP surface, and the open-files limit they need.

use std::time::Duration;

/// How much of the agent one client, or many, can hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; one over it is closed as soon as it is accepted.
    pub max_connections: usize,
    /// How long a client has for its TLS handshake, and then for each request head
    /// (the first, and the next one on a kept-alive connection: an idle connection is
    /// closed after it too). Go's `ReadHeaderTimeout`, as exporters set it.
    pub header_read_timeout: Duration,
    /// How long a response may wait for the client to take any of it (a reader that
    /// stopped reading, its buffers full): then its connection is closed.
    pub write_timeout: Duration,
    /// The request head's bytes (request line and headers); more is answered 431.
    /// 8 KiB at least (hyper's smallest buffer).
    pub max_head_bytes: usize,
    /// A request body's bytes by its `Content-Length` (every endpoint is a GET); more,
    /// or a chunked body, is answered 413.
    pub max_body_bytes: u64,
    /// How long a shutdown lets open requests finish; streams still open then are cut.
    pub shutdown_grace: Duration,
}

/// The smallest head cap: hyper refuses a smaller read buffer.
pub(super) const MIN_HEAD_BYTES: usize = 8192;
/// File descriptors left for everything but API connections (maps, netlink, files).
const RESERVED_FDS: u64 = 128;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            max_head_bytes: 16 * 1024,
            max_body_bytes: 1024,
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

impl Limits {
    /// The defaults, with what the (undocumented, for tests) environment variables
    /// `ROCE_AGENT_HEADER_TIMEOUT_MS`, `ROCE_AGENT_WRITE_TIMEOUT_MS` and
    /// `ROCE_AGENT_MAX_CONNECTIONS` say instead; a value that is not a positive number
    /// is ignored.
    pub fn from_env() -> Limits {
        Limits::from_lookup(|name| std::env::var(name).ok())
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Limits {
        let number = |name: &str| {
            lookup(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        let mut limits = Limits::default();
        if let Some(ms) = number("ROCE_AGENT_HEADER_TIMEOUT_MS") {
            limits.header_read_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = number("ROCE_AGENT_WRITE_TIMEOUT_MS") {
            limits.write_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = number("ROCE_AGENT_MAX_CONNECTIONS") {
            limits.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        limits
    }

    /// These limits with at most as many connections as `open_files` (the soft
    /// RLIMIT_NOFILE) leaves room for.
    pub fn within(mut self, open_files: u64) -> Limits {
        let room = usize::try_from(open_files.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
        self.max_connections = self.max_connections.min(room).max(1);
        self
    }
}

/// Raises the soft limit of open files to the hard one, as Go programs do at start (a
/// service manager's soft 1,024 would refuse connections long before the cap): the
/// soft and hard limits in force then.
pub fn raise_open_files_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives on this stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_overrides_the_defaults_and_nonsense_is_ignored() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            Limits::from_lookup(move |name| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            })
        };
        assert_eq!(env(&[]), Limits::default());
        let l = env(&[
            ("ROCE_AGENT_HEADER_TIMEOUT_MS", "500"),
            ("ROCE_AGENT_WRITE_TIMEOUT_MS", " 1000 "),
            ("ROCE_AGENT_MAX_CONNECTIONS", "3"),
        ]);
        assert_eq!(l.header_read_timeout, Duration::from_millis(500));
        assert_eq!(l.write_timeout, Duration::from_secs(1));
        assert_eq!(l.max_connections, 3);
        let l = env(&[
            ("ROCE_AGENT_HEADER_TIMEOUT_MS", "0"),
            ("ROCE_AGENT_MAX_CONNECTIONS", "lots"),
        ]);
        assert_eq!(l, Limits::default());
    }

    #[test]
    fn connections_fit_in_the_open_files_limit() {
        assert_eq!(Limits::default().within(1 << 20).max_connections, 4096);
        assert_eq!(Limits::default().within(1024).max_connections, 1024 - 128);
        assert_eq!(Limits::default().within(10).max_connections, 1);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (soft, hard) = raise_open_files_limit().unwrap();
        assert_eq!(soft, hard);
    }
}
