//! A network namespace for a test: a name no other test process uses, created with
//! `ip netns add`, deleted (with every link in it) when its guard is dropped, also
//! while a test panics. Nothing here touches the root namespace.
//!
//! ```no_run
//! use roce_testkit::netns::{unique_name, Netns};
//!
//! let (name, _) = unique_name("roce-t-");
//! let ns = Netns::create(name)?;
//! ns.ip(&["link", "add", "va", "type", "veth", "peer", "name", "vb"])?;
//! let sock = ns.enter(|| std::net::UdpSocket::bind("127.0.0.1:0"))??;
//! # drop(sock);
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and `ip` (iproute2).

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{anyhow, bail, Context, Result};

static SERIAL: AtomicU32 = AtomicU32::new(0);

/// `<prefix><pid>x<serial>` and its serial: unique among the namespaces this process
/// names, and among those of other processes running now (the pid). The serial is
/// this process's count of names handed out so far.
pub fn unique_name(prefix: &str) -> (String, u32) {
    let n = SERIAL.fetch_add(1, Ordering::Relaxed);
    (format!("{prefix}{}x{n}", std::process::id()), n)
}

/// The file `ip netns` keeps for namespace `ns`.
pub fn path(ns: &str) -> PathBuf {
    Path::new("/run/netns").join(ns)
}

/// True when a namespace of this name exists.
pub fn exists(ns: &str) -> bool {
    path(ns).exists()
}

/// Runs a command to completion; non-zero exit is an error carrying its stderr.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("could not run {cmd:?} (is it installed?)"))?;
    if !out.status.success() {
        return Err(anyhow!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

/// `ip -n NS args...`; fails (with its stderr) on a non-zero exit.
pub fn ip(ns: &str, args: &[&str]) -> Result<Output> {
    run(Command::new("ip").args(["-n", ns]).args(args))
}

/// A `Command` that runs `program` inside namespace `ns` (`ip netns exec`).
pub fn command(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// Deletes namespace `ns` (with every link in it).
pub fn delete(ns: &str) -> Result<()> {
    run(Command::new("ip").args(["netns", "del", ns])).map(|_| ())
}

/// Runs `f` on a new thread that has entered network namespace `ns` (setns) and
/// returns what it returns: sockets `f` opens live in that namespace. The calling
/// thread stays where it is.
pub fn run_in<T, F>(ns: &str, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let path = path(ns);
    let file = fs::File::open(&path)
        .with_context(|| format!("opening namespace {ns} ({})", path.display()))?;
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            // SAFETY: setns on an open namespace file; it affects this thread only.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!(
                    "entering network namespace {ns}: {}",
                    std::io::Error::last_os_error()
                );
            }
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow!("the thread running in namespace {ns} panicked"))?
    })
}

/// [`run_in`] for a closure that can fail: its error is returned as it is.
pub fn in_namespace<T, F>(ns: &str, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> Result<T> + Send,
{
    run_in(ns, f)?
}

/// A network namespace, deleted (with every link in it) when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
    deleted: bool,
}

impl Netns {
    /// Creates namespace `name` and sets its loopback up.
    pub fn create(name: impl Into<String>) -> Result<Netns> {
        Netns::build(name.into(), true)
    }

    /// Like [`Netns::create`], with IPv6 disabled before any link exists: no router
    /// or neighbour solicitations, no MLD reports, nothing but what a test sends.
    pub fn create_without_ipv6(name: impl Into<String>) -> Result<Netns> {
        Netns::build(name.into(), false)
    }

    fn build(name: String, ipv6: bool) -> Result<Netns> {
        run(Command::new("ip").args(["netns", "add", &name]))?;
        // From here on, an error drops `ns`, which deletes the namespace again.
        let ns = Netns {
            name,
            deleted: false,
        };
        if !ipv6 {
            ns.exec(
                "sysctl",
                &[
                    "-qw",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ],
            )?;
        }
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (for `ip -n` and `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME args...`; fails (with its stderr) on a non-zero exit.
    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        ip(&self.name, args)
    }

    /// A `Command` that runs `program` inside the namespace (`ip netns exec`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command(&self.name, program)
    }

    /// `ip -n NAME args...`, which must succeed (a test step): its stdout. Panics
    /// with the error otherwise.
    pub fn ip_ok(&self, args: &[&str]) -> String {
        match self.ip(args) {
            Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Err(e) => panic!("{e:#}"),
        }
    }

    /// The MTU of `dev` as `ip link` reports it (a test step: panics when it cannot).
    pub fn link_mtu(&self, dev: &str) -> u32 {
        let out = self.ip_ok(&["-o", "link", "show", "dev", dev]);
        let mut words = out.split_whitespace();
        words
            .by_ref()
            .find(|w| *w == "mtu")
            .and_then(|_| words.next())
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no MTU in {out}"))
    }

    /// `program args...` inside the namespace without the caller's RUST_LOG, so the
    /// program logs at its own default level.
    pub fn cmd(&self, program: &str, args: &[&str]) -> Command {
        let mut c = self.command(program);
        c.args(args).env_remove("RUST_LOG");
        c
    }

    /// Runs `program args...` inside the namespace; fails (with its stderr) when it
    /// cannot start or exits non-zero.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<Output> {
        run(self.command(program).args(args)).with_context(|| format!("in namespace {}", self.name))
    }

    /// Runs `f` on a thread inside this namespace (see [`run_in`]).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        run_in(&self.name, f)
    }

    /// Deletes the namespace now, reporting a failure (dropping does the same
    /// silently).
    pub fn delete(mut self) -> Result<()> {
        self.deleted = true;
        delete(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = delete(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn unique_names_differ_and_carry_the_pid() {
        let (a, na) = unique_name("t-");
        let (b, nb) = unique_name("t-");
        assert_ne!(a, b);
        assert!(nb > na);
        assert!(a.starts_with(&format!("t-{}x", std::process::id())));
    }

    #[test]
    fn a_namespace_is_deleted_on_drop_and_entered_on_a_thread() -> Result<()> {
        if !root() {
            eprintln!("skipped: needs root");
            return Ok(());
        }
        let (name, _) = unique_name("roce-tk-");
        let ns = Netns::create_without_ipv6(name.clone())?;
        assert!(exists(&name));
        let lo = ns.exec("cat", &["/proc/sys/net/ipv6/conf/all/disable_ipv6"])?;
        assert_eq!(String::from_utf8_lossy(&lo.stdout).trim(), "1");
        // A socket opened inside sees the namespace's own loopback only.
        let here = std::fs::read_link("/proc/thread-self/ns/net")?;
        let inside = ns.enter(|| std::fs::read_link("/proc/thread-self/ns/net"))??;
        assert_ne!(here, inside);
        assert!(ns.enter::<u8>(|| panic!("deliberate")).is_err());
        drop(ns);
        assert!(!exists(&name));
        Ok(())
    }
}
