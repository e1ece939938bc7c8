//! The deployable units in `deploy/`: the systemd unit passes `systemd-analyze verify`,
//! and the agent runs as an unprivileged user with exactly the capabilities the unit
//! grants (and not with one fewer); the Kubernetes manifest passes the Kubernetes
//! schema, grants the unit's capabilities and nothing else, and its command line,
//! configuration and probes work with exactly what its container holds. The agent
//! runs need root (namespaces, setpriv).

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use roce_testkit::netns::{unique_name, Netns};
use roce_testkit::temp::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_roce-agent");

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn unit_text() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/roce-agent.service");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The capabilities of the unit's AmbientCapabilities=, as setpriv names them.
fn unit_capabilities() -> Vec<String> {
    let text = unit_text();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("the unit grants ambient capabilities");
    line.split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
        .collect()
}

#[test]
fn systemd_unit_verifies() {
    let dir = TempDir::new("roce-unit");
    // verify checks that ExecStart's program exists: point it at the built binary.
    let unit = unit_text().replace("/usr/local/bin/roce-agent", BIN);
    let path = dir.path().join("roce-agent.service");
    std::fs::write(&path, unit).expect("writing the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (package systemd) must be installed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("roce-agent.service"), "{stderr}");
}

/// A bpffs mounted under /run with a pin directory owned by `uid`, as the unit's
/// ExecStartPre (or the node, for the DaemonSet's hostPath) makes it; unmounted (pins
/// and all) on drop.
struct TestBpffs {
    mount: std::path::PathBuf,
}

impl TestBpffs {
    fn new(uid: u32) -> TestBpffs {
        let (name, _) = unique_name("roce-test-bpf-");
        let mount = std::path::PathBuf::from("/run").join(name);
        std::fs::create_dir_all(&mount).expect("creating the mount point");
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&mount)
            .status()
            .expect("mount");
        assert!(st.success(), "mount -t bpf failed");
        let guard = TestBpffs { mount };
        guard.make_pin_dir(uid);
        guard
    }

    /// (Re)makes the pin directory, owned by `uid`.
    fn make_pin_dir(&self, uid: u32) {
        let dir = self.pin_dir();
        std::fs::create_dir_all(&dir).expect("creating the pin directory");
        std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).expect("chown");
    }

    fn pin_dir(&self) -> std::path::PathBuf {
        self.mount.join("agent")
    }
}

impl Drop for TestBpffs {
    fn drop(&mut self) {
        // Unmounting drops every pin: links detach, programs and maps go.
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// The agent under setpriv as nobody, with `caps` as its only capabilities, pinning
/// under `pins` (None: --no-pin).
fn spawn_unprivileged(
    ns: &Netns,
    caps: &[String],
    listen: &str,
    pins: Option<&TestBpffs>,
) -> Child {
    let pin_args = match pins {
        Some(p) => vec!["--pin-dir".to_string(), p.pin_dir().display().to_string()],
        None => vec!["--no-pin".to_string()],
    };
    let set = caps
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(",");
    ns.cmd(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps=-all,{set}"),
            &format!("--ambient-caps=-all,{set}"),
            &format!("--bounding-set=-all,{set}"),
            BIN,
            "run",
            "--iface",
            "va",
            "--mode",
            "enforce",
            "--listen",
            listen,
            "--interval",
            "0.2",
            &pin_args[0],
        ],
    )
    .args(&pin_args[1..])
    .env_remove("RUST_LOG")
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawning setpriv")
}

/// Kills the agent when the test ends, however it ends.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn agent_runs_as_nobody_with_exactly_the_units_capabilities() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces, setpriv)");
        return;
    }
    let caps = unit_capabilities();
    assert_eq!(caps, ["bpf", "net_admin", "perfmon"]);
    let (name, _) = unique_name("roce-t-");
    let ns = Netns::create(name).unwrap_or_else(|e| panic!("creating a namespace: {e:#}"));
    ns.ip_ok(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
    ns.ip_ok(&["link", "set", "va", "up"]);
    ns.ip_ok(&["link", "set", "vb", "up"]);
    let listen = "127.0.0.1:9479";

    let pins = TestBpffs::new(65534);
    let mut agent = Reap(spawn_unprivileged(&ns, &caps, listen, Some(&pins)));
    let start = Instant::now();
    let body = loop {
        let got = ns
            .enter(|| roce_agent::api::client::get_body(listen, "/flows", Duration::from_secs(1)))
            .expect("entering the namespace");
        if let Ok(body) = got {
            break body;
        }
        if let Ok(Some(status)) = agent.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = agent.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("the agent exited ({status}) as nobody with {caps:?}:\n{err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no API after 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let doc: serde_json::Value = serde_json::from_slice(&body).expect("GET /flows is JSON");
    assert!(doc["counters"].is_object(), "{doc}");
    assert!(ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let mut log = String::new();
    if let Some(mut e) = agent.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut log);
    }
    assert!(log.contains("tc QoS programs attached"), "{log}");
    drop(agent);
    // It pinned as nobody: the links outlive it until `detach` (as root here).
    let links = std::fs::read_dir(pins.pin_dir().join("links"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(links, 2, "XDP and tc egress links pinned:\n{log}");
    assert!(ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));
    let out = Command::new(BIN)
        .args(["detach", "--pin-dir"])
        .arg(pins.pin_dir())
        .output()
        .expect("detach");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));

    // One capability fewer: refused at load, with the kernel's reason.
    for missing in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        pins.make_pin_dir(65534);
        let out = spawn_unprivileged(&ns, &fewer, listen, Some(&pins))
            .wait_with_output()
            .expect("waiting for the agent");
        // A refused first start leaves no pin behind (not even the maps it made).
        assert!(!pins.pin_dir().exists(), "pins left without {missing}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "ran without {missing}");
        assert!(
            err.contains("Permission denied") || err.contains("Operation not permitted"),
            "without {missing}: {err}"
        );
    }
    assert!(!ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));
}

// ---------------------------------------------------------------------------------
// Kubernetes: deploy/kubernetes/roce-agent.yaml

fn manifest_path() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/roce-agent.yaml"
    )
    .to_string()
}

/// The manifest's documents as JSON, read by PyYAML (which `kubernetes-validate`
/// brings; `cargo xtask setup` installs it).
fn manifest_docs() -> Vec<serde_json::Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)",
            &manifest_path(),
        ])
        .output()
        .expect("python3 must be installed");
    assert!(
        out.status.success(),
        "python3 with PyYAML could not read the manifest (cargo xtask setup installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the manifest as JSON")
}

fn doc_of_kind(docs: &[serde_json::Value], kind: &str) -> serde_json::Value {
    let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} in the manifest");
    found[0].clone()
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("a list: {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("a string: {s}"))
                .to_string()
        })
        .collect()
}

/// What the DaemonSet's agent container is given.
struct Pod {
    /// The container's arguments, `$(VAR)` references left as written.
    args: Vec<String>,
    env: Vec<(String, serde_json::Value)>,
    container: serde_json::Value,
    spec: serde_json::Value,
    template_annotations: serde_json::Value,
    /// The ConfigMap's TOML file by the path the container reads it at.
    config: (String, String),
}

impl Pod {
    fn from_manifest() -> Pod {
        let docs = manifest_docs();
        let ds = doc_of_kind(&docs, "DaemonSet");
        let cm = doc_of_kind(&docs, "ConfigMap");
        let ns = doc_of_kind(&docs, "Namespace");
        let sa = doc_of_kind(&docs, "ServiceAccount");
        let namespace = &ns["metadata"]["name"];
        for d in [&ds, &cm, &sa] {
            assert_eq!(&d["metadata"]["namespace"], namespace, "{}", d["kind"]);
        }
        let spec = ds["spec"]["template"]["spec"].clone();
        assert_eq!(spec["serviceAccountName"], sa["metadata"]["name"]);
        let containers = spec["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "one container");
        let container = containers[0].clone();
        let args = strings(&container["args"]);
        let env = container["env"]
            .as_array()
            .expect("env")
            .iter()
            .map(|e| (e["name"].as_str().expect("env name").to_string(), e.clone()))
            .collect();
        // --config FILE: a file of the ConfigMap's volume.
        let config_path = flag(&args, "--config");
        let (dir, key) = config_path.rsplit_once('/').expect("--config is a path");
        let volume = mounted_volume(&container, &spec, dir);
        assert_eq!(volume["configMap"]["name"], cm["metadata"]["name"]);
        let toml = cm["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("the ConfigMap has no key {key}"))
            .to_string();
        Pod {
            args,
            env,
            template_annotations: ds["spec"]["template"]["metadata"]["annotations"].clone(),
            container,
            spec,
            config: (config_path, toml),
        }
    }

    fn env(&self, name: &str) -> &serde_json::Value {
        &self
            .env
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} in the container's env"))
            .1
    }

    /// The container's port named or numbered `port` (as a probe gives it).
    fn port(&self, port: &serde_json::Value) -> u64 {
        if let Some(n) = port.as_u64() {
            return n;
        }
        self.container["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == *port)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port {port}"))
    }

    /// (name, path, port) of the startup, readiness and liveness probes.
    fn probes(&self) -> Vec<(&'static str, String, u64)> {
        ["startupProbe", "readinessProbe", "livenessProbe"]
            .into_iter()
            .map(|name| {
                let get = &self.container[name]["httpGet"];
                assert!(
                    get.is_object(),
                    "{name} is an HTTP GET: {}",
                    self.container[name]
                );
                assert!(get["host"].is_null(), "{name}: the kubelet asks the pod IP");
                let path = get["path"].as_str().expect("probe path").to_string();
                (name, path, self.port(&get["port"]))
            })
            .collect()
    }
}

/// The value after `name` in `args`.
fn flag(args: &[String], name: &str) -> String {
    let at = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("no {name} in {args:?}"));
    args.get(at + 1)
        .unwrap_or_else(|| panic!("{name} without a value"))
        .clone()
}

/// The volume the container mounts at `path`.
fn mounted_volume(
    container: &serde_json::Value,
    spec: &serde_json::Value,
    path: &str,
) -> serde_json::Value {
    let mount = mount_at(container, path);
    spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]))
        .clone()
}

fn mount_at(container: &serde_json::Value, path: &str) -> serde_json::Value {
    container["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == path)
        .unwrap_or_else(|| panic!("nothing mounted at {path}"))
        .clone()
}

#[test]
fn kubernetes_manifest_passes_the_schema() {
    // The schemas ship inside the package: no cluster, no network.
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", &manifest_path()])
        .output()
        .expect("python3 must be installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{text}(python3 -m pip install kubernetes-validate, or cargo xtask setup, installs it)"
    );
    for resource in [
        "namespace/roce-agent",
        "serviceaccount/roce-agent",
        "configmap/roce-agent",
        "daemonset/roce-agent",
    ] {
        assert!(
            text.contains(&format!("passed for resource {resource}")),
            "{text}"
        );
    }
}

#[test]
fn daemonset_grants_the_units_capabilities_and_no_privilege() {
    let pod = Pod::from_manifest();
    let sc = &pod.container["securityContext"];
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let added: Vec<String> = strings(&sc["capabilities"]["add"])
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
        .collect();
    assert_eq!(added, unit_capabilities());
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    // Added capabilities are effective in a root process only.
    assert_eq!(sc["runAsUser"], 0);
    assert!(pod.spec["securityContext"]["privileged"].is_null());
    assert_eq!(pod.spec["hostNetwork"], true);
    assert_eq!(pod.spec["automountServiceAccountToken"], false);
    // Every node, whatever its taints.
    let tolerations = pod.spec["tolerations"].as_array().expect("tolerations");
    assert!(
        tolerations
            .iter()
            .any(|t| t["operator"] == "Exists" && t["key"].is_null() && t["effect"].is_null()),
        "{tolerations:?}"
    );
}

#[test]
fn daemonset_mounts_bpffs_sysfs_and_its_config() {
    let pod = Pod::from_manifest();
    // bpffs: the node's, at the agent's default pin directory's parent.
    let bpffs = mount_at(&pod.container, "/sys/fs/bpf");
    assert!(
        ["HostToContainer", "Bidirectional"]
            .contains(&bpffs["mountPropagation"].as_str().unwrap_or("")),
        "{bpffs}"
    );
    assert_ne!(bpffs["readOnly"], true);
    let volume = mounted_volume(&pod.container, &pod.spec, "/sys/fs/bpf");
    assert_eq!(volume["hostPath"]["path"], "/sys/fs/bpf");
    // The node's /sys, read-only, where --sysfs-root says.
    let sysfs_root = flag(&pod.args, "--sysfs-root");
    assert_eq!(mount_at(&pod.container, &sysfs_root)["readOnly"], true);
    let volume = mounted_volume(&pod.container, &pod.spec, &sysfs_root);
    assert_eq!(volume["hostPath"]["path"], "/sys");
    // The ConfigMap's file is a valid configuration (flags add the interface).
    let dir = TempDir::new("roce-k8s-config");
    let path = dir.path().join("roce-agent.toml");
    std::fs::write(&path, &pod.config.1).expect("writing the config");
    let file = roce_agent::config::ConfigFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
    roce_agent::config::Settings::resolve(Some(&file), &Default::default(), true)
        .unwrap_or_else(|e| panic!("the ConfigMap's configuration: {e}"));
    // Memory: a limit, and no CPU limit (a throttled collector falls behind).
    let resources = &pod.container["resources"];
    assert!(resources["limits"]["memory"].is_string(), "{resources}");
    assert!(resources["requests"]["memory"].is_string(), "{resources}");
    assert!(resources["limits"]["cpu"].is_null(), "{resources}");
}

#[test]
fn daemonset_probes_and_scrapes_reach_the_api_on_the_node_ip() {
    let pod = Pod::from_manifest();
    // With hostNetwork the kubelet and Prometheus reach the pod at the node's IP, so
    // the API must listen there, not on loopback.
    let listen = flag(&pod.args, "--listen");
    let (host, port) = listen.rsplit_once(':').expect("--listen HOST:PORT");
    assert_eq!(host, "$(NODE_IP)");
    assert_eq!(
        pod.env("NODE_IP")["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    let port: u64 = port.parse().expect("a port");
    for (name, _, probe_port) in pod.probes() {
        assert_eq!(probe_port, port, "{name}");
    }
    let a = &pod.template_annotations;
    assert_eq!(a["prometheus.io/scrape"], "true");
    assert_eq!(a["prometheus.io/port"], port.to_string());
    assert_eq!(a["prometheus.io/path"], "/metrics");
}

/// The capability mask of `names` (as setpriv names them), as /proc/PID/status
/// shows it.
fn capability_mask(names: &[String]) -> u64 {
    names
        .iter()
        .map(|n| match n.as_str() {
            "net_admin" => 1u64 << 12,
            "perfmon" => 1 << 38,
            "bpf" => 1 << 39,
            other => panic!("no bit known for capability {other}"),
        })
        .fold(0, |a, b| a | b)
}

/// The hexadecimal field `name` of /proc/PID/status.
fn status_field(pid: u32, name: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading its status");
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"));
    u64::from_str_radix(value.trim(), 16).expect("a hexadecimal mask")
}

#[test]
fn daemonset_command_line_runs_with_exactly_the_containers_capabilities() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces, setpriv)");
        return;
    }
    let pod = Pod::from_manifest();
    let caps: Vec<String> = strings(&pod.container["securityContext"]["capabilities"]["add"])
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
        .collect();
    let (name, _) = unique_name("roce-t-");
    let ns = Netns::create(name).unwrap_or_else(|e| panic!("creating a namespace: {e:#}"));
    ns.ip_ok(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
    ns.ip_ok(&["addr", "add", "198.18.0.1/24", "dev", "va"]);
    ns.ip_ok(&["link", "set", "va", "up"]);
    ns.ip_ok(&["link", "set", "vb", "up"]);
    let node_ip = "198.18.0.1";

    // The container's command line, as the kubelet expands it, with the ConfigMap's
    // file where --config points, and the namespace's veth as the interface.
    let dir = TempDir::new("roce-k8s-run");
    let config = dir.path().join("roce-agent.toml");
    std::fs::write(&config, &pod.config.1).expect("writing the config");
    let config = config.to_str().expect("a UTF-8 path").to_string();
    let mut args: Vec<String> = pod
        .args
        .iter()
        .map(|a| {
            if *a == pod.config.0 {
                config.clone()
            } else if a == "/host/sys" {
                // --sysfs-root: the node's /sys is this machine's.
                "/sys".to_string()
            } else {
                a.replace("$(NODE_IP)", node_ip)
            }
        })
        .collect();
    args.extend(["--iface".to_string(), "va".to_string()]);
    // The pod's /sys/fs/bpf is the node's bpffs (hostPath); here one of the test's own.
    let pins = TestBpffs::new(0);
    args.extend([
        "--pin-dir".to_string(),
        pins.pin_dir().display().to_string(),
    ]);
    let listen = flag(&args, "--listen");
    assert_eq!(listen, format!("{node_ip}:9473"));

    // Root with the added capabilities as the only ones, no new privileges: what the
    // runtime gives the container (drop ALL, add, allowPrivilegeEscalation: false).
    let set = caps
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut setpriv = vec![
        "--no-new-privs".to_string(),
        format!("--inh-caps=-all,{set}"),
        format!("--bounding-set=-all,{set}"),
        BIN.to_string(),
    ];
    setpriv.extend(args);
    let setpriv: Vec<&str> = setpriv.iter().map(String::as_str).collect();
    let mut cmd = ns.cmd("setpriv", &setpriv);
    for (name, e) in &pod.env {
        if let Some(v) = e["value"].as_str() {
            cmd.env(name, v);
        }
    }
    let mut agent = Reap(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning setpriv"),
    );

    // The startup probe's budget: periodSeconds x failureThreshold.
    let startup = &pod.container["startupProbe"];
    let budget = Duration::from_secs(
        startup["periodSeconds"].as_u64().expect("periodSeconds")
            * startup["failureThreshold"]
                .as_u64()
                .expect("failureThreshold"),
    );
    let probes = pod.probes();
    let start = Instant::now();
    let (first, first_path, _) = &probes[0];
    loop {
        let got = ns
            .enter(|| {
                roce_agent::api::client::get_body(&listen, first_path, Duration::from_secs(1))
            })
            .expect("entering the namespace");
        if got.is_ok() {
            break;
        }
        if let Ok(Some(status)) = agent.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = agent.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("the agent exited ({status}) with {caps:?}:\n{err}");
        }
        assert!(
            start.elapsed() < budget,
            "{first} failed for {budget:?}: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Exactly the container's capabilities, and no way to gain more.
    let pid = agent.0.id();
    assert_eq!(status_field(pid, "CapEff"), capability_mask(&caps));
    assert_eq!(status_field(pid, "CapPrm"), capability_mask(&caps));
    assert_eq!(status_field(pid, "CapBnd"), capability_mask(&caps));
    assert_eq!(status_field(pid, "NoNewPrivs"), 1);
    assert!(ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));

    // Every probe, and the scrape, as the kubelet and Prometheus ask: the node's IP.
    for (name, path, _) in &probes {
        let body = ns
            .enter(|| roce_agent::api::client::get_body(&listen, path, Duration::from_secs(5)))
            .expect("entering the namespace")
            .unwrap_or_else(|e| panic!("{name} GET {path}: {e}"));
        assert!(!body.is_empty(), "{name}");
    }
    let scrape = pod.template_annotations["prometheus.io/path"]
        .as_str()
        .expect("a scrape path")
        .to_string();
    let metrics = ns
        .enter(|| roce_agent::api::client::get_body(&listen, &scrape, Duration::from_secs(5)))
        .expect("entering the namespace")
        .unwrap_or_else(|e| panic!("GET {scrape}: {e}"));
    assert!(String::from_utf8_lossy(&metrics).contains("roce_agent_build_info"));
    // Loopback is not where it listens.
    let loopback = ns
        .enter(|| {
            roce_agent::api::client::get_body("127.0.0.1:9473", "/findings", Duration::from_secs(1))
        })
        .expect("entering the namespace");
    assert!(loopback.is_err(), "the agent answered on loopback too");

    // SIGTERM, as the kubelet stops a pod: exit 0 within the grace period.
    let grace = Duration::from_secs(
        pod.spec["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds"),
    );
    // SAFETY: kill has no memory preconditions; pid is our child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = agent.0.try_wait().expect("waiting for the agent") {
            break status;
        }
        assert!(
            stopped.elapsed() < grace,
            "still running {grace:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut log = String::new();
    if let Some(mut e) = agent.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut log);
    }
    assert!(status.success(), "{status}: {log}");
}
