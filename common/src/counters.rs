//! Indices of the STATS per-CPU array: one per traffic class, one per reason a
//! packet could not be parsed as far as its BTH, and the flow-table pressure counters.
//! The names are what `/flows` and `/metrics` show; never reuse an index for another meaning.

/// What the classifier made of a frame that it could parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Class {
    Roce = 0,
    RoceInVxlan = 1,
    VxlanOther = 2,
    OtherUdp = 3,
    OtherIp = 4,
    NonIp = 5,
}

pub const CLASS_NAMES: [&str; 6] = [
    "roce",
    "roce_in_vxlan",
    "vxlan_other",
    "other_udp",
    "other_ip",
    "non_ip",
];

/// Why a frame could not be parsed as far as the BTH (or, for the last few, why an
/// extension header that counting needs was missing). Each has its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Reason {
    TruncatedEth = 0,
    TruncatedVlan,
    TooManyVlanTags,
    TruncatedIpv4,
    BadIpv4Ihl,
    BadIpVersion,
    Ipv4Fragment,
    TruncatedIpv6,
    TruncatedIpv6Ext,
    TooManyIpv6Ext,
    Ipv6Fragment,
    TruncatedUdp,
    TruncatedBth,
    TruncatedVxlan,
    BadVxlanFlags,
    TruncatedInnerEth,
    TruncatedInnerIpv4,
    BadInnerIpv4Ihl,
    InnerIpv4Fragment,
    TruncatedInnerIpv6,
    TruncatedInnerIpv6Ext,
    TooManyInnerIpv6Ext,
    InnerIpv6Fragment,
    TruncatedInnerUdp,
    TruncatedInnerBth,
    /// The BTH parsed but the AETH/RETH that counting needs was cut off: the packet
    /// still counts on its flow, without its ACK/NAK class or READ length.
    TruncatedExtHeader,
}

pub const REASON_COUNT: usize = 26;

pub const REASON_NAMES: [&str; REASON_COUNT] = [
    "truncated_eth",
    "truncated_vlan",
    "too_many_vlan_tags",
    "truncated_ipv4",
    "bad_ipv4_ihl",
    "bad_ip_version",
    "ipv4_fragment",
    "truncated_ipv6",
    "truncated_ipv6_ext",
    "too_many_ipv6_ext",
    "ipv6_fragment",
    "truncated_udp",
    "truncated_bth",
    "truncated_vxlan",
    "bad_vxlan_flags",
    "truncated_inner_eth",
    "truncated_inner_ipv4",
    "bad_inner_ipv4_ihl",
    "inner_ipv4_fragment",
    "truncated_inner_ipv6",
    "truncated_inner_ipv6_ext",
    "too_many_inner_ipv6_ext",
    "inner_ipv6_fragment",
    "truncated_inner_udp",
    "truncated_inner_bth",
    "truncated_ext_header",
];

/// Layout of the STATS array.
pub const STAT_CLASS_BASE: u32 = 0;
pub const STAT_REASON_BASE: u32 = 8;
/// A flow entry was created (LRU evictions = created - entries present).
pub const STAT_FLOW_CREATED: u32 = STAT_REASON_BASE + REASON_COUNT as u32;
/// An insert into FLOWS failed (map full without eviction, or memory pressure).
pub const STAT_FLOW_INSERT_FAILED: u32 = STAT_FLOW_CREATED + 1;
/// Number of STATS entries (room left for counters added later).
pub const STATS_LEN: u32 = 64;

pub const STAT_NAMES_OTHER: [(u32, &str); 2] = [
    (STAT_FLOW_CREATED, "flows_created"),
    (STAT_FLOW_INSERT_FAILED, "flow_insert_failed"),
];

#[inline(always)]
pub fn class_index(c: Class) -> u32 {
    STAT_CLASS_BASE + c as u32
}

#[inline(always)]
pub fn reason_index(r: Reason) -> u32 {
    STAT_REASON_BASE + r as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_do_not_overlap() {
        assert!(class_index(Class::NonIp) < STAT_REASON_BASE);
        assert_eq!(
            reason_index(Reason::TruncatedExtHeader) + 1,
            STAT_FLOW_CREATED
        );
        assert!(STAT_FLOW_INSERT_FAILED < STATS_LEN);
        assert_eq!(
            REASON_NAMES[Reason::TruncatedExtHeader as usize],
            "truncated_ext_header"
        );
    }
}

/// The STATS entries one classified frame bumps: its class or reason, and for a
/// RoCE packet with a cut-off extension header also `truncated_ext_header`.
#[inline(always)]
pub fn stat_indices(outcome: &crate::classify::Outcome) -> (u32, Option<u32>) {
    use crate::classify::Outcome;
    match outcome {
        Outcome::Flow(p) => {
            let extra = if p.ext_truncated {
                Some(reason_index(Reason::TruncatedExtHeader))
            } else {
                None
            };
            (class_index(p.class()), extra)
        }
        Outcome::Other(c) => (class_index(*c), None),
        Outcome::Malformed(r) => (reason_index(*r), None),
    }
}
