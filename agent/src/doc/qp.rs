//! The QP table document that `GET /qps` and `roce-agent qps --json` print: one record
//! per queue pair the host's RDMA devices hold (RDMA netlink, `rdma resource show qp`),
//! with its owner and, where XDP or tc saw its packets, the wire's figures.
//!
//! The field names are a public contract (README, "The QP table"): fields may be
//! added, never renamed.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The whole document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QpDocument {
    pub qps: Vec<Qp>,
    /// Added: the RDMA ports the table was read from, with their netdevs.
    #[serde(default)]
    pub ports: Vec<RdmaPort>,
    /// Added: why the table could not be read (no RDMA netlink, no device), null
    /// when it was.
    #[serde(default)]
    pub error: Option<String>,
}

/// One queue pair.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qp {
    /// RDMA device name (`rxe0`, `mlx5_0`).
    pub device: String,
    /// Port number; null for a QP not yet bound to a port (RESET).
    pub port: Option<u32>,
    /// Local QP number.
    pub lqpn: u32,
    /// Remote QP number; null where the QP has none (UD, GSI, before RTR).
    pub rqpn: Option<u32>,
    /// "RC", "UC", "UD", "XRC_INI", "XRC_TGT", "SMI", "GSI", "RAW_PACKET", "DRIVER"
    /// (as iproute2's `rdma` names them), or "UNKNOWN(n)".
    #[serde(rename = "type")]
    pub qp_type: String,
    /// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", or "UNKNOWN(n)".
    pub state: String,
    pub sq_psn: Option<u32>,
    pub rq_psn: Option<u32>,
    /// The owning process; null for a QP the kernel itself made (then `comm` holds
    /// the kernel user's name, e.g. "ib_core", as `rdma` prints `[ib_core]`).
    pub pid: Option<u32>,
    pub comm: Option<String>,
    /// The owner's cgroup v2 path (`/proc/PID/cgroup`, "0::" line), null when unknown.
    pub cgroup: Option<String>,
    /// The Kubernetes pod UID the cgroup names (`kubepods…pod<UID>`), dashes restored.
    pub pod_uid: Option<String>,
    /// The container ID the cgroup names (`cri-containerd-<ID>`, `docker-<ID>`, `crio-<ID>`).
    pub container_id: Option<String>,
    /// Addresses of the rdma_cm connection that made the QP; null when it was not rdma_cm.
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// Per-QP hardware counters where the driver binds a counter to the QP (mlx5,
    /// `rdma statistic qp set ... auto type on`), by the driver's names; empty otherwise.
    pub counters: BTreeMap<String, u64>,
    /// Added: the id of the hardware counter bound to the QP (`rdma statistic qp
    /// show`: cntn), null when none. QPs bound to one counter (auto mode binds every
    /// QP of a type on a port to one) show the same `counters`: sum per counter.
    #[serde(default)]
    pub counter_id: Option<u32>,
    /// Whether XDP or tc counted packets of this QP (either direction) on an interface.
    pub seen_on_wire: bool,
    /// Added: the netdev of the QP's port (`rdma link` shows it); for a QP without a
    /// port (before INIT, or the GSI QP on older kernels) that of its device's only
    /// port; null when none or when the device has several ports.
    #[serde(default)]
    pub netdev: Option<String>,
    /// Added: the rdma_cm ports of the connection, null when not rdma_cm.
    #[serde(default)]
    pub src_port: Option<u16>,
    #[serde(default)]
    pub dst_port: Option<u16>,
    /// Added: the QP was in the last dump but not in this one: kept with its last
    /// figures until the next interval.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
    /// Added: the wire flows of this QP (requests it sent, packets it received), null
    /// when `seen_on_wire` is false.
    #[serde(default)]
    pub wire: Option<QpWire>,
}

/// The wire's figures of one QP: the sums over the flows XDP and tc joined to it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QpWire {
    /// Flows joined (one per interface and direction).
    pub flows: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Outer CE marks on packets this QP received.
    pub rx_ce: u64,
    pub cnps_sent: u64,
    pub cnps_received: u64,
    pub naks: u64,
    pub psn_gaps: u64,
    /// Added: the QP's requests sent again, and the go-backs of them no NAK asked for
    /// (its egress flows' `retransmitted_packets`, `retransmit_timeouts`).
    #[serde(default)]
    pub retransmitted_packets: u64,
    #[serde(default)]
    pub retransmit_timeouts: u64,
    /// Added: the round trips of the QP's requests: the `rtt` of its ingress flow
    /// (the responses to them) with the most samples; null without one. The QP table
    /// pairs the two directions exactly (the ingress flow is the one to this QP).
    #[serde(default)]
    pub rtt: Option<super::Rtt>,
}

/// Who owns a QP, as a flow carries it (`Flow::owner`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpOwner {
    pub device: String,
    pub lqpn: u32,
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub cgroup: Option<String>,
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
}

/// One port of an RDMA device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RdmaPort {
    pub device: String,
    pub port: u32,
    /// The netdev under the port (RoCE), null when none.
    pub netdev: Option<String>,
    /// The port's hardware counters (`rdma statistic show link DEV/PORT`).
    pub counters: BTreeMap<String, u64>,
}
