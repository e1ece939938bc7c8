//! A bpffs of a test's own, for agents that pin their datapath (`run --pin-dir`).
//!
//! It is mounted on `/run/roce-test-bpf-<pid>x<n>`, outside /sys: `ip netns exec`
//! remounts /sys, and a bpffs mounted inside such a session dies with it (with every
//! pinned link), so agents restarted across sessions would find nothing. Dropping the
//! guard detaches what an agent pinned there (`roce-agent detach`, which detaches the
//! links at once; not for a bpffs that only a test's own loads pin maps on), then
//! unmounts and removes the directory, also when a test fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

/// A mounted bpffs; see the module docs.
#[derive(Debug)]
pub struct Bpffs {
    mount: PathBuf,
    /// The `roce-agent` binary whose `detach` cleans up, if an agent pins there.
    agent_bin: Option<PathBuf>,
}

impl Bpffs {
    /// Mounts one. `agent_bin` is the `roce-agent` binary whose `detach` cleans up.
    pub fn new(agent_bin: &Path) -> Result<Bpffs> {
        let mut fs = Self::for_loads()?;
        fs.agent_bin = Some(agent_bin.to_path_buf());
        Ok(fs)
    }

    /// Mounts one for a test that pins with the loader itself (`loader::load_pinned`)
    /// and attaches nothing: its maps and programs go with the unmount.
    pub fn for_loads() -> Result<Bpffs> {
        static SERIAL: AtomicU32 = AtomicU32::new(0);
        let mount = PathBuf::from(format!(
            "/run/roce-test-bpf-{}x{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&mount).with_context(|| format!("creating {}", mount.display()))?;
        let out = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&mount)
            .output()
            .context("running mount")?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&mount);
            bail!("mount -t bpf: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Bpffs {
            mount,
            agent_bin: None,
        })
    }

    /// The agent's pin directory on it (`--pin-dir`).
    pub fn pin_dir(&self) -> PathBuf {
        self.mount.join("agent")
    }

    /// [`Bpffs::pin_dir`] as an argument.
    pub fn pin_arg(&self) -> String {
        self.pin_dir().display().to_string()
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        if let Some(bin) = &self.agent_bin {
            let _ = Command::new(bin)
                .args(["detach", "--pin-dir"])
                .arg(self.pin_dir())
                .output();
        }
        let _ = Command::new("umount").arg(&self.mount).output();
        let _ = std::fs::remove_dir(&self.mount);
    }
}
