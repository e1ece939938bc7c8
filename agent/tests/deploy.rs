//! The deployable units in `deploy/`: the systemd unit passes `systemd-analyze verify`
//! (also with its commented lines for HTTPS), and the agent runs as an unprivileged user
//! with exactly the capabilities the unit grants (and not with one fewer); the
//! Kubernetes manifest passes the Kubernetes schema, grants the unit's capabilities and
//! nothing else, mounts the files its web config names where it names them, and its
//! command line, configuration, web config (HTTPS, basic auth) and probes work with
//! exactly what its container holds. Also the examples for serving securely:
//! configs/web-config.yml and configs/prometheus/scrape-roce-agent.yml. The agent runs
//! need root (namespaces, setpriv).

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

/// `systemd-analyze verify` of `unit` (its binary pointed at the built one) passes.
fn assert_unit_verifies(unit: &str) {
    let dir = TempDir::new("roce-unit");
    // verify checks that ExecStart's program exists: point it at the built binary.
    let unit = unit.replace("/usr/local/bin/roce-agent", BIN);
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

#[test]
fn systemd_unit_verifies() {
    assert_unit_verifies(&unit_text());
}

/// The unit's commented lines for HTTPS (`#ExecStart=` with `--web-config-file` and
/// `#LoadCredential=` for the key), used as its comment says: the unit still verifies,
/// the command line is the plain one and the flag, and the key's credential is where
/// the comment tells the web config's key_file to point.
#[test]
fn systemd_unit_with_the_web_config_verifies() {
    let text = unit_text();
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in the unit"))
    };
    let plain = line("ExecStart=");
    let https = line("#ExecStart=");
    let web_config = https
        .strip_prefix(plain)
        .and_then(|rest| rest.strip_prefix(" --web-config-file "))
        .unwrap_or_else(|| {
            panic!("the commented ExecStart= is ExecStart= and --web-config-file FILE: {https}")
        });
    let comments = || text.lines().filter(|l| l.starts_with("# "));
    assert!(
        comments().any(|l| l.contains(web_config)),
        "the unit's comment says where {web_config} goes"
    );
    let (name, key) = line("#LoadCredential=")
        .split_once(':')
        .expect("LoadCredential=NAME:PATH");
    assert!(key.starts_with("/etc/roce-agent/"), "{key}");
    let credential = format!("/run/credentials/roce-agent.service/{name}");
    assert!(
        comments().any(|l| l.contains(&credential)),
        "the unit's comment names {credential}"
    );
    // The flag is the agent's.
    let help = Command::new(BIN)
        .args(["run", "--help"])
        .output()
        .expect("roce-agent run --help");
    assert!(String::from_utf8_lossy(&help.stdout).contains("--web-config-file"));

    let unit: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("ExecStart="))
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if rest.starts_with("ExecStart=") || rest.starts_with("LoadCredential=") => {
                rest.to_string()
            }
            _ => l.to_string(),
        })
        .collect();
    assert_unit_verifies(&unit.join("\n"));
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

/// The YAML documents of `text` as JSON, read by PyYAML (which `kubernetes-validate`
/// brings; `cargo xtask setup` installs it). `what` names the text for messages.
fn yaml_docs(text: &str, what: &str) -> Vec<serde_json::Value> {
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(list(yaml.safe_load_all(sys.stdin)), sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), text.as_bytes())
        .expect("writing to python3");
    let out = child.wait_with_output().expect("waiting for python3");
    assert!(
        out.status.success(),
        "python3 with PyYAML could not read {what} (cargo xtask setup installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the YAML as JSON")
}

/// The manifest's documents as JSON.
fn manifest_docs() -> Vec<serde_json::Value> {
    let path = manifest_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    yaml_docs(&text, &path)
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

/// A file the container sees through a ConfigMap or Secret volume.
struct MountedFile {
    /// `configMap` or `secret`.
    source: &'static str,
    /// The ConfigMap's or Secret's name.
    name: String,
    /// The key that is the file.
    key: String,
    /// The directory the volume is mounted at.
    dir: String,
    volume: serde_json::Value,
    mount: serde_json::Value,
    /// The file's text, when the ConfigMap or Secret is in the manifest.
    text: Option<String>,
}

/// What the DaemonSet's agent container is given.
struct Pod {
    /// The container's arguments, `$(VAR)` references left as written.
    args: Vec<String>,
    env: Vec<(String, serde_json::Value)>,
    container: serde_json::Value,
    spec: serde_json::Value,
    /// The DaemonSet's spec.
    daemonset: serde_json::Value,
    template_annotations: serde_json::Value,
    /// The manifest's documents.
    docs: Vec<serde_json::Value>,
    /// The ConfigMap's TOML file by the path the container reads it at.
    config: (String, String),
    /// The web config (`--web-config-file`) by the path the container reads it at.
    web_config: (String, String),
}

impl Pod {
    fn from_manifest() -> Pod {
        let docs = manifest_docs();
        let ds = doc_of_kind(&docs, "DaemonSet");
        let ns = doc_of_kind(&docs, "Namespace");
        let sa = doc_of_kind(&docs, "ServiceAccount");
        let namespace = &ns["metadata"]["name"];
        for d in docs.iter().filter(|d| d["kind"] != "Namespace") {
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
        let mut pod = Pod {
            args,
            env,
            template_annotations: ds["spec"]["template"]["metadata"]["annotations"].clone(),
            daemonset: ds["spec"].clone(),
            container,
            spec,
            docs,
            config: Default::default(),
            web_config: Default::default(),
        };
        // --config FILE: a file of the ConfigMap's volume.
        let config_path = flag(&pod.args, "--config");
        let config = pod.file(&config_path);
        assert_eq!(config.source, "configMap", "--config {config_path}");
        let toml = config.text.unwrap_or_else(|| {
            panic!(
                "the manifest has no ConfigMap {} with {}",
                config.name, config.key
            )
        });
        pod.config = (config_path, toml);
        // --web-config-file FILE: a file of a Secret in the manifest (it holds the
        // users' password hashes).
        let web_path = flag(&pod.args, "--web-config-file");
        let web = pod.file(&web_path);
        assert_eq!(web.source, "secret", "--web-config-file {web_path}");
        let yaml = web
            .text
            .unwrap_or_else(|| panic!("the manifest has no Secret {} with {}", web.name, web.key));
        pod.web_config = (web_path, yaml);
        pod
    }

    /// The file at `path` in the container: the ConfigMap or Secret volume mounted
    /// at the longest directory above it, and its key (the rest of the path).
    fn file(&self, path: &str) -> MountedFile {
        let mount = self.container["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .filter(|m| {
                let dir = m["mountPath"].as_str().expect("mountPath");
                path.strip_prefix(dir)
                    .is_some_and(|rest| rest.starts_with('/'))
            })
            .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))
            .unwrap_or_else(|| panic!("nothing mounted above {path}"))
            .clone();
        let dir = mount["mountPath"].as_str().expect("mountPath").to_string();
        let key = path[dir.len() + 1..].to_string();
        assert!(
            !key.contains('/'),
            "{path}: {key} is not a key of {dir}'s volume"
        );
        let volume = mounted_volume(&self.container, &self.spec, &dir);
        assert!(
            volume["items"].is_null(),
            "{volume}: keys are the file names"
        );
        let (source, kind, name) = if volume["configMap"].is_object() {
            (
                "configMap",
                "ConfigMap",
                volume["configMap"]["name"].clone(),
            )
        } else if volume["secret"].is_object() {
            ("secret", "Secret", volume["secret"]["secretName"].clone())
        } else {
            panic!("{path} is in neither a ConfigMap nor a Secret: {volume}")
        };
        let name = name.as_str().expect("a name").to_string();
        let text = self
            .docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name.as_str())
            .map(|d| {
                let data = if kind == "Secret" {
                    &d["stringData"]
                } else {
                    &d["data"]
                };
                data[&key]
                    .as_str()
                    .unwrap_or_else(|| panic!("the {kind} {name} has no key {key}"))
                    .to_string()
            });
        MountedFile {
            source,
            name,
            key,
            dir,
            volume,
            mount,
            text,
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

    /// (name, port) of the startup, readiness and liveness probes: TCP connections to
    /// the pod IP (the API answers every HTTP request without credentials with 401).
    fn probes(&self) -> Vec<(&'static str, u64)> {
        ["startupProbe", "readinessProbe", "livenessProbe"]
            .into_iter()
            .map(|name| {
                let probe = &self.container[name];
                let tcp = &probe["tcpSocket"];
                assert!(tcp.is_object(), "{name} is a TCP probe: {probe}");
                assert!(
                    tcp["host"].is_null(),
                    "{name}: the kubelet connects to the pod IP"
                );
                (name, self.port(&tcp["port"]))
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
        "secret/roce-agent-web",
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
    // RDMA netlink shows user QPs only within their PID namespace (README, "The QP table").
    assert_eq!(pod.spec["hostPID"], true);
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

/// A bcrypt hash, as basic_auth_users holds them (`$2a$`, `$2b$`, `$2y$`).
fn is_bcrypt_hash(s: &str) -> bool {
    ["$2a$", "$2b$", "$2y$"].iter().any(|p| s.starts_with(p))
}

/// The pod's web config as the agent would read it here: its TLS files (under the
/// TLS volume's mount) written by a throwaway CA into `dir`, with the modes of the
/// volume, and each user's placeholder replaced by the hash of `password`. Returns
/// the web config's path, the CA's certificate and the first user.
fn render_web_config(
    pod: &Pod,
    dir: &std::path::Path,
    password: &str,
    names: &[&str],
) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let web = yaml_docs(&pod.web_config.1, "the web config").remove(0);
    let tls = &web["tls_server_config"];
    let cert = pod.file(tls["cert_file"].as_str().expect("cert_file"));
    let tls_dir = dir.join("tls");
    std::fs::create_dir_all(&tls_dir).expect("mkdir");
    let ca = roce_testkit::pki::TestCa::new("roce-agent test CA");
    let issued = ca.server(names, 7);
    let (crt, key) = issued.write(&tls_dir, "tls");
    assert_eq!(
        crt.file_name().and_then(|n| n.to_str()),
        Some(cert.key.as_str())
    );
    std::fs::write(tls_dir.join("ca.crt"), ca.cert_pem()).expect("writing ca.crt");
    let mode = cert.volume["secret"]["defaultMode"]
        .as_u64()
        .unwrap_or(0o644) as u32;
    for f in [&crt, &key, &tls_dir.join("ca.crt")] {
        let mode = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(mode);
        std::fs::set_permissions(f, mode).expect("chmod");
    }
    let hash = bcrypt::hash(password, 4).expect("bcrypt");
    let users = web["basic_auth_users"]
        .as_object()
        .expect("basic_auth_users");
    let user = users.keys().next().expect("a user").clone();
    let mut text = pod.web_config.1.replace(
        &format!("{}/", cert.dir),
        &format!("{}/", tls_dir.display()),
    );
    for placeholder in users.values() {
        text = text.replace(placeholder.as_str().expect("a hash"), &hash);
    }
    let web_dir = dir.join("web");
    std::fs::create_dir_all(&web_dir).expect("mkdir");
    let key_name = pod.web_config.0.rsplit('/').next().expect("a file name");
    let path = web_dir.join(key_name);
    std::fs::write(&path, text).expect("writing the web config");
    (path, tls_dir.join("ca.crt"), user)
}

#[test]
fn daemonset_serves_https_with_basic_auth_from_its_web_config() {
    let pod = Pod::from_manifest();
    let web = yaml_docs(&pod.web_config.1, "the web config").remove(0);
    // The web config's Secret and the TLS Secret: read-only, for root alone.
    let tls = &web["tls_server_config"];
    let cert = pod.file(
        tls["cert_file"]
            .as_str()
            .expect("tls_server_config.cert_file"),
    );
    let key = pod.file(
        tls["key_file"]
            .as_str()
            .expect("tls_server_config.key_file"),
    );
    let web_file = pod.file(&pod.web_config.0);
    for f in [&cert, &key, &web_file] {
        assert_eq!(f.source, "secret", "{}", f.key);
        assert_eq!(f.mount["readOnly"], true, "{}", f.mount);
        assert_eq!(f.volume["secret"]["defaultMode"], 0o400, "{}", f.volume);
    }
    // A Secret of type kubernetes.io/tls (kubectl create secret tls, cert-manager),
    // made by the operator: no key in the repository.
    assert_eq!(
        (cert.name.as_str(), cert.key.as_str()),
        (key.name.as_str(), "tls.crt")
    );
    assert_eq!(key.key, "tls.key");
    assert!(
        cert.text.is_none(),
        "the manifest carries the TLS Secret {}",
        cert.name
    );
    assert!(
        !pod.docs
            .iter()
            .any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == cert.name.as_str()),
        "the TLS Secret is the operator's"
    );
    // Mutual TLS, switched on or left commented out, takes the client CA from the
    // same Secret.
    let client_ca = tls["client_ca_file"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            pod.web_config.1.lines().find_map(|l| {
                l.trim_start()
                    .strip_prefix("# client_ca_file:")
                    .map(|p| p.trim().to_string())
            })
        });
    let client_ca = pod.file(&client_ca.expect("a client_ca_file, if only in a comment"));
    assert_eq!(
        (client_ca.name.as_str(), client_ca.key.as_str()),
        (cert.name.as_str(), "ca.crt")
    );
    // Users, whose hashes are the operator's to make: the manifest's opens nothing.
    let users = web["basic_auth_users"]
        .as_object()
        .expect("basic_auth_users");
    assert!(!users.is_empty());
    for (user, hash) in users {
        assert!(
            !is_bcrypt_hash(hash.as_str().unwrap_or("")),
            "{user}: a real hash in the manifest"
        );
    }

    // As the agent reads it, with the TLS files and a hash in place.
    let dir = TempDir::new("roce-k8s-web");
    let (path, _, _) = render_web_config(&pod, dir.path(), "pw", &["roce-agent"]);
    let loaded = roce_agent::api::web_config::WebConfig::load(&path)
        .unwrap_or_else(|e| panic!("the manifest's web config: {e}"));
    assert!(loaded.tls.is_some(), "{}", loaded.summary());
    assert_eq!(loaded.users.len(), users.len(), "{}", loaded.summary());

    // Prometheus is told to speak HTTPS to the pod.
    assert_eq!(pod.template_annotations["prometheus.io/scheme"], "https");
    // The TCP probes pass before the programs are attached: a new pod must stay up
    // a while before the rolling update goes on.
    let min_ready = pod.daemonset["minReadySeconds"].as_u64().unwrap_or(0);
    assert!(min_ready >= 10, "minReadySeconds {min_ready}");
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
    for (name, probe_port) in pod.probes() {
        assert_eq!(probe_port, port, "{name}");
    }
    let a = &pod.template_annotations;
    assert_eq!(a["prometheus.io/scrape"], "true");
    assert_eq!(a["prometheus.io/port"], port.to_string());
    assert_eq!(a["prometheus.io/path"], "/metrics");
}

/// The example web config (configs/web-config.yml) loads beside a certificate and key,
/// and its hash is the one of the password its comment gives.
#[test]
fn example_web_config_loads_and_its_password_matches() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/web-config.yml");
    let text = std::fs::read_to_string(example).expect("reading configs/web-config.yml");
    let password = "roce-agent-example";
    assert!(
        text.contains(&format!("password\n# is `{password}`")),
        "the comment gives the password"
    );
    let doc = yaml_docs(&text, example).remove(0);
    let hash = doc["basic_auth_users"]["prometheus"]
        .as_str()
        .expect("the user prometheus");
    assert!(bcrypt::verify(password, hash).expect("a bcrypt hash"));
    assert!(!bcrypt::verify("another", hash).expect("a bcrypt hash"));
    // Relative paths: beside the file.
    let dir = TempDir::new("roce-web-example");
    let ca = roce_testkit::pki::TestCa::new("example CA");
    let tls = &doc["tls_server_config"];
    let (crt, key) = ca.server(&["localhost"], 1).write(dir.path(), "tls");
    assert_eq!(
        tls["cert_file"].as_str(),
        crt.file_name().and_then(|n| n.to_str())
    );
    assert_eq!(
        tls["key_file"].as_str(),
        key.file_name().and_then(|n| n.to_str())
    );
    let path = dir.path().join("web-config.yml");
    std::fs::write(&path, &text).expect("writing the example");
    let loaded = roce_agent::api::web_config::WebConfig::load(&path)
        .unwrap_or_else(|e| panic!("configs/web-config.yml: {e}"));
    assert!(loaded.tls.is_some());
    assert_eq!(loaded.users.len(), 1);
    assert_eq!(loaded.headers.len(), 2);
}

/// configs/prometheus/scrape-roce-agent.yml: every job speaks HTTPS with a CA and
/// basic auth, and Prometheus' own checker passes the file (Debian's promtool has no
/// Kubernetes discovery: the Kubernetes job gets a static target for the check).
#[test]
fn prometheus_scrape_config_speaks_https_with_basic_auth() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/prometheus/scrape-roce-agent.yml"
    );
    let text = std::fs::read_to_string(path).expect("reading the scrape config");
    let mut doc = yaml_docs(&text, path).remove(0);
    let pod = Pod::from_manifest();
    let jobs = doc["scrape_configs"]
        .as_array_mut()
        .expect("scrape_configs");
    assert!(jobs.len() >= 2);
    for job in jobs.iter_mut() {
        let name = job["job_name"].clone();
        assert_eq!(job["scheme"], "https", "{name}");
        assert!(job["tls_config"]["ca_file"].is_string(), "{name}");
        assert!(job["basic_auth"]["username"].is_string(), "{name}");
        assert!(job["basic_auth"]["password_file"].is_string(), "{name}");
        assert!(
            job["basic_auth"]["password"].is_null(),
            "{name}: a password in the file"
        );
        if let Some(obj) = job.as_object_mut() {
            if obj.remove("kubernetes_sd_configs").is_some() {
                // One certificate for every node: the job checks its name.
                assert!(obj["tls_config"]["server_name"].is_string(), "{name}");
                let keeps_port = obj["relabel_configs"]
                    .as_array()
                    .expect("relabel_configs")
                    .iter()
                    .any(|r| {
                        r["source_labels"][0] == "__meta_kubernetes_pod_container_port_name"
                            && r["action"] == "keep"
                            && pod.container["ports"][0]["name"] == r["regex"]
                    });
                assert!(keeps_port, "{name} keeps the container port of the API");
                obj.insert(
                    "static_configs".into(),
                    serde_json::json!([{"targets": ["198.51.100.1:9473"]}]),
                );
            }
        }
    }
    if Command::new("promtool").arg("--version").output().is_err() {
        eprintln!("skipped the promtool check: no promtool (cargo xtask setup installs it)");
        return;
    }
    let dir = TempDir::new("roce-scrape");
    let file = dir.path().join("prometheus.yml");
    // JSON is YAML.
    std::fs::write(&file, doc.to_string()).expect("writing the config");
    let out = Command::new("promtool")
        .args(["check", "config", "--syntax-only"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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

/// `curl` GET `url` in `ns` with `args`: the HTTP status (0: no HTTP answer, e.g. a
/// refused handshake) and the body.
fn curl(ns: &Netns, url: &str, args: &[&str]) -> (u16, Vec<u8>) {
    let mut all = vec!["-s", "--max-time", "5", "-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    all.push(url);
    let out = ns
        .cmd("curl", &all)
        .output()
        .expect("curl (cargo xtask setup installs it)");
    let at = out
        .stdout
        .iter()
        .rposition(|&b| b == b'\n')
        .expect("curl's status line");
    let status = String::from_utf8_lossy(&out.stdout[at + 1..])
        .trim()
        .parse()
        .unwrap_or(0);
    (status, out.stdout[..at].to_vec())
}

/// Whether a TCP connection to `addr` opens in `ns` (what the kubelet's TCP probe does).
fn tcp_opens(ns: &Netns, addr: &str) -> bool {
    let addr: std::net::SocketAddr = addr.parse().expect("IP:PORT");
    ns.enter(|| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok())
        .expect("entering the namespace")
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
    // file where --config points, the web config (its TLS Secret's files made by a
    // throwaway CA for the node's IP, a password's hash in place of the placeholder)
    // where --web-config-file points, and the namespace's veth as the interface.
    let dir = TempDir::new("roce-k8s-run");
    let config = dir.path().join("roce-agent.toml");
    std::fs::write(&config, &pod.config.1).expect("writing the config");
    let config = config.to_str().expect("a UTF-8 path").to_string();
    let password = "probe-and-scrape";
    let (web_config, ca, user) = render_web_config(&pod, dir.path(), password, &[node_ip]);
    let web_config = web_config.to_str().expect("a UTF-8 path").to_string();
    let ca = ca.to_str().expect("a UTF-8 path").to_string();
    let mut args: Vec<String> = pod
        .args
        .iter()
        .map(|a| {
            if *a == pod.config.0 {
                config.clone()
            } else if *a == pod.web_config.0 {
                web_config.clone()
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
    let exited = |agent: &mut Reap| {
        let status = agent.0.try_wait().ok().flatten()?;
        let mut err = String::new();
        if let Some(mut e) = agent.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        Some(format!("the agent exited ({status}) with {caps:?}:\n{err}"))
    };

    // The startup probe's budget: periodSeconds x failureThreshold. The TCP probe
    // passes when the port opens; the agent answers once attached, and that must
    // come within minReadySeconds, or a rolling update would move on too early.
    let startup = &pod.container["startupProbe"];
    let budget = Duration::from_secs(
        startup["periodSeconds"].as_u64().expect("periodSeconds")
            * startup["failureThreshold"]
                .as_u64()
                .expect("failureThreshold"),
    );
    let url = |path: &str| format!("https://{listen}{path}");
    let auth = format!("{user}:{password}");
    let trusted = ["--cacert", ca.as_str()];
    let with_auth = ["--cacert", ca.as_str(), "-u", auth.as_str()];
    let start = Instant::now();
    while !tcp_opens(&ns, &listen) {
        if let Some(why) = exited(&mut agent) {
            panic!("{why}");
        }
        assert!(
            start.elapsed() < budget,
            "the port did not open in {budget:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let opened = Instant::now();
    loop {
        let (status, _) = curl(&ns, &url("/findings"), &with_auth);
        if status == 200 {
            break;
        }
        if let Some(why) = exited(&mut agent) {
            panic!("{why}");
        }
        assert!(
            start.elapsed() < budget,
            "GET /findings: {status} after {budget:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let min_ready = Duration::from_secs(pod.daemonset["minReadySeconds"].as_u64().unwrap_or(0));
    assert!(
        opened.elapsed() < min_ready,
        "the agent answered {:?} after its port opened, minReadySeconds is {min_ready:?}",
        opened.elapsed()
    );
    // Exactly the container's capabilities, and no way to gain more.
    let pid = agent.0.id();
    assert_eq!(status_field(pid, "CapEff"), capability_mask(&caps));
    assert_eq!(status_field(pid, "CapPrm"), capability_mask(&caps));
    assert_eq!(status_field(pid, "CapBnd"), capability_mask(&caps));
    assert_eq!(status_field(pid, "NoNewPrivs"), 1);
    assert!(ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));

    // Every probe, as the kubelet makes it: a connection to the node's IP.
    for (name, port) in pod.probes() {
        assert!(tcp_opens(&ns, &format!("{node_ip}:{port}")), "{name}");
    }
    // Why the probes are not HTTP: without credentials every path is 401, and plain
    // HTTP gets no answer to speak of.
    assert_eq!(curl(&ns, &url("/findings"), &trusted).0, 401);
    let wrong = format!("{user}:not-{password}");
    assert_eq!(
        curl(
            &ns,
            &url("/findings"),
            &["--cacert", ca.as_str(), "-u", wrong.as_str()]
        )
        .0,
        401
    );
    assert_ne!(
        curl(
            &ns,
            &format!("http://{listen}/findings"),
            &["-u", auth.as_str()]
        )
        .0,
        200
    );
    // An untrusted certificate is refused by the client.
    assert_eq!(curl(&ns, &url("/findings"), &["-u", auth.as_str()]).0, 0);
    // The scrape, as Prometheus makes it (scheme https, the CA, basic auth).
    let a = &pod.template_annotations;
    assert_eq!(a["prometheus.io/scheme"], "https");
    let scrape = a["prometheus.io/path"].as_str().expect("a scrape path");
    let (status, metrics) = curl(&ns, &url(scrape), &with_auth);
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&metrics).contains("roce_agent_build_info"));
    // Loopback is not where it listens.
    assert!(
        !tcp_opens(&ns, "127.0.0.1:9473"),
        "the agent listens on loopback too"
    );

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
