//! A network-namespace lab: two namespaces joined by a veth pair, with a real VXLAN
//! device pair over it, for end-to-end tests, the demo and the benches.
//!
//! ```text
//!   namespace <name>a                              namespace <name>b
//!   ┌──────────────────────────┐                  ┌──────────────────────────┐
//!   │ <ifa>v  vxlan VNI        │                  │ <ifb>v  vxlan VNI        │
//!   │   198.19.N.1/24          │                  │   198.19.N.2/24          │
//!   │ <ifa>   veth ────────────┼──────────────────┼──── <ifb>  veth          │
//!   │   198.18.N.1/24          │                  │   198.18.N.2/24          │
//!   │   2001:db8:N::1/64       │                  │   2001:db8:N::2/64       │
//!   └──────────────────────────┘                  └──────────────────────────┘
//! ```
//!
//! Every name carries the creating process's id and a counter, so labs of parallel
//! tests never collide, and nothing is ever created in (or read from) the root
//! namespace: the veth pair is created inside namespace A with its peer placed
//! directly in namespace B. [`Lab`] is a drop guard: dropping it (also while a test
//! panics) kills the processes it started, and deletes both namespaces, which
//! destroys the links in them. Captures and logs live in a temporary directory that
//! is removed too, unless `ROCE_LAB_KEEP=1` is set (then its path is printed).
//!
//! Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), `ip` (iproute2) and, for
//! captures, `tcpdump`.

use std::collections::HashSet;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::netns::{self, ip, Netns};
pub use crate::netns::{in_namespace, run};

/// The prefix of every namespace a lab creates (`rlab<pid>x<serial>a` / `...b`, see
/// [`netns::unique_name`]).
pub const NS_PREFIX: &str = "rlab";

/// How to build a lab.
#[derive(Clone, Debug)]
pub struct LabOptions {
    /// Create the VXLAN device pair.
    pub vxlan: bool,
    /// VXLAN network identifier.
    pub vni: u32,
    /// `tos inherit` on the VXLAN devices: outer DSCP/ECN copied from the inner
    /// header (inner CE becomes outer ECT(0)). Without it the outer DSCP is 0.
    pub tos_inherit: bool,
    /// Also give the veth ends IPv6 addresses (2001:db8:N::1/2, no DAD).
    pub ipv6: bool,
    /// The VXLAN devices' outer UDP source port range `[min, max)` (`srcport MIN
    /// MAX`); None: the kernel's default, the local port range.
    pub vxlan_srcport: Option<(u16, u16)>,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            vxlan: true,
            vni: 5001,
            tos_inherit: true,
            ipv6: true,
            vxlan_srcport: None,
        }
    }
}

/// One end of the lab: a namespace and what lives in it.
#[derive(Clone, Debug)]
pub struct Side {
    /// Namespace name (for `ip netns exec`).
    pub ns: String,
    /// The veth end in this namespace.
    pub veth: String,
    pub mac: String,
    pub ip4: Ipv4Addr,
    pub ip6: Option<Ipv6Addr>,
    /// The VXLAN device in this namespace (when the lab has one).
    pub vxlan: Option<String>,
    pub vxlan_mac: Option<String>,
    /// The VXLAN device's (inner) address.
    pub vxlan_ip4: Option<Ipv4Addr>,
}

/// A background process started in a namespace. Dropping it kills it.
/// Its stdout and stderr go to files in the lab directory ([`Proc::stdout_path`]).
pub struct Proc {
    name: String,
    child: Option<Child>,
    /// The exit status, once reaped.
    status: Option<ExitStatus>,
    stdout: PathBuf,
    stderr: PathBuf,
    registry: Arc<Mutex<HashSet<u32>>>,
}

impl Proc {
    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn stdout_path(&self) -> &Path {
        &self.stdout
    }

    pub fn stderr_path(&self) -> &Path {
        &self.stderr
    }

    /// What the process wrote to stderr so far (lossy UTF-8; empty when unreadable).
    pub fn stderr_text(&self) -> String {
        fs::read(&self.stderr)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// What the process wrote to stdout so far.
    pub fn stdout_text(&self) -> String {
        fs::read(&self.stdout)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Exit status when the process has already ended, without waiting.
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            None => Ok(self.status),
            Some(c) => {
                let st = c
                    .try_wait()
                    .with_context(|| format!("checking on {}", self.name))?;
                if let Some(st) = st {
                    self.reaped(st);
                    return Ok(Some(st));
                }
                Ok(None)
            }
        }
    }

    /// Waits until `needle` appears in the process's stderr or stdout. Fails when
    /// the process exits first or `timeout` passes; the error carries its stderr.
    pub fn wait_for_output(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.stderr_text().contains(needle) || self.stdout_text().contains(needle) {
                return Ok(());
            }
            if let Some(st) = self.try_status()? {
                bail!(
                    "{} exited ({st}) before printing {needle:?}; its stderr:\n{}",
                    self.name,
                    self.stderr_text()
                );
            }
            if start.elapsed() > timeout {
                bail!(
                    "{} did not print {needle:?} within {timeout:?}; its stderr:\n{}",
                    self.name,
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (e.g. `libc::SIGHUP`) and returns at once.
    pub fn signal(&self, signal: i32) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("{} is not running", self.name))?;
        // SAFETY: kill(2) on a child we have not reaped.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Asks the process to end with `signal` (e.g. `libc::SIGINT`), waits up to
    /// `grace` for it, then kills it. Returns its exit status.
    pub fn stop_with(&mut self, signal: i32, grace: Duration) -> Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            return self
                .status
                .ok_or_else(|| anyhow!("{} was never started", self.name));
        };
        if let Some(st) = child.try_wait()? {
            self.reaped(st);
            return Ok(st);
        }
        // SAFETY: kill(2) on the id of a child we have not reaped yet.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait()? {
                self.reaped(st);
                return Ok(st);
            }
            if start.elapsed() > grace {
                let _ = child.kill();
                let st = child
                    .wait()
                    .with_context(|| format!("waiting for {}", self.name))?;
                self.reaped(st);
                return Ok(st);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then SIGKILL after two seconds.
    pub fn stop(&mut self) -> Result<ExitStatus> {
        self.stop_with(libc::SIGTERM, Duration::from_secs(2))
    }

    /// Waits for the process to end on its own.
    pub fn wait(&mut self) -> Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            return self
                .status
                .ok_or_else(|| anyhow!("{} was never started", self.name));
        };
        let st = child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        self.reaped(st);
        Ok(st)
    }

    fn reaped(&mut self, st: ExitStatus) {
        self.status = Some(st);
        if let Some(c) = self.child.take() {
            if let Ok(mut r) = self.registry.lock() {
                r.remove(&c.id());
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

/// A tcpdump capture running in a namespace.
pub struct Capture {
    proc: Proc,
    path: PathBuf,
}

impl Capture {
    /// Where the pcap is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops tcpdump (SIGINT, so it flushes) and returns the pcap's path. Fails when
    /// tcpdump reports that it captured fewer packets than its filter accepted.
    pub fn finish(mut self) -> Result<PathBuf> {
        // tcpdump drops what it has not read yet when stopped, and packets wait in a
        // ring block for up to its 1 s timeout: let the file settle first (unchanged
        // for 1.5 s; at most 15 s).
        let start = Instant::now();
        let mut last = (u64::MAX, Instant::now());
        while start.elapsed() < Duration::from_secs(15) {
            let len = fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
            if len != last.0 {
                last = (len, Instant::now());
            } else if last.1.elapsed() >= Duration::from_millis(1500) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.proc.stop_with(libc::SIGINT, Duration::from_secs(5))?;
        let log = self.proc.stderr_text();
        let count = |what: &str| -> Option<u64> {
            log.lines()
                .find(|l| l.ends_with(what))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        };
        if let (Some(captured), Some(filtered)) = (
            count("packets captured"),
            count("packets received by filter"),
        ) {
            if captured < filtered {
                bail!(
                    "tcpdump captured {captured} of the {filtered} packets its filter accepted:\n{log}"
                );
            }
        }
        let meta = fs::metadata(&self.path)
            .with_context(|| format!("tcpdump wrote no {}", self.path.display()))?;
        if meta.len() < 24 {
            bail!(
                "capture {} is {} bytes, not even a pcap header; tcpdump said:\n{}",
                self.path.display(),
                meta.len(),
                self.proc.stderr_text()
            );
        }
        Ok(self.path.clone())
    }

    /// What tcpdump wrote on stderr (e.g. "N packets captured").
    pub fn log(&self) -> String {
        self.proc.stderr_text()
    }
}

/// Two namespaces, a veth pair and a VXLAN device pair. See the module docs.
pub struct Lab {
    /// `rlab<pid>x<serial>`: the namespaces are this plus `a` / `b`.
    pub name: String,
    pub a: Side,
    pub b: Side,
    /// The VNI of the VXLAN pair (meaningful when `options.vxlan`).
    pub vni: u32,
    pub options: LabOptions,
    /// Temporary directory for captures and logs.
    pub dir: PathBuf,
    registry: Arc<Mutex<HashSet<u32>>>,
    namespaces: Vec<Netns>,
    keep_dir: bool,
    torn_down: bool,
}

impl Lab {
    /// Builds a lab. On any failure whatever was created so far is removed again.
    pub fn new(options: LabOptions) -> Result<Lab> {
        check_root()?;
        let pid = std::process::id();
        let (name, n) = netns::unique_name(NS_PREFIX);
        // Interface names must fit in 15 bytes; they are private to the namespaces,
        // so a short form is enough (the namespace names carry the full identity).
        let short = format!("rl{}x{}", pid % 1_000_000, n % 1000);
        let octet = (n % 250 + 1) as u8;
        let dir = std::env::temp_dir().join(&name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let side = |tag: &str, host: u8| Side {
            ns: format!("{name}{tag}"),
            veth: format!("{short}{tag}"),
            mac: String::new(),
            ip4: Ipv4Addr::new(198, 18, octet, host),
            ip6: options
                .ipv6
                .then(|| Ipv6Addr::new(0x2001, 0xdb8, octet as u16, 0, 0, 0, 0, host as u16)),
            vxlan: options.vxlan.then(|| format!("{short}{tag}v")),
            vxlan_mac: None,
            vxlan_ip4: options.vxlan.then(|| Ipv4Addr::new(198, 19, octet, host)),
        };
        let mut lab = Lab {
            a: side("a", 1),
            b: side("b", 2),
            name,
            vni: options.vni,
            options,
            dir,
            registry: Arc::new(Mutex::new(HashSet::new())),
            namespaces: Vec::new(),
            keep_dir: std::env::var("ROCE_LAB_KEEP").is_ok_and(|v| v == "1"),
            torn_down: false,
        };
        // On error, `lab` is dropped here and removes what exists.
        lab.build()?;
        Ok(lab)
    }

    fn build(&mut self) -> Result<()> {
        for side in [&self.a, &self.b] {
            self.namespaces.push(Netns::create(side.ns.clone())?);
        }
        let (a, b) = (self.a.clone(), self.b.clone());
        // Created inside A, the peer placed straight into B: never in the root namespace.
        ip(
            &a.ns,
            &[
                "link", "add", &a.veth, "type", "veth", "peer", "name", &b.veth, "netns", &b.ns,
            ],
        )?;
        for side in [&a, &b] {
            address_veth(side)?;
        }
        if self.options.vxlan {
            for (this, peer) in [(&a, &b), (&b, &a)] {
                let (Some(vx), Some(vx_ip)) = (&this.vxlan, this.vxlan_ip4) else {
                    continue;
                };
                let vni = self.vni.to_string();
                let (local, remote) = (this.ip4.to_string(), peer.ip4.to_string());
                let mut args = vec![
                    "link", "add", vx, "type", "vxlan", "id", &vni, "dstport", "4789", "local",
                    &local, "remote", &remote, "dev", &this.veth,
                ];
                if self.options.tos_inherit {
                    args.extend(["tos", "inherit"]);
                }
                let ports = self
                    .options
                    .vxlan_srcport
                    .map(|(min, max)| (min.to_string(), max.to_string()));
                if let Some((min, max)) = &ports {
                    args.extend(["srcport", min, max]);
                }
                ip(&this.ns, &args)?;
                ip(
                    &this.ns,
                    &["addr", "add", &format!("{vx_ip}/24"), "dev", vx],
                )?;
                ip(&this.ns, &["link", "set", vx, "addrgenmode", "none", "up"])?;
            }
        }
        self.a.mac = link_mac(&a.ns, &a.veth)?;
        self.b.mac = link_mac(&b.ns, &b.veth)?;
        if let Some(vx) = &a.vxlan {
            self.a.vxlan_mac = Some(link_mac(&a.ns, vx)?);
        }
        if let Some(vx) = &b.vxlan {
            self.b.vxlan_mac = Some(link_mac(&b.ns, vx)?);
        }
        // Static neighbours: sockets never wait for ARP/ND, and no ARP or ND frame
        // races the first packets of a test.
        for (this, peer) in [(&self.a, &self.b), (&self.b, &self.a)] {
            permanent_neighbour(&this.ns, peer.ip4.into(), &peer.mac, &this.veth)?;
            if let Some(v6) = peer.ip6 {
                permanent_neighbour(&this.ns, v6.into(), &peer.mac, &this.veth)?;
            }
            if let (Some(vx), Some(vip), Some(vmac)) =
                (&this.vxlan, peer.vxlan_ip4, &peer.vxlan_mac)
            {
                permanent_neighbour(&this.ns, vip.into(), vmac, vx)?;
            }
        }
        Ok(())
    }

    /// A `Command` that runs `program` inside namespace `ns` (via `ip netns exec`).
    pub fn command(&self, ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        netns::command(ns, program)
    }

    /// Runs `program args...` in `ns` and returns its output; fails (with its stderr)
    /// when it cannot start or exits non-zero.
    pub fn exec(&self, ns: &str, program: &str, args: &[&str]) -> Result<Output> {
        let mut c = self.command(ns, program);
        c.args(args);
        run(&mut c)
    }

    /// Like [`Lab::exec`] but returns the output whatever the exit status.
    pub fn exec_status(&self, ns: &str, program: &str, args: &[&str]) -> Result<Output> {
        let mut c = self.command(ns, program);
        c.args(args);
        c.output()
            .with_context(|| format!("running {program} in namespace {ns}"))
    }

    /// Starts `cmd` (build it with [`Lab::command`]) in the background; `name` names
    /// its log files. The process is killed when the returned [`Proc`] or the lab
    /// is dropped.
    pub fn spawn(&self, name: &str, mut cmd: Command) -> Result<Proc> {
        let stdout = self.dir.join(format!("{name}.stdout"));
        let stderr = self.dir.join(format!("{name}.stderr"));
        let out =
            fs::File::create(&stdout).with_context(|| format!("creating {}", stdout.display()))?;
        let err =
            fs::File::create(&stderr).with_context(|| format!("creating {}", stderr.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        if let Ok(mut r) = self.registry.lock() {
            r.insert(child.id());
        }
        Ok(Proc {
            name: name.to_string(),
            child: Some(child),
            status: None,
            stdout,
            stderr,
            registry: Arc::clone(&self.registry),
        })
    }

    /// Starts tcpdump on `iface` in `ns`, writing `<lab dir>/<name>.pcap`, and waits
    /// until it listens. `inbound_only` captures what the interface receives only
    /// (`-Q in`), so the receiver's replies (ICMP errors quoting RoCE packets) stay
    /// out. `filter` is a pcap filter expression ("" for everything).
    ///
    /// [`Capture::finish`] checks that tcpdump wrote every packet its kernel filter
    /// accepted; that count includes outgoing packets even with `-Q in`, so with
    /// `inbound_only` let `filter` select inbound packets too (e.g. `dst host B`).
    pub fn capture(
        &self,
        ns: &str,
        iface: &str,
        name: &str,
        inbound_only: bool,
        filter: &str,
    ) -> Result<Capture> {
        let path = self.dir.join(format!("{name}.pcap"));
        let mut cmd = self.command(ns, "tcpdump");
        // Not --immediate-mode: with it, libpcap 1.10 (TPACKET_V3) leaves the last
        // packets of a burst unread in the ring, for good. Without it they reach the
        // file when their ring block retires, within tcpdump's 1 s timeout; `finish`
        // waits for that.
        // A 32 MiB kernel buffer (-B, in KiB) instead of libpcap's 2 MiB: a flood of
        // small frames on a busy machine must not overflow it before tcpdump runs.
        cmd.args(["-i", iface, "-n", "-U", "-s", "0", "-B", "32768", "-w"])
            .arg(&path);
        // Not the `inbound` filter primitive: with it, libpcap 1.10 loses the first
        // packet after start-up.
        if inbound_only {
            cmd.args(["-Q", "in"]);
        }
        if !filter.is_empty() {
            cmd.arg(filter);
        }
        let mut proc = self
            .spawn(&format!("tcpdump-{name}"), cmd)
            .context("starting tcpdump (is it installed? `cargo xtask setup`)")?;
        proc.wait_for_output("listening on", Duration::from_secs(10))?;
        Ok(Capture { proc, path })
    }

    /// The exposition `GET http://API/metrics` serves in `ns` (curl).
    pub fn scrape(&self, ns: &str, api: &str) -> Result<String> {
        let out = self.exec(ns, "curl", &["-sf", &format!("http://{api}/metrics")])?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The sampled events of the agent at `api` in `ns`, as the kernel counted them
    /// and as the EVENTS ring's positions say (see [`EventsAccount`]).
    pub fn events_account(
        &self,
        ns: &str,
        api: &str,
        doc: &serde_json::Value,
    ) -> Result<EventsAccount> {
        let text = self.scrape(ns, api)?;
        let ring = |name: &str| {
            crate::prom::value(&text, name)
                .map(|v| v as u64)
                .with_context(|| format!("no {name} in /metrics"))
        };
        let emitted = doc["counters"]["events"]
            .as_object()
            .context("no counters.events in the flows document")?
            .values()
            .filter_map(serde_json::Value::as_u64)
            .sum();
        Ok(EventsAccount {
            emitted,
            written: ring("roce_agent_events_ring_written_total")?,
            read: ring("roce_agent_events_ring_read_total")?,
        })
    }

    /// Polls [`Lab::events_account`] (with a document from `doc` each time) until some
    /// events were emitted and all are read, for up to `timeout`; returns the last
    /// account, read or not, for the caller to judge.
    pub fn events_read(
        &self,
        ns: &str,
        api: &str,
        mut doc: impl FnMut() -> Result<serde_json::Value>,
        timeout: Duration,
    ) -> Result<EventsAccount> {
        let deadline = Instant::now() + timeout;
        loop {
            let account = self.events_account(ns, api, &doc()?)?;
            if (account.emitted > 0 && account.all_read()) || Instant::now() > deadline {
                return Ok(account);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts `roce-agent run ARGS` (the binary `agent`) in `ns` as process `name`,
    /// logging at info level without colours, and waits until it serves its API.
    pub fn start_agent<S: AsRef<std::ffi::OsStr>>(
        &self,
        ns: &str,
        agent: &Path,
        name: &str,
        args: &[S],
    ) -> Result<Proc> {
        self.start_agent_with_env(ns, agent, name, args, &[])
    }

    /// [`Lab::start_agent`] with environment variables `env` set for the agent (the
    /// test knobs, such as `ROCE_AGENT_TC_MECHANISM`).
    pub fn start_agent_with_env<S: AsRef<std::ffi::OsStr>>(
        &self,
        ns: &str,
        agent: &Path,
        name: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let mut cmd = self.command(ns, agent);
        cmd.arg("run")
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied());
        let mut proc = self.spawn(name, cmd)?;
        proc.wait_for_output("serving GET /flows", Duration::from_secs(30))?;
        Ok(proc)
    }

    /// Deletes the veth pair (both ends go, as when a NIC or VF goes away) and makes
    /// it again with the same names, MACs and addresses: a new pair of ifindexes. Labs
    /// without VXLAN only (the VXLAN devices would lose their underlay).
    pub fn recreate_veth(&self) -> Result<()> {
        if self.options.vxlan {
            bail!("recreate_veth: the VXLAN devices sit on the veth pair");
        }
        let (a, b) = (&self.a, &self.b);
        ip(&a.ns, &["link", "del", &a.veth])?;
        ip(
            &a.ns,
            &[
                "link", "add", &a.veth, "address", &a.mac, "type", "veth", "peer", "name", &b.veth,
                "address", &b.mac, "netns", &b.ns,
            ],
        )?;
        for side in [a, b] {
            address_veth(side)?;
        }
        for (this, peer) in [(a, b), (b, a)] {
            permanent_neighbour(&this.ns, peer.ip4.into(), &peer.mac, &this.veth)?;
            if let Some(v6) = peer.ip6 {
                permanent_neighbour(&this.ns, v6.into(), &peer.mac, &this.veth)?;
            }
        }
        Ok(())
    }

    /// Removes everything: kills the processes still running, deletes the
    /// namespaces (and with them the links), removes the directory unless kept.
    /// Idempotent; also run on drop. Returns the first error, after trying all.
    pub fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let pids: Vec<u32> = match self.registry.lock() {
            Ok(mut r) => r.drain().collect(),
            Err(_) => Vec::new(),
        };
        for pid in &pids {
            // SAFETY: kill(2) on processes this lab started and has not reaped.
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            }
        }
        for pid in &pids {
            let mut st = 0;
            // SAFETY: reaps our own child; WNOHANG-free wait after SIGKILL is brief.
            unsafe {
                libc::waitpid(*pid as libc::pid_t, &mut st, 0);
            }
        }
        let mut first_err = None;
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = ns.delete() {
                first_err.get_or_insert(e);
            }
        }
        if self.keep_dir {
            eprintln!("lab {}: keeping {}", self.name, self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Namespaces named like a lab's (`rlab<pid>x<n>a|b`) whose creating process no
    /// longer runs: left behind by a lab that was SIGKILLed. Deletes them and
    /// returns their names.
    pub fn remove_stale() -> Result<Vec<String>> {
        let out = run(Command::new("ip").args(["netns", "list"]))?;
        let mut removed = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(ns) = line.split_whitespace().next() else {
                continue;
            };
            let Some(rest) = ns.strip_prefix(NS_PREFIX) else {
                continue;
            };
            let Some((pid, _)) = rest.split_once('x') else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else {
                continue;
            };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            netns::delete(ns)?;
            removed.push(ns.to_string());
        }
        Ok(removed)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("lab {}: teardown: {e:#}", self.name);
        }
    }
}

/// True when a namespace of this name exists.
pub fn namespace_exists(ns: &str) -> bool {
    netns::exists(ns)
}

fn check_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the namespace lab needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN): run as root");
    }
    Ok(())
}

/// A permanent neighbour entry in `ns`: `addr` is at `mac` on `dev`.
/// Gives a side's veth its addresses and sets it up.
fn address_veth(side: &Side) -> Result<()> {
    ip(
        &side.ns,
        &[
            "addr",
            "add",
            &format!("{}/24", side.ip4),
            "dev",
            &side.veth,
        ],
    )?;
    if let Some(v6) = side.ip6 {
        let v6 = format!("{v6}/64");
        ip(
            &side.ns,
            &["-6", "addr", "add", &v6, "dev", &side.veth, "nodad"],
        )?;
    }
    // No IPv6 link-local address: no router solicitations or MLD reports adding
    // noise to the counters (neighbours are static).
    ip(
        &side.ns,
        &["link", "set", &side.veth, "addrgenmode", "none", "up"],
    )?;
    Ok(())
}

fn permanent_neighbour(ns: &str, addr: IpAddr, mac: &str, dev: &str) -> Result<()> {
    let family = if addr.is_ipv6() { "-6" } else { "-4" };
    let addr = addr.to_string();
    let args = [
        family,
        "neigh",
        "replace",
        &addr,
        "lladdr",
        mac,
        "dev",
        dev,
        "nud",
        "permanent",
    ];
    ip(ns, &args).map(|_| ())
}

/// The MAC address of `link` in `ns`.
fn link_mac(ns: &str, link: &str) -> Result<String> {
    let out = ip(ns, &["-j", "link", "show", "dev", link])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("parsing `ip -j link show {link}`"))?;
    v.get(0)
        .and_then(|l| l.get("address"))
        .and_then(|a| a.as_str())
        .map(str::to_string)
        .ok_or_else(|| anyhow!("`ip -j link show {link}` in {ns} printed no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn lab_builds_connects_and_leaves_nothing_behind() -> Result<()> {
        if !root() {
            eprintln!("skipped: needs root");
            return Ok(());
        }
        let lab = Lab::new(LabOptions::default())?;
        let (na, nb) = (lab.a.ns.clone(), lab.b.ns.clone());
        assert!(namespace_exists(&na) && namespace_exists(&nb));
        let vx_b = lab.b.vxlan_ip4.ok_or_else(|| anyhow!("no vxlan"))?;
        for dst in [lab.b.ip4, vx_b] {
            let rx = in_namespace(&nb, move || {
                let s = std::net::UdpSocket::bind((dst, 9999))?;
                s.set_read_timeout(Some(Duration::from_secs(3)))?;
                Ok(s)
            })?;
            in_namespace(&na, move || {
                let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
                s.send_to(b"lab", (dst, 9999))?;
                Ok(())
            })?;
            let mut buf = [0u8; 16];
            let (n, _) = rx.recv_from(&mut buf).context("nothing arrived")?;
            assert_eq!(&buf[..n], b"lab", "via {dst}");
        }
        let dir = lab.dir.clone();
        drop(lab);
        assert!(!namespace_exists(&na) && !namespace_exists(&nb));
        assert!(!dir.exists());
        Ok(())
    }

    #[test]
    fn a_finished_process_keeps_its_exit_status() -> Result<()> {
        if !root() {
            return Ok(());
        }
        let lab = Lab::new(LabOptions {
            vxlan: false,
            ipv6: false,
            ..LabOptions::default()
        })?;
        let mut p = lab.spawn("false", lab.command(&lab.a.ns, "false"))?;
        let start = Instant::now();
        while p.try_status()?.is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "false never ended"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        for _ in 0..2 {
            assert_eq!(p.try_status()?.map(|s| s.success()), Some(false));
        }
        assert!(!p.wait()?.success());
        Ok(())
    }

    #[test]
    fn lab_cleans_up_when_a_test_panics() {
        if !root() {
            return;
        }
        let names = Arc::new(Mutex::new(None));
        let n2 = Arc::clone(&names);
        let r = std::thread::spawn(move || {
            let lab = Lab::new(LabOptions::default()).expect("lab");
            let sleeper = lab
                .spawn("sleep", {
                    let mut c = lab.command(&lab.b.ns, "sleep");
                    c.arg("60");
                    c
                })
                .expect("spawn");
            *n2.lock().expect("lock") = Some((lab.a.ns.clone(), lab.b.ns.clone(), sleeper.pid()));
            std::mem::forget(sleeper); // the lab, not the Proc, must kill it
            panic!("deliberate");
        })
        .join();
        assert!(r.is_err());
        let (na, nb, pid) = names.lock().expect("lock").clone().expect("names");
        assert!(!namespace_exists(&na) && !namespace_exists(&nb));
        let pid = pid.expect("pid");
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z"),
            "sleep {pid} still runs"
        );
    }
}

/// Locating and building the project's binaries, for tests and the demo.
pub mod bins {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::SystemTime;

    use anyhow::{bail, Context, Result};

    /// The workspace root (this crate's parent directory).
    pub fn workspace_root() -> PathBuf {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        here.parent().unwrap_or(here).to_path_buf()
    }

    /// The cargo target directory (`CARGO_TARGET_DIR` or `<root>/target`).
    pub fn target_dir() -> PathBuf {
        match std::env::var_os("CARGO_TARGET_DIR") {
            Some(d) => PathBuf::from(d),
            None => workspace_root().join("target"),
        }
    }

    /// The packages whose binaries the lab runs: `roce-agent` (the agent) and
    /// `roce-testkit` (`roce-gen`).
    pub const PACKAGES: [&str; 2] = ["roce-agent", "roce-testkit"];

    /// The binaries the lab runs.
    pub const BINARIES: [&str; 2] = ["roce-agent", "roce-gen"];

    /// Builds the lab's binaries (`roce-agent`, `roce-gen`; see [`PACKAGES`]) with
    /// cargo and returns the directory holding them.
    pub fn build_agent(release: bool) -> Result<PathBuf> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root()).arg("build");
        for p in PACKAGES {
            cmd.args(["-p", p]);
        }
        cmd.arg("--bins");
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
        if !status.success() {
            bail!("{cmd:?} failed ({status})");
        }
        Ok(target_dir().join(if release { "release" } else { "debug" }))
    }

    fn newest_source(root: &Path) -> Option<SystemTime> {
        let mut newest = None;
        let mut stack: Vec<PathBuf> = ["agent", "common", "ebpf", "testkit"]
            .iter()
            .map(|d| root.join(d))
            .collect();
        while let Some(p) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                if let Ok(rd) = std::fs::read_dir(&p) {
                    stack.extend(rd.filter_map(|e| e.ok().map(|e| e.path())));
                }
            } else if let Ok(m) = meta.modified() {
                if newest.is_none_or(|n| m > n) {
                    newest = Some(m);
                }
            }
        }
        newest
    }

    /// The directory of up-to-date `roce-agent` and `roce-gen` binaries for a test:
    /// the profile directory of the running test executable (`target/<profile>`) when
    /// both binaries there are newer than every source file of agent/, common/, ebpf/
    /// and testkit/; otherwise they are built first (`cargo build -p roce-agent -p
    /// roce-testkit --bins`, in the same profile).
    pub fn agent_bins_for_test() -> Result<PathBuf> {
        let exe = std::env::current_exe().context("locating the test executable")?;
        // target/<profile>/deps/<test>-<hash>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| target_dir().join("release"));
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let newest = newest_source(&workspace_root());
        let fresh = BINARIES.iter().all(|b| {
            let m = std::fs::metadata(profile_dir.join(b)).and_then(|m| m.modified());
            match (m, newest) {
                (Ok(m), Some(n)) => m >= n,
                (Ok(_), None) => true,
                (Err(_), _) => false,
            }
        });
        if fresh {
            return Ok(profile_dir);
        }
        build_agent(release)?;
        Ok(profile_dir)
    }
}

/// Flow tables from the agent, the generator and tshark, in one shape, and their
/// comparison. The agent's document (`roce-agent flows --json`) and roce-gen's report
/// (`roce-gen --json`) use the same field names; tshark's decode of a capture is
/// grouped into the same flows (outer addresses + VNI + inner addresses + QP).
pub mod oracle {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::net::IpAddr;
    use std::path::Path;

    use anyhow::{anyhow, bail, Context, Result};
    use serde_json::Value;

    use crate::tshark;

    /// One direction of one queue pair: what the agent keys a flow by (without the
    /// interface and direction).
    #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct FlowId {
        pub src: String,
        pub dst: String,
        pub vni: Option<u32>,
        pub inner_src: Option<String>,
        pub inner_dst: Option<String>,
        pub dest_qp: u32,
    }

    impl fmt::Display for FlowId {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}->{}", self.src, self.dst)?;
            if let Some(v) = self.vni {
                write!(f, " vni {v}")?;
            }
            if let (Some(s), Some(d)) = (&self.inner_src, &self.inner_dst) {
                write!(f, " inner {s}->{d}")?;
            }
            write!(f, " qp {:#x}", self.dest_qp)
        }
    }

    /// ECN codepoint counts.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Ecn {
        pub not_ect: u64,
        pub ect1: u64,
        pub ect0: u64,
        pub ce: u64,
    }

    impl Ecn {
        fn add(&mut self, codepoint: u64) {
            match codepoint & 3 {
                0 => self.not_ect += 1,
                1 => self.ect1 += 1,
                2 => self.ect0 += 1,
                _ => self.ce += 1,
            }
        }
        fn from_json(v: &Value) -> Result<Ecn> {
            let g = |k: &str| {
                v.get(k)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| anyhow!("ECN object without {k}: {v}"))
            };
            Ok(Ecn {
                not_ect: g("not_ect")?,
                ect1: g("ect1")?,
                ect0: g("ect0")?,
                ce: g("ce")?,
            })
        }
    }

    /// A flow's counters. `psn_gaps` is None where the source cannot tell (tshark).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct FlowCounts {
        pub family: String,
        pub inner_family: Option<String>,
        pub sport: u16,
        pub packets: u64,
        pub bytes: u64,
        pub ecn: Ecn,
        pub inner_ecn: Option<Ecn>,
        pub cnps: u64,
        pub acks: u64,
        pub naks: u64,
        pub rnr_naks: u64,
        pub psn_gaps: Option<u64>,
        pub last_dscp: u8,
    }

    /// Flows by identity.
    pub type FlowTable = BTreeMap<FlowId, FlowCounts>;

    fn norm_ip(s: &str) -> String {
        s.parse::<IpAddr>()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| s.to_string())
    }

    fn str_field(f: &Value, k: &str) -> Result<Option<String>> {
        match f.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => bail!("field {k} is not a string: {other}"),
        }
    }

    fn u64_field(f: &Value, k: &str) -> Result<u64> {
        f.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("flow without numeric {k}: {f}"))
    }

    /// Parses one flow object of the agent's document or roce-gen's report.
    pub fn flow_from_json(f: &Value) -> Result<(FlowId, FlowCounts)> {
        let id = FlowId {
            src: norm_ip(&str_field(f, "src")?.ok_or_else(|| anyhow!("flow without src"))?),
            dst: norm_ip(&str_field(f, "dst")?.ok_or_else(|| anyhow!("flow without dst"))?),
            vni: f.get("vni").and_then(Value::as_u64).map(|v| v as u32),
            inner_src: str_field(f, "inner_src")?.map(|s| norm_ip(&s)),
            inner_dst: str_field(f, "inner_dst")?.map(|s| norm_ip(&s)),
            dest_qp: u64_field(f, "dest_qp")? as u32,
        };
        let counts = FlowCounts {
            family: str_field(f, "family")?.unwrap_or_default(),
            inner_family: str_field(f, "inner_family")?,
            sport: u64_field(f, "sport")? as u16,
            packets: u64_field(f, "packets")?,
            bytes: u64_field(f, "bytes")?,
            ecn: Ecn::from_json(f.get("ecn").unwrap_or(&Value::Null))?,
            inner_ecn: match f.get("inner_ecn") {
                None | Some(Value::Null) => None,
                Some(v) => Some(Ecn::from_json(v)?),
            },
            cnps: u64_field(f, "cnps")?,
            acks: u64_field(f, "acks")?,
            naks: u64_field(f, "naks")?,
            rnr_naks: u64_field(f, "rnr_naks")?,
            psn_gaps: f.get("psn_gaps").and_then(Value::as_u64),
            last_dscp: u64_field(f, "last_dscp")? as u8,
        };
        Ok((id, counts))
    }

    /// The flows of a document with a `"flows"` array, keeping those `keep` accepts
    /// (e.g. one interface and direction of the agent's table).
    pub fn flows_from_doc(doc: &Value, keep: impl Fn(&Value) -> bool) -> Result<FlowTable> {
        let flows = doc
            .get("flows")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("document without a flows array"))?;
        let mut out = FlowTable::new();
        for f in flows.iter().filter(|f| keep(f)) {
            let (id, c) = flow_from_json(f)?;
            if out.insert(id.clone(), c).is_some() {
                bail!("flow {id} appears twice");
            }
        }
        Ok(out)
    }

    /// Decodes `pcap` with tshark and groups its RoCEv2 packets (plain and in VXLAN)
    /// into flows. Only IPv4 or IPv6 in one layer each is needed: the families of
    /// each layer come from `frame.protocols`.
    pub fn tshark_flows(pcap: &Path) -> Result<FlowTable> {
        const FIELDS: [&str; 16] = [
            "frame.protocols",
            "frame.len",
            "ip.src",
            "ip.dst",
            "ip.dsfield.dscp",
            "ip.dsfield.ecn",
            "ipv6.src",
            "ipv6.dst",
            "ipv6.tclass.dscp",
            "ipv6.tclass.ecn",
            "udp.srcport",
            "vxlan.vni",
            "infiniband.bth.opcode",
            "infiniband.bth.destqp",
            "infiniband.aeth.syndrome",
            "frame.number",
        ];
        let rows = tshark::Fields::new(&FIELDS)
            .filter("infiniband")
            .run(pcap)?;
        let mut table = FlowTable::new();
        for row in &rows {
            let line = &row.line;
            let list = |i: usize| row.all(i);
            let num = |s: &str| tshark::number(s).with_context(|| format!("in {line:?}"));
            // Families of the IP layers, outermost first.
            let fams: Vec<bool> = row
                .first(0)
                .unwrap_or_default()
                .split(':')
                .filter_map(|p| match p {
                    "ip" => Some(false),
                    "ipv6" => Some(true),
                    _ => None,
                })
                .collect();
            let (mut i4, mut i6) = (0usize, 0usize);
            // (src, dst, dscp, ecn) per layer.
            let mut layers = Vec::new();
            for v6 in &fams {
                let (base, idx) = if *v6 { (6, &mut i6) } else { (2, &mut i4) };
                let pick = |c: usize| list(c).get(*idx).cloned();
                let (Some(s), Some(d), Some(dscp), Some(ecn)) =
                    (pick(base), pick(base + 1), pick(base + 2), pick(base + 3))
                else {
                    bail!("tshark line without a complete IP layer: {line:?}");
                };
                *idx += 1;
                layers.push((norm_ip(&s), norm_ip(&d), num(&dscp)?, num(&ecn)?, *v6));
            }
            let vni = row.first(11).map(num).transpose()?;
            let tunnelled = vni.is_some();
            if layers.len() != if tunnelled { 2 } else { 1 } {
                bail!("unexpected IP layers in {line:?}");
            }
            let opcode = row
                .last(12)
                .map(num)
                .transpose()?
                .ok_or_else(|| anyhow!("no opcode in {line:?}"))?;
            let qp = row
                .last(13)
                .map(num)
                .transpose()?
                .ok_or_else(|| anyhow!("no destination QP in {line:?}"))?;
            let sport = row
                .last(10)
                .map(num)
                .transpose()?
                .ok_or_else(|| anyhow!("no UDP source port in {line:?}"))?;
            let outer = &layers[0];
            let inner = layers.get(1);
            let id = FlowId {
                src: outer.0.clone(),
                dst: outer.1.clone(),
                vni: vni.map(|v| v as u32),
                inner_src: inner.map(|l| l.0.clone()),
                inner_dst: inner.map(|l| l.1.clone()),
                dest_qp: qp as u32,
            };
            let fam = |v6: bool| if v6 { "ipv6" } else { "ipv4" }.to_string();
            let c = table.entry(id).or_insert_with(|| FlowCounts {
                family: fam(outer.4),
                inner_family: inner.map(|l| fam(l.4)),
                inner_ecn: inner.map(|_| Ecn::default()),
                ..Default::default()
            });
            c.packets += 1;
            c.bytes += row
                .first(1)
                .map(num)
                .transpose()?
                .ok_or_else(|| anyhow!("no frame length in {line:?}"))?;
            c.sport = sport as u16;
            c.ecn.add(outer.3);
            c.last_dscp = outer.2 as u8;
            if let (Some(ie), Some(l)) = (c.inner_ecn.as_mut(), inner) {
                ie.add(l.3);
            }
            match opcode {
                128 | 129 => c.cnps += 1,
                17 | 177 => {
                    if let Some(s) = row.last(14) {
                        match num(s)? >> 5 {
                            0 => c.acks += 1,
                            1 => c.rnr_naks += 1,
                            3 => c.naks += 1,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(table)
    }

    /// Every difference between two tables, as readable lines (empty when equal).
    /// `psn_gaps` is compared only where both sides know it.
    pub fn differences(
        left_name: &str,
        left: &FlowTable,
        right_name: &str,
        right: &FlowTable,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for (id, l) in left {
            match right.get(id) {
                None => out.push(format!("flow {id}: in {left_name}, not in {right_name}")),
                Some(r) => {
                    let mut l = l.clone();
                    let mut r = r.clone();
                    if l.psn_gaps.is_none() || r.psn_gaps.is_none() {
                        l.psn_gaps = None;
                        r.psn_gaps = None;
                    }
                    if l != r {
                        out.push(format!(
                            "flow {id}:\n    {left_name}: {l:?}\n    {right_name}: {r:?}"
                        ));
                    }
                }
            }
        }
        for id in right.keys() {
            if !left.contains_key(id) {
                out.push(format!("flow {id}: in {right_name}, not in {left_name}"));
            }
        }
        out
    }
}

/// Sampled events: those the kernel programs emitted (`counters.events`, summed), the
/// records the EVENTS ring says were written into it and read out of it. All three
/// live in pinned maps, so they continue across agent restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventsAccount {
    pub emitted: u64,
    pub written: u64,
    pub read: u64,
}

impl EventsAccount {
    /// Every emitted event is in the ring and every record in it was read.
    pub fn all_read(&self) -> bool {
        self.emitted == self.written && self.read == self.written
    }
}
