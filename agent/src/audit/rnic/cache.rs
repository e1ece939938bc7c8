//! The RDMA ports as a running agent audits them every interval: the GID tables kept
//! between rounds, the rest read each round.
//!
//! A GID table is read slot by slot (`gid_attrs/ndevs/IDX`: 256 slots a port on mlx5,
//! 1024 on rxe), by far the most the audit reads. In the VM lab (TCG, two rxe ports)
//! reading both tables every second took about a third of a vCPU of an otherwise idle
//! agent, enough to halve perftest's bandwidth beside it. A table changes only when its
//! netdevs or their addresses do, so a kept reading serves for [`GID_TABLES_MAX_AGE`]
//! while the same ports exist; rdma_cm's ToS and mode (two files a port) are read every
//! time. A `roce_gid` finding is never reported from a kept table: the audit reads the
//! tables again first (`super::audit_cached`), so an address added a moment ago is not
//! reported as lacking its GID.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{gid, list_dir, numbered_entries, read_rnic_ports, read_roce_tos, RnicError, RnicPort};

/// How long `run` keeps the GID tables it read.
pub const GID_TABLES_MAX_AGE: Duration = Duration::from_secs(60);

/// The RDMA ports, with their GID tables kept for a while (or never: `check`).
#[derive(Debug)]
pub struct PortCache {
    max_age: Duration,
    kept: Option<(Instant, Vec<RnicPort>)>,
    /// Whether the last [`PortCache::ports`] came from the kept reading.
    served_kept: bool,
}

impl PortCache {
    /// Keeps GID tables for `max_age`.
    pub fn new(max_age: Duration) -> PortCache {
        PortCache {
            max_age,
            kept: None,
            served_kept: false,
        }
    }

    /// Reads everything every time (a one-shot audit).
    pub fn uncached() -> PortCache {
        PortCache::new(Duration::ZERO)
    }

    /// The ports under `root`: the GID tables of the kept reading when it is younger
    /// than the maximum age and the same ports exist, rdma_cm's ToS and mode read now.
    pub fn ports(&mut self, root: &Path) -> Result<Vec<RnicPort>, RnicError> {
        if let Some((at, kept)) = &mut self.kept {
            if at.elapsed() < self.max_age && same_ports(root, kept)? {
                for p in kept.iter_mut() {
                    p.default_roce_tos = read_roce_tos(root, &p.device, p.port);
                    p.default_roce_mode = gid::read_roce_mode(root, &p.device, p.port);
                }
                self.served_kept = true;
                return Ok(kept.clone());
            }
        }
        self.reread(root)
    }

    /// The ports read anew (and kept, unless uncached).
    pub fn reread(&mut self, root: &Path) -> Result<Vec<RnicPort>, RnicError> {
        self.served_kept = false;
        let ports = read_rnic_ports(root)?;
        if !self.max_age.is_zero() {
            self.kept = Some((Instant::now(), ports.clone()));
        }
        Ok(ports)
    }

    /// Whether the last ports served came from a kept reading.
    pub fn served_kept(&self) -> bool {
        self.served_kept
    }
}

/// Whether the devices and ports under `root` are those of `kept` (a directory listing:
/// cheap beside the GID tables).
fn same_ports(root: &Path, kept: &[RnicPort]) -> Result<bool, RnicError> {
    let class = root.join("class/infiniband");
    let mut now: Vec<(String, u32)> = Vec::new();
    for device in list_dir(&class)? {
        for port in numbered_entries(&class.join(&device).join("ports"))? {
            now.push((device.clone(), port));
        }
    }
    let mut was: Vec<(String, u32)> = kept.iter().map(|p| (p.device.clone(), p.port)).collect();
    now.sort();
    was.sort();
    Ok(now == was)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_rxe() -> std::path::PathBuf {
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/rxe");
        let to = std::env::temp_dir().join(format!("roce-rnic-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&to);
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(&from)
            .arg(&to)
            .status();
        assert!(status.is_ok_and(|s| s.success()));
        to
    }

    #[test]
    fn kept_gid_tables_serve_until_the_ports_change_and_tos_is_read_every_time() {
        let root = scratch_rxe();
        let types1 = root.join("devices/virtual/infiniband/rxe1/ports/1/gid_attrs/types/1");
        let tos = root.join("kernel/config/rdma_cm/rxe1/ports/1/default_roce_tos");
        let mut cache = PortCache::new(Duration::from_secs(3600));
        let first = cache.ports(&root).unwrap_or_default();
        assert!(!cache.served_kept());
        let _ = std::fs::write(&types1, "IB/RoCE v1\n");
        let _ = std::fs::write(&tos, "0\n");
        let second = cache.ports(&root).unwrap_or_default();
        assert!(cache.served_kept());
        assert_eq!(second[1].gids, first[1].gids);
        assert_eq!(
            second[1].default_roce_tos,
            Ok(super::super::RoceTos::Set(0))
        );
        let third = cache.reread(&root).unwrap_or_default();
        assert_eq!(third[1].gids[1].gid_type, gid::GidType::RoceV1);
        // A device gone: read again.
        let _ = std::fs::remove_file(root.join("class/infiniband/rxe0"));
        assert_eq!(cache.ports(&root).map(|p| p.len()), Ok(1));
        assert!(!cache.served_kept());
        let mut once = PortCache::uncached();
        let _ = once.ports(&root);
        let _ = once.ports(&root);
        assert!(!once.served_kept());
        let _ = std::fs::remove_dir_all(&root);
    }
}
