//! The QP table on this host's kernel, through a real NETLINK_RDMA socket. The
//! machines the project is built on have no RDMA device and usually no ib_core: a
//! refresh is an empty table, or NoRdmaSubsystem when the kernel has no RDMA netlink
//! (socket() answers EPROTONOSUPPORT). Its own test binary: it counts the process's
//! open file descriptors, which other tests running beside it would move.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use roce_agent::rdma::{QpTable, QpTableOptions, RdmaError};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Whether the kernel lists RDMA devices (the VM lab's rxe, a host with an RNIC).
fn has_rdma_devices() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn a_refresh_on_this_host_is_empty_or_no_rdma_subsystem_and_leaks_no_fd() {
    let mut table = QpTable::new(QpTableOptions::default());
    // The first refresh may open what stays open for the process (nothing should).
    let first = table.refresh();
    let before = open_fds();
    for _ in 0..20 {
        let r = table.refresh();
        assert_eq!(format!("{r:?}"), format!("{first:?}"), "refreshes differ");
    }
    assert_eq!(open_fds(), before, "file descriptors leaked");
    match first {
        Ok(snapshot) if has_rdma_devices() => {
            eprintln!(
                "this host has RDMA devices: {} QPs, {} ports",
                snapshot.qps.len(),
                snapshot.ports.len()
            );
            assert!(!snapshot.ports.is_empty());
        }
        Ok(snapshot) => {
            assert!(snapshot.qps.is_empty(), "{snapshot:?}");
            assert!(snapshot.ports.is_empty(), "{snapshot:?}");
            assert!(snapshot.bound_counters.is_empty(), "{snapshot:?}");
        }
        Err(RdmaError::NoRdmaSubsystem) => {
            assert!(!has_rdma_devices());
            eprintln!(
                "no RDMA netlink in this kernel: {}",
                RdmaError::NoRdmaSubsystem
            );
        }
        Err(e) => panic!("refresh failed: {e}"),
    }
}
