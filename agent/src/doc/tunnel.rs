//! `counters.tunnels`: the RoCE of each VXLAN tunnel, with what its inner side showed
//! on this host, so that loss is put where it happened (`verdict::tunnels` makes it).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::Direction;

/// One tunnel on one interface and direction: the RoCE flows in VXLAN between two
/// VTEPs in one VNI, summed, and the same queue pairs on the tunnel's inner side (the
/// VXLAN device, or whatever interface carries them unencapsulated) where the agent
/// watches it too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelRecord {
    /// The underlay interface; null in `analyze`.
    pub ifname: Option<String>,
    /// null in `analyze`.
    pub direction: Option<Direction>,
    /// Outer addresses: the sending VTEP and the receiving one.
    pub src: IpAddr,
    pub dst: IpAddr,
    pub vni: u32,
    /// The tunnel's flows (one direction of one inner queue pair each) and packets.
    pub flows: u64,
    pub packets: u64,
    /// Packets with CE in the outer header (marked by the underlay, or by the sender's
    /// side when its VTEP copies an inner CE outwards, as RFC 6040's normal mode does;
    /// Linux encapsulates an inner CE as ECT(0)), and in the inner one (marked before
    /// encapsulation).
    pub ce: u64,
    pub inner_ce: u64,
    /// PSN gaps of the tunnel's flows here: ingress, requests lost before they reached
    /// this host (the sender, its VTEP, the underlay); egress, lost before they left it.
    pub psn_gaps: u64,
    /// Where the inner side of the tunnel's flows was seen (the interface most of
    /// them were matched on); null when none was.
    pub inner_ifname: Option<String>,
    /// Flows of the tunnel whose inner side was seen, and that side's PSN gaps; null
    /// when none was.
    pub inner_flows: Option<u64>,
    pub inner_psn_gaps: Option<u64>,
    /// PSN gaps that one side of this host's VTEP shows and the other does not, flow
    /// by flow: ingress, inner beyond outer (lost in decapsulation); egress, outer
    /// beyond inner (lost in encapsulation). null when no inner side was seen, and in
    /// `analyze` (a capture does not say which way its packets crossed the VTEP).
    pub vtep_psn_gaps: Option<u64>,
}
