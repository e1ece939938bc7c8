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

// Host QoS (tc programs, see `policy`). Appended: never renumber the ones above.
/// Enforce mode: a RoCE data packet or CNP left with its DSCP rewritten.
pub const STAT_QOS_ROCE_REWRITTEN: u32 = STAT_FLOW_INSERT_FAILED + 1;
/// Enforce mode: non-RoCE traffic on a lossless DSCP was remarked.
pub const STAT_QOS_INTRUDER_REMARKED: u32 = STAT_QOS_ROCE_REWRITTEN + 1;
/// Enforce mode (and VTEPs): skb->priority was set from the DSCP -> priority table.
pub const STAT_QOS_PRIORITY_SET: u32 = STAT_QOS_INTRUDER_REMARKED + 1;
/// Audit mode: what enforce mode would have counted in the three counters above.
pub const STAT_QOS_AUDIT_ROCE_REWRITE: u32 = STAT_QOS_PRIORITY_SET + 1;
pub const STAT_QOS_AUDIT_INTRUDER_REMARK: u32 = STAT_QOS_AUDIT_ROCE_REWRITE + 1;
pub const STAT_QOS_AUDIT_PRIORITY: u32 = STAT_QOS_AUDIT_INTRUDER_REMARK + 1;
/// VTEP egress: VXLAN packets seen, and those whose outer TOS was rewritten.
pub const STAT_VTEP_PACKETS: u32 = STAT_QOS_AUDIT_PRIORITY + 1;
pub const STAT_VTEP_REWRITTEN: u32 = STAT_VTEP_PACKETS + 1;
/// VTEP ingress (decapsulation side): VXLAN packets checked, outer DSCP not what the
/// table makes of the inner one, outer CE over inner ECT, outer CE over inner Not-ECT.
pub const STAT_DECAP_PACKETS: u32 = STAT_VTEP_REWRITTEN + 1;
pub const STAT_DECAP_DSCP_MISMATCH: u32 = STAT_DECAP_PACKETS + 1;
pub const STAT_DECAP_CE_OVER_ECT: u32 = STAT_DECAP_DSCP_MISMATCH + 1;
pub const STAT_DECAP_CE_OVER_NOT_ECT: u32 = STAT_DECAP_CE_OVER_ECT + 1;
/// tc could not make the headers readable (bpf_skb_pull_data failed); passed untouched.
pub const STAT_TC_PULL_FAILED: u32 = STAT_DECAP_CE_OVER_NOT_ECT + 1;
/// A rewrite helper (store bytes, checksum) failed; passed as it was left.
pub const STAT_TC_WRITE_FAILED: u32 = STAT_TC_PULL_FAILED + 1;

pub const STAT_NAMES_OTHER: [(u32, &str); 2] = [
    (STAT_FLOW_CREATED, "flows_created"),
    (STAT_FLOW_INSERT_FAILED, "flow_insert_failed"),
];

/// Names of the host QoS counters, as `/flows` shows them under "qos".
pub const STAT_NAMES_QOS: [(u32, &str); 14] = [
    (STAT_QOS_ROCE_REWRITTEN, "roce_rewritten"),
    (STAT_QOS_INTRUDER_REMARKED, "intruders_remarked"),
    (STAT_QOS_PRIORITY_SET, "priority_set"),
    (STAT_QOS_AUDIT_ROCE_REWRITE, "audit_roce_would_rewrite"),
    (
        STAT_QOS_AUDIT_INTRUDER_REMARK,
        "audit_intruders_would_remark",
    ),
    (STAT_QOS_AUDIT_PRIORITY, "audit_priority_would_set"),
    (STAT_VTEP_PACKETS, "vtep_packets"),
    (STAT_VTEP_REWRITTEN, "vtep_rewritten"),
    (STAT_DECAP_PACKETS, "decap_packets"),
    (STAT_DECAP_DSCP_MISMATCH, "decap_dscp_mismatch"),
    (STAT_DECAP_CE_OVER_ECT, "decap_ce_over_ect"),
    (STAT_DECAP_CE_OVER_NOT_ECT, "decap_ce_over_not_ect"),
    (STAT_TC_PULL_FAILED, "tc_pull_failed"),
    (STAT_TC_WRITE_FAILED, "tc_write_failed"),
];

#[inline(always)]
pub fn class_index(c: Class) -> u32 {
    STAT_CLASS_BASE + c as u32
}

#[inline(always)]
pub fn reason_index(r: Reason) -> u32 {
    STAT_REASON_BASE + r as u32
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
        const { assert!(STAT_FLOW_INSERT_FAILED < STATS_LEN) };
        // The existing layout is a contract: QoS counters come after it.
        assert_eq!((STAT_FLOW_CREATED, STAT_FLOW_INSERT_FAILED), (34, 35));
        assert_eq!(STAT_QOS_ROCE_REWRITTEN, 36);
        const { assert!(STAT_TC_WRITE_FAILED < STATS_LEN) };
        for (i, (idx, _)) in STAT_NAMES_QOS.iter().enumerate() {
            assert_eq!(*idx, STAT_QOS_ROCE_REWRITTEN + i as u32);
        }
        assert_eq!(
            REASON_NAMES[Reason::TruncatedExtHeader as usize],
            "truncated_ext_header"
        );
    }
}
