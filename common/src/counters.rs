//! Indices of the STATS per-CPU array: one per traffic class, one per reason a
//! packet could not be parsed as far as its BTH, the flow-table pressure counters, the
//! host QoS counters and the sampled-event counters.
//! The names are what `/flows` and `/metrics` show; never reuse an index for another meaning.

use crate::parsed::{Class, Outcome, Reason, REASON_COUNT};

/// Layout of the STATS array.
pub const STAT_CLASS_BASE: u32 = 0;
pub const STAT_REASON_BASE: u32 = 8;
/// Number of STATS entries (room left for counters added later).
pub const STATS_LEN: u32 = 64;

/// One STATS index constant after another, from `$base` on.
macro_rules! stat_indices {
    ($base:expr;) => {};
    ($base:expr; $(#[$m:meta])* $konst:ident => $name:ident $(, $($rest:tt)*)?) => {
        $(#[$m])*
        pub const $konst: u32 = $base;
        stat_indices!($konst + 1; $($($rest)*)?);
    };
}

/// `(index, name)` of each counter of a list.
macro_rules! stat_names {
    ($table:ident; $( $(#[$m:meta])* $konst:ident => $name:ident ),* $(,)?) => {
        pub const $table: &[(u32, &str)] = &[$( ($konst, stringify!($name)) ),*];
    };
}

/// The flow-table counters, after the reasons. Declared once: `$callback!` receives
/// the list (`CONSTANT => name`).
#[macro_export]
macro_rules! for_each_flow_table_counter {
    ($callback:ident) => {
        $callback! {
            /// A flow entry was created (evictions = created - entries present).
            STAT_FLOW_CREATED => flows_created,
            /// A new flow found no free slot (the table is full until the agent evicts), or its
            /// insert into its flow table (FLOWS4, FLOWS_MID or FLOWS) failed.
            STAT_FLOW_INSERT_FAILED => flow_insert_failed,
        }
    };
}

/// The host QoS counters of the tc programs (see `policy`), after the flow-table
/// counters: what `/flows` shows under "qos". Declared once: `$callback!` receives the
/// list (`CONSTANT => name`); the STATS indices, the names here and the agent's
/// document fields are all made from it. Append only: never renumber.
#[macro_export]
macro_rules! for_each_qos_counter {
    ($callback:ident) => {
        $callback! {
            /// Enforce mode: a RoCE data packet or CNP left with its DSCP rewritten.
            STAT_QOS_ROCE_REWRITTEN => roce_rewritten,
            /// Enforce mode: non-RoCE traffic on a lossless DSCP was remarked.
            STAT_QOS_INTRUDER_REMARKED => intruders_remarked,
            /// Enforce mode (and VTEPs): skb->priority was set from the DSCP -> priority table.
            STAT_QOS_PRIORITY_SET => priority_set,
            /// Audit mode: what enforce mode would have counted in the three counters above.
            STAT_QOS_AUDIT_ROCE_REWRITE => audit_roce_would_rewrite,
            STAT_QOS_AUDIT_INTRUDER_REMARK => audit_intruders_would_remark,
            STAT_QOS_AUDIT_PRIORITY => audit_priority_would_set,
            /// VTEP egress: VXLAN packets seen.
            STAT_VTEP_PACKETS => vtep_packets,
            /// VTEP egress: VXLAN packets whose outer TOS was rewritten.
            STAT_VTEP_REWRITTEN => vtep_rewritten,
            /// VTEP ingress (decapsulation side): VXLAN packets checked.
            STAT_DECAP_PACKETS => decap_packets,
            /// Outer DSCP not what the table makes of the inner one.
            STAT_DECAP_DSCP_MISMATCH => decap_dscp_mismatch,
            /// Outer CE over inner ECT: decapsulation propagates the mark.
            STAT_DECAP_CE_OVER_ECT => decap_ce_over_ect,
            /// Outer CE over inner Not-ECT: decapsulation drops the packet.
            STAT_DECAP_CE_OVER_NOT_ECT => decap_ce_over_not_ect,
            /// tc could not make the headers readable (bpf_skb_pull_data failed); passed untouched.
            STAT_TC_PULL_FAILED => tc_pull_failed,
            /// A rewrite (store, checksum) failed; passed as it was left.
            STAT_TC_WRITE_FAILED => tc_write_failed,
        }
    };
}

/// The sampled-event counters (see `event`), after the QoS counters: events written
/// into the EVENTS ring, by kind. Declared once like the others; the names are the
/// kinds' names (`counters.events` of the document, `roce_events_total{kind}`), in the
/// order of the `event::EVENT_*` kinds. Append only.
#[macro_export]
macro_rules! for_each_event_counter {
    ($callback:ident) => {
        $callback! {
            /// Events of packets with CE in the outer or inner header.
            STAT_EVENTS_CE => ce,
            STAT_EVENTS_CNP => cnp,
            STAT_EVENTS_NAK => nak,
            STAT_EVENTS_RNR_NAK => rnr_nak,
            STAT_EVENTS_PSN_GAP => psn_gap,
            /// Round trips longer than the spike threshold (`rtt_spike_us`).
            STAT_EVENTS_RTT_SPIKE => rtt_spike,
        }
    };
}

/// Sampled events lost, by reason, after the event counters (`counters.events_dropped`,
/// `roce_events_dropped_total{reason}`). Events the sampling left out are not lost:
/// they are not counted at all. Append only.
#[macro_export]
macro_rules! for_each_event_drop_counter {
    ($callback:ident) => {
        $callback! {
            /// Over the per-CPU rate limit (`event::EVENTS_PER_CPU_PER_WINDOW`).
            STAT_EVENTS_DROPPED_RATE_LIMIT => rate_limit,
            /// bpf_ringbuf_reserve failed: the agent had not read the ring in time.
            STAT_EVENTS_DROPPED_RING_FULL => ring_full,
        }
    };
}

/// Round-trip samples left unmeasured because the wire did not say which queue pair's
/// response answers them (`rtt`, "pairing"), after the event-drop counters
/// (`counters.rtt_unpaired`, `roce_rtt_unpaired_total{reason}`). Append only.
#[macro_export]
macro_rules! for_each_rtt_unpaired_counter {
    ($callback:ident) => {
        $callback! {
            /// A request found a sample of another flow waiting under its hosts and PSN
            /// (two queue pairs between the same hosts at one PSN): it started none.
            STAT_RTT_SHARED_PSN => shared_psn,
            /// A response named a waiting sample's hosts and PSN, but its request flow's
            /// responses go to another QP: a coincidence of PSNs, which ended nothing.
            STAT_RTT_OTHER_QP => other_qp,
        }
    };
}

/// Live mirror sessions' PSN gaps left without a verdict because a newer gap of the
/// same host pair and session took their place in the watch (`ebpf/src/gaps.rs` keeps
/// one: `roce_common::gaps`), after the round-trip counters
/// (`counters.capture_gaps_undecided`, `roce_capture_gaps_undecided_total`). The last
/// entry of STATS_LEN 64.
pub const STAT_CAPTURE_GAPS_UNDECIDED: u32 = STAT_RTT_OTHER_QP + 1;

macro_rules! flow_table_indices {
    ($($t:tt)*) => { stat_indices!(STAT_REASON_BASE + REASON_COUNT as u32; $($t)*); };
}
for_each_flow_table_counter!(flow_table_indices);

macro_rules! qos_indices {
    ($($t:tt)*) => { stat_indices!(STAT_FLOW_INSERT_FAILED + 1; $($t)*); };
}
for_each_qos_counter!(qos_indices);

macro_rules! event_indices {
    ($($t:tt)*) => { stat_indices!(STAT_TC_WRITE_FAILED + 1; $($t)*); };
}
for_each_event_counter!(event_indices);

macro_rules! event_drop_indices {
    ($($t:tt)*) => { stat_indices!(STAT_EVENTS_RTT_SPIKE + 1; $($t)*); };
}
for_each_event_drop_counter!(event_drop_indices);

macro_rules! rtt_unpaired_indices {
    ($($t:tt)*) => { stat_indices!(STAT_EVENTS_DROPPED_RING_FULL + 1; $($t)*); };
}
for_each_rtt_unpaired_counter!(rtt_unpaired_indices);

macro_rules! flow_table_names {
    ($($t:tt)*) => { stat_names!(STAT_NAMES_OTHER; $($t)*); };
}
for_each_flow_table_counter!(flow_table_names);

macro_rules! qos_names {
    ($($t:tt)*) => { stat_names!(STAT_NAMES_QOS; $($t)*); };
}
for_each_qos_counter!(qos_names);

macro_rules! event_names {
    ($($t:tt)*) => { stat_names!(STAT_NAMES_EVENTS; $($t)*); };
}
for_each_event_counter!(event_names);

macro_rules! event_drop_names {
    ($($t:tt)*) => { stat_names!(STAT_NAMES_EVENTS_DROPPED; $($t)*); };
}
for_each_event_drop_counter!(event_drop_names);

macro_rules! rtt_unpaired_names {
    ($($t:tt)*) => { stat_names!(STAT_NAMES_RTT_UNPAIRED; $($t)*); };
}
for_each_rtt_unpaired_counter!(rtt_unpaired_names);

/// The `events` counter of event kind `kind` (`event::EVENT_*`).
#[inline(always)]
pub fn event_index(kind: u8) -> u32 {
    STAT_EVENTS_CE + kind as u32
}

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
pub fn stat_indices(outcome: &Outcome) -> (u32, Option<u32>) {
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
            reason_index(Reason::BadErspanVersion) + 1,
            STAT_FLOW_CREATED
        );
        const { assert!(STAT_FLOW_INSERT_FAILED < STATS_LEN) };
        // The layout is a contract: QoS counters come after it. Layout version 4 (the
        // mirror classes and reasons) moved everything after the reasons by three.
        assert_eq!(class_index(Class::MirrorTruncated), STAT_REASON_BASE - 1);
        assert_eq!((STAT_FLOW_CREATED, STAT_FLOW_INSERT_FAILED), (37, 38));
        assert_eq!(STAT_QOS_ROCE_REWRITTEN, 39);
        const { assert!(STAT_TC_WRITE_FAILED < STATS_LEN) };
        for (i, (idx, _)) in STAT_NAMES_QOS.iter().enumerate() {
            assert_eq!(*idx, STAT_QOS_ROCE_REWRITTEN + i as u32);
        }
        assert_eq!(
            crate::parsed::REASON_NAMES[Reason::TruncatedExtHeader as usize],
            "truncated_ext_header"
        );
        // Event counters after the QoS ones, then the drop reasons.
        assert_eq!(STAT_EVENTS_CE, STAT_TC_WRITE_FAILED + 1);
        assert_eq!(STAT_EVENTS_CE, 53);
        assert_eq!(STAT_EVENTS_DROPPED_RATE_LIMIT, STAT_EVENTS_RTT_SPIKE + 1);
        const { assert!(STAT_EVENTS_DROPPED_RING_FULL < STATS_LEN) };
    }

    #[test]
    fn event_counters_follow_the_event_kinds() {
        use crate::event::*;
        let kinds = [
            (EVENT_CE, "ce"),
            (EVENT_CNP, "cnp"),
            (EVENT_NAK, "nak"),
            (EVENT_RNR_NAK, "rnr_nak"),
            (EVENT_PSN_GAP, "psn_gap"),
            (EVENT_RTT_SPIKE, "rtt_spike"),
        ];
        assert_eq!(STAT_NAMES_EVENTS.len(), EVENT_KIND_COUNT);
        for (i, (kind, name)) in kinds.into_iter().enumerate() {
            assert_eq!(kind as usize, i);
            assert_eq!(STAT_NAMES_EVENTS[i], (event_index(kind), name));
        }
        assert_eq!(
            STAT_NAMES_EVENTS_DROPPED,
            &[
                (STAT_EVENTS_DROPPED_RATE_LIMIT, "rate_limit"),
                (STAT_EVENTS_DROPPED_RING_FULL, "ring_full")
            ]
        );
    }

    #[test]
    fn rtt_unpaired_counters_come_last_and_fit() {
        assert_eq!(STAT_RTT_SHARED_PSN, STAT_EVENTS_DROPPED_RING_FULL + 1);
        assert_eq!((STAT_RTT_SHARED_PSN, STAT_RTT_OTHER_QP), (61, 62));
        const { assert!(STAT_RTT_OTHER_QP < STATS_LEN) };
        assert_eq!(STAT_CAPTURE_GAPS_UNDECIDED, 63);
        const { assert!(STAT_CAPTURE_GAPS_UNDECIDED < STATS_LEN) };
        assert_eq!(
            STAT_NAMES_RTT_UNPAIRED,
            &[
                (STAT_RTT_SHARED_PSN, "shared_psn"),
                (STAT_RTT_OTHER_QP, "other_qp")
            ]
        );
    }
}
