//! Who owns a QP: the process the kernel names (its PID) read from `/proc`, the
//! command (`/proc/PID/comm`) and cgroup (`/proc/PID/cgroup`), and from the cgroup
//! path the Kubernetes pod UID and the container ID when the path names them.
//!
//! Privilege: none beyond seeing the processes. `comm` and `cgroup` are readable by
//! anyone (mode 0444) for every process /proc shows; a /proc mounted with
//! `hidepid=invisible`, or systemd's `ProtectProc=invisible` for a service running as
//! its own user, hides other users' processes, and their QPs then have no owner
//! (nulls, not an error). The PIDs RDMA netlink gives are in the reader's pid
//! namespace: in a container, the host's pid namespace (`hostPID`) is what makes
//! them match the host's processes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What `/proc` says of one PID; every field null when the process is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub comm: Option<String>,
    pub cgroup: Option<String>,
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
}

/// Reads owners under a proc root, each PID once per refresh.
#[derive(Debug)]
pub struct OwnerReader {
    proc_root: PathBuf,
    /// PID -> owner, for the refresh under way: ten thousand QPs usually belong to a
    /// few processes. Cleared by [`OwnerReader::start_refresh`], so that a PID reused
    /// by a new process is read again next time.
    seen: HashMap<u32, Owner>,
}

impl OwnerReader {
    pub fn new(proc_root: impl Into<PathBuf>) -> OwnerReader {
        OwnerReader {
            proc_root: proc_root.into(),
            seen: HashMap::new(),
        }
    }

    /// Forgets the owners read so far.
    pub fn start_refresh(&mut self) {
        self.seen.clear();
    }

    /// The owner of `pid`, from this refresh's reading if there was one.
    pub fn owner(&mut self, pid: u32) -> &Owner {
        let root = &self.proc_root;
        self.seen
            .entry(pid)
            .or_insert_with(|| read_owner(root, pid))
    }
}

/// Reads `comm` and `cgroup` of `pid` under `proc_root`; what cannot be read (the
/// process ended, /proc hides it) is None.
pub fn read_owner(proc_root: &Path, pid: u32) -> Owner {
    let dir = proc_root.join(pid.to_string());
    // Both are bytes to the kernel (a command may name itself anything): not UTF-8
    // is shown with U+FFFD rather than dropped.
    let read = |name: &str| {
        std::fs::read(dir.join(name))
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let comm = read("comm").map(|s| s.trim_end_matches('\n').to_string());
    let cgroup = read("cgroup").and_then(|text| cgroup_path(&text).map(str::to_string));
    let pod_uid = cgroup.as_deref().and_then(pod_uid);
    let container_id = cgroup.as_deref().and_then(container_id);
    Owner {
        comm,
        cgroup,
        pod_uid,
        container_id,
    }
}

/// The process's cgroup path from the text of `/proc/PID/cgroup`
/// (`hierarchy-ID:controllers:path` lines). Under cgroup v2 the one "0::" line.
/// Under v1 or the hybrid layout, the unified "0::" line when it says more than "/"
/// (a hybrid host's runtime may leave the unified hierarchy at its root), else the
/// `name=systemd` line (where systemd and the kubelet's systemd driver put
/// processes), else the first line with a path below the root.
pub fn cgroup_path(text: &str) -> Option<&str> {
    let lines: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            path.starts_with('/').then_some((controllers, path))
        })
        .collect();
    let unified = lines.iter().find(|(c, _)| c.is_empty()).map(|(_, p)| *p);
    if let Some(path) = unified {
        if path != "/" || lines.len() == 1 {
            return Some(path);
        }
    }
    lines
        .iter()
        .find(|(c, _)| c.split(',').any(|c| c == "name=systemd"))
        .or_else(|| lines.iter().find(|(_, p)| *p != "/"))
        .or_else(|| lines.first())
        .map(|(_, p)| *p)
}

/// Kubernetes pod UIDs are UUIDs (36 characters with dashes); a static pod's is the
/// 32 hex digits of a hash. Either way 32 hex digits once dashes are set aside.
fn is_pod_uid(uid: &str) -> bool {
    let hex = uid.chars().filter(|c| *c != '-').count();
    hex == 32 && uid.len() <= 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The pod UID a kubelet cgroup path names: with the systemd driver a slice
/// `kubepods[-QOS]-pod<UID with _ for ->.slice` (any prefix, such as kind's
/// `kubelet-kubepods-...`), with the cgroupfs driver a directory `pod<UID>` below
/// one named `kubepods`. Dashes restored.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    let mut below_kubepods = false;
    for part in cgroup.split('/') {
        if let Some(slice) = part.strip_suffix(".slice") {
            if slice.contains("kubepods") {
                if let Some((_, uid)) = slice.rsplit_once("-pod") {
                    let uid = uid.replace('_', "-");
                    if is_pod_uid(&uid) {
                        return Some(uid);
                    }
                }
            }
            continue;
        }
        if part == "kubepods" {
            below_kubepods = true;
        } else if below_kubepods {
            if let Some(uid) = part.strip_prefix("pod") {
                if is_pod_uid(uid) {
                    return Some(uid.to_string());
                }
            }
        }
    }
    None
}

/// Container runtimes' scope names under systemd: `<prefix><ID>.scope`.
const SCOPE_PREFIXES: [&str; 4] = ["cri-containerd-", "docker-", "crio-", "libpod-"];

fn is_container_id(id: &str) -> bool {
    id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())
}

/// The container ID a cgroup path names: a runtime's scope
/// (`cri-containerd-<ID>.scope`, `docker-<ID>.scope`, `crio-<ID>.scope`,
/// `libpod-<ID>.scope`) or, with the cgroupfs driver, a path element that is an ID
/// itself (64 hex digits). The innermost one counts (a process may sit in a cgroup
/// below its container's).
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup.split('/').rev().find_map(|part| {
        if let Some(scope) = part.strip_suffix(".scope") {
            return SCOPE_PREFIXES.iter().find_map(|prefix| {
                scope
                    .strip_prefix(prefix)
                    .filter(|id| is_container_id(id))
                    .map(str::to_string)
            });
        }
        is_container_id(part).then(|| part.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4d2c8a4b1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c";

    #[test]
    fn the_unified_line_under_cgroup_v2() {
        assert_eq!(
            cgroup_path("0::/system.slice/sshd.service\n"),
            Some("/system.slice/sshd.service")
        );
        assert_eq!(cgroup_path("0::/\n"), Some("/"));
        assert_eq!(cgroup_path(""), None);
        assert_eq!(cgroup_path("garbage\n"), None);
    }

    #[test]
    fn name_systemd_in_the_hybrid_layout() {
        let text = "12:memory:/kubepods/besteffort/pod1\n\
                    1:name=systemd:/kubepods.slice/x.slice\n\
                    0::/\n";
        assert_eq!(cgroup_path(text), Some("/kubepods.slice/x.slice"));
        let v1 = "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n";
        assert_eq!(cgroup_path(v1), Some("/docker/abc"));
        let hybrid_unified = "1:name=systemd:/user.slice\n0::/user.slice/session-1.scope\n";
        assert_eq!(
            cgroup_path(hybrid_unified),
            Some("/user.slice/session-1.scope")
        );
    }

    #[test]
    fn pod_uids_from_both_drivers() {
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod1b2c3d4e_5f6a_4b7c_8d9e_0f1a2b3c4d5e.slice/\
             cri-containerd-{ID}.scope"
        );
        assert_eq!(
            pod_uid(&systemd).as_deref(),
            Some("1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e")
        );
        assert_eq!(container_id(&systemd).as_deref(), Some(ID));
        let guaranteed = "/kubepods.slice/kubepods-pod0f1a2b3c_4d5e_4b7c_8d9e_1b2c3d4e5f6a.slice";
        assert_eq!(
            pod_uid(guaranteed).as_deref(),
            Some("0f1a2b3c-4d5e-4b7c-8d9e-1b2c3d4e5f6a")
        );
        let cgroupfs = format!("/kubepods/burstable/pod0f1a2b3c-4d5e-4b7c-8d9e-1b2c3d4e5f6a/{ID}");
        assert_eq!(
            pod_uid(&cgroupfs).as_deref(),
            Some("0f1a2b3c-4d5e-4b7c-8d9e-1b2c3d4e5f6a")
        );
        assert_eq!(container_id(&cgroupfs).as_deref(), Some(ID));
        let static_pod = "/kubepods/pod6d3f5e0c9a1b2c3d4e5f6a7b8c9d0e1f/x";
        assert_eq!(
            pod_uid(static_pod).as_deref(),
            Some("6d3f5e0c9a1b2c3d4e5f6a7b8c9d0e1f")
        );
        let kind = "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
                    kubelet-kubepods-besteffort-pod0f1a2b3c_4d5e_4b7c_8d9e_1b2c3d4e5f6a.slice";
        assert_eq!(
            pod_uid(kind).as_deref(),
            Some("0f1a2b3c-4d5e-4b7c-8d9e-1b2c3d4e5f6a")
        );
    }

    #[test]
    fn paths_that_name_no_pod_or_container() {
        for path in [
            "/system.slice/sshd.service",
            "/user.slice/user-1000.slice/session-3.scope",
            "/kubepods.slice/kubepods-burstable.slice",
            "/pod1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e",
            "/kubepods/burstable/podnot-a-uid",
            "/",
        ] {
            assert_eq!(pod_uid(path), None, "{path}");
            assert_eq!(container_id(path), None, "{path}");
        }
        assert_eq!(container_id("/system.slice/docker-abc.scope"), None);
        assert_eq!(
            container_id(&format!("/system.slice/docker-{ID}.scope")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id(&format!("/machine.slice/crio-{ID}.scope/container")).as_deref(),
            Some(ID)
        );
    }
}
