//! The `process_*` families of the agent itself, named as the Prometheus client
//! libraries' process collector names them (client_golang's `NewProcessCollector`,
//! client_python's `ProcessCollector`): CPU time, resident and virtual memory, start
//! time, open and maximum file descriptors. prometheus-client 0.26 has no process
//! collector, so they are read here from `/proc/self` at each scrape:
//! `stat` (CPU ticks, start ticks, virtual size, resident pages), `/proc/stat`
//! (`btime`, the boot time), `fd` (one entry per open descriptor) and `limits`
//! (`Max open files`, the soft limit). A file that cannot be read leaves its families
//! out of the scrape; the scrape itself never fails for it.

use std::path::Path;

use super::snapshot::{Kind, Snapshot, Value};

/// The agent's process figures, as one scrape read them (None: not read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, in seconds.
    pub cpu_seconds: Option<f64>,
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    /// The soft limit on open files (None as well when it is unlimited).
    pub max_fds: Option<u64>,
}

/// The fields of `/proc/<pid>/stat` the families need, in the kernel's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StatFields {
    utime_ticks: u64,
    stime_ticks: u64,
    start_ticks: u64,
    vsize_bytes: u64,
    rss_pages: u64,
}

impl ProcessStats {
    /// The figures of this process, from `/proc/self` and `/proc/stat`.
    pub fn read() -> ProcessStats {
        ProcessStats::read_from(Path::new("/proc"), "self", clock_ticks(), page_size())
    }

    /// The figures of process `pid` under `proc_root` (`/proc`), with the clock ticks
    /// per second and the page size of the host.
    fn read_from(proc_root: &Path, pid: &str, clk_tck: u64, page: u64) -> ProcessStats {
        let dir = proc_root.join(pid);
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .map_err(|e| tracing::debug!(path = %path.display(), error = %e, "not read for process_*"))
                .ok()
        };
        let mut stats = ProcessStats::default();
        let ticks = clk_tck.max(1) as f64;
        if let Some(stat) = read(&dir.join("stat")).as_deref().and_then(parse_stat) {
            stats.cpu_seconds =
                Some(stat.utime_ticks.saturating_add(stat.stime_ticks) as f64 / ticks);
            stats.resident_memory_bytes = Some(stat.rss_pages.saturating_mul(page));
            stats.virtual_memory_bytes = Some(stat.vsize_bytes);
            let boot = read(&proc_root.join("stat"))
                .as_deref()
                .and_then(parse_boot_time);
            stats.start_time_seconds = boot.map(|b| b as f64 + stat.start_ticks as f64 / ticks);
        }
        stats.open_fds = std::fs::read_dir(dir.join("fd"))
            .map_err(|e| tracing::debug!(error = %e, "open descriptors not counted"))
            .ok()
            .map(|entries| entries.filter(Result::is_ok).count() as u64);
        stats.max_fds = read(&dir.join("limits"))
            .as_deref()
            .and_then(parse_max_open_files);
        stats
    }

    /// The families, with the client libraries' names, types and help.
    pub(super) fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        let mut one = |name: &str, kind, help: &str, value: Option<Value>| {
            let family = s.family(name, kind, help);
            family.samples.extend(value.map(|v| (Vec::new(), v)));
        };
        one(
            "process_cpu_seconds",
            Kind::Counter,
            "Total user and system CPU time spent in seconds.",
            self.cpu_seconds.map(Value::Float),
        );
        one(
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory size in bytes.",
            self.resident_memory_bytes.map(Value::Int),
        );
        one(
            "process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory size in bytes.",
            self.virtual_memory_bytes.map(Value::Int),
        );
        one(
            "process_start_time_seconds",
            Kind::Gauge,
            "Start time of the process since unix epoch in seconds.",
            self.start_time_seconds.map(Value::Float),
        );
        one(
            "process_open_fds",
            Kind::Gauge,
            "Number of open file descriptors.",
            self.open_fds.map(Value::Int),
        );
        one(
            "process_max_fds",
            Kind::Gauge,
            "Maximum number of open file descriptors.",
            self.max_fds.map(Value::Int),
        );
        s
    }
}

/// The fields of a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces and parentheses itself: the fields are counted
/// from the last `)`.
fn parse_stat(text: &str) -> Option<StatFields> {
    let after = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name: field n is at n - 3.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(StatFields {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the Unix epoch.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits` (None when unlimited).
fn parse_max_open_files(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line whose command name holds a space and a `)`, as `comm` may.
    const STAT: &str = "4242 (roce (agent)) S 1 4242 4242 0 -1 4194560 1500 0 3 0 250 75 0 0 20 0 9 0 123456 987654144 2048 18446744073709551615 1 1 0 0 0 0 0 4096 17663 0 0 0 17 3 0 0 0 0 0\n";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        assert_eq!(
            parse_stat(STAT),
            Some(StatFields {
                utime_ticks: 250,
                stime_ticks: 75,
                start_ticks: 123456,
                vsize_bytes: 987654144,
                rss_pages: 2048,
            })
        );
        assert_eq!(parse_stat("4242 (truncated) S 1 2"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn boot_time_and_open_files_limit() {
        let stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1764800000\nprocesses 7\n";
        assert_eq!(parse_boot_time(stat), Some(1764800000));
        assert_eq!(parse_boot_time("cpu 1\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_open_files(unlimited), None);
    }

    #[test]
    fn a_fixture_proc_tree_gives_every_figure_in_seconds_and_bytes() {
        let root = std::env::temp_dir().join(format!("roce-proc-{}", std::process::id()));
        let dir = root.join("4242");
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        for fd in ["0", "1", "2"] {
            std::fs::write(dir.join("fd").join(fd), "").unwrap();
        }
        std::fs::write(dir.join("stat"), STAT).unwrap();
        std::fs::write(
            dir.join("limits"),
            "Max open files            1024                 524288               files\n",
        )
        .unwrap();
        std::fs::write(root.join("stat"), "btime 1764800000\n").unwrap();
        let stats = ProcessStats::read_from(&root, "4242", 100, 4096);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            stats,
            ProcessStats {
                cpu_seconds: Some(3.25),
                resident_memory_bytes: Some(2048 * 4096),
                virtual_memory_bytes: Some(987654144),
                start_time_seconds: Some(1764800000.0 + 1234.56),
                open_fds: Some(3),
                max_fds: Some(1024),
            }
        );
        // Nothing readable: no figure, no failure.
        let none = ProcessStats::read_from(Path::new("/nonexistent-proc"), "self", 100, 4096);
        assert_eq!(none, ProcessStats::default());
    }

    #[test]
    fn this_process_has_plausible_figures() {
        let stats = ProcessStats::read();
        assert!(stats.resident_memory_bytes.unwrap() > 0, "{stats:?}");
        assert!(
            stats.virtual_memory_bytes.unwrap() >= stats.resident_memory_bytes.unwrap(),
            "{stats:?}"
        );
        assert!(stats.cpu_seconds.unwrap() >= 0.0, "{stats:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = stats.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
        assert!(stats.open_fds.unwrap() >= 3, "{stats:?}");
        assert!(
            stats.max_fds.unwrap() >= stats.open_fds.unwrap(),
            "{stats:?}"
        );
    }
}
