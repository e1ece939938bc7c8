//! The host's queue pairs as the kernel's RDMA subsystem knows them, whether or not
//! their packets ever cross the network stack: read from RDMA netlink
//! (`NETLINK_RDMA`, the nldev commands `rdma resource show qp|cm_id` and `rdma
//! statistic` use: `netlink/`), their owners from `/proc` down to the pod and
//! container (`owner.rs`), joined into the QP table (`table.rs`: [`QpTable`]).
//!
//! Privilege: reading needs no capability (the nldev dumps and the per-port
//! counter query are not among the commands ib_core reserves to CAP_NET_ADMIN:
//! `netlink/socket.rs`), and `/proc/PID/{comm,cgroup}` are world-readable for the
//! processes /proc shows (`owner.rs`). What the reader must see: the host's network
//! namespace for its RDMA devices, the host's pid namespace for owners' PIDs.
//!
//! Imports `sys`, `config`, `doc`; `telemetry` and `daemon` import it.

pub mod netlink;
pub mod owner;
pub mod table;

pub use netlink::Dump;
pub use table::{BoundCounter, QpSnapshot, QpTable, QpTableOptions};

/// Why the QP table could not be read.
#[derive(thiserror::Error, Debug)]
pub enum RdmaError {
    /// The kernel has no RDMA netlink: ib_core is neither built in nor loadable, so
    /// there are no RDMA devices (socket(NETLINK_RDMA) answers EPROTONOSUPPORT). The
    /// daemon says so once and shows an empty table.
    #[error("no RDMA devices: the kernel has no RDMA netlink (ib_core is not loaded)")]
    NoRdmaSubsystem,
    #[error("RDMA netlink: {0}")]
    Io(#[from] std::io::Error),
    /// The kernel refused a request (NLMSG_ERROR), or ended a dump with an error.
    #[error("RDMA netlink: {request} refused: {} (errno {errno})", errno_text(*errno))]
    Kernel { request: &'static str, errno: i32 },
    /// A reply that does not parse: a length that does not fit, a wrong attribute
    /// size, an attribute the kernel always sends missing.
    #[error("RDMA netlink: malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}

/// The C library's text of an errno, without the "(os error N)" that io::Error adds.
fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}
