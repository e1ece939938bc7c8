//! The names of the RNIC port counters in `/metrics`: node_exporter's infiniband
//! collector (v1.11) for the files it knows, a generic rule for the others.

use super::snapshot::{Kind, Value};
use crate::audit::rnic::{CounterDir, PortCounter};

/// How a counter file's value becomes a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conversion {
    AsIs,
    /// `port_rcv_data` / `port_xmit_data`: 4-byte words -> bytes.
    WordsToBytes,
    /// `lifespan` (ms) -> a gauge in seconds.
    MillisecondsToSeconds,
}

/// (file, dir, metric name without `roce_rnic_` and `_total`, conversion, help).
#[rustfmt::skip]
const RNIC_NAMES: &[(&str, CounterDir, &str, Conversion, &str)] = {
    use Conversion::*;
    use CounterDir::{Hw, Port};
    &[
        ("duplicate_request", Hw, "duplicate_requests_packets", AsIs, "Received packets that repeated a request already executed."),
        ("implied_nak_seq_err", Hw, "implied_nak_seq_errors", AsIs, "ACKs with a PSN beyond the expected one for a READ or atomic response (implied NAK)."),
        ("lifespan", Hw, "lifespan_seconds", MillisecondsToSeconds, "How long the driver keeps hw_counters readings before reading the hardware again."),
        ("local_ack_timeout_err", Hw, "local_ack_timeout_errors", AsIs, "Times a QP's ACK timer expired at the sender (still within the retry limit)."),
        ("np_cnp_sent", Hw, "np_cnp_packets_sent", AsIs, "CNPs sent by the notification point for CE-marked RoCEv2 packets it received."),
        ("np_ecn_marked_roce_packets", Hw, "np_ecn_marked_roce_packets_received", AsIs, "RoCEv2 packets received with CE (ECN 11) in the IP header."),
        ("out_of_buffer", Hw, "out_of_buffer_drops", AsIs, "Packets dropped for lack of a receive WQE on their QP."),
        ("out_of_sequence", Hw, "out_of_sequence_packets_received", AsIs, "Out-of-sequence packets received."),
        ("packet_seq_err", Hw, "packet_sequence_errors", AsIs, "NAK sequence error packets received (still within the retry limit)."),
        ("req_cqe_error", Hw, "req_cqes_errors", AsIs, "Requester CQEs completed with an error."),
        ("req_cqe_flush_error", Hw, "req_cqes_flush_errors", AsIs, "Requester CQEs completed with a flush error."),
        ("req_remote_access_errors", Hw, "req_remote_access_errors", AsIs, "Remote access errors seen by the requester."),
        ("req_remote_invalid_request", Hw, "req_remote_invalid_request_errors", AsIs, "Remote invalid request errors seen by the requester."),
        ("resp_cqe_error", Hw, "resp_cqes_errors", AsIs, "Responder CQEs completed with an error."),
        ("resp_cqe_flush_error", Hw, "resp_cqes_flush_errors", AsIs, "Responder CQEs completed with a flush error."),
        ("resp_local_length_error", Hw, "resp_local_length_errors", AsIs, "Local length errors seen by the responder."),
        ("resp_remote_access_errors", Hw, "resp_remote_access_errors", AsIs, "Remote access errors seen by the responder."),
        ("rnr_nak_retry_err", Hw, "rnr_nak_retry_packets_received", AsIs, "RNR NAKs received (still within the retry limit)."),
        ("roce_adp_retrans", Hw, "roce_adp_retransmits", AsIs, "Adaptive retransmissions of RoCE traffic."),
        ("roce_adp_retrans_to", Hw, "roce_adp_retransmits_timeout", AsIs, "Times RoCE traffic reached a timeout under adaptive retransmission."),
        ("roce_slow_restart", Hw, "roce_slow_restart_used", AsIs, "Times RoCE slow restart was used."),
        ("roce_slow_restart_cnps", Hw, "roce_slow_restart_cnps", AsIs, "CNPs that RoCE slow restart generated."),
        ("roce_slow_restart_trans", Hw, "roce_slow_restart", AsIs, "Times RoCE slow restart changed state to slow restart."),
        ("rp_cnp_handled", Hw, "rp_cnp_packets_handled", AsIs, "CNPs the reaction point handled by slowing down."),
        ("rp_cnp_ignored", Hw, "rp_cnp_ignored_packets_received", AsIs, "CNPs received and ignored by the reaction point (is ECN on for their priority?)."),
        ("rx_atomic_requests", Hw, "rx_atomic_requests", AsIs, "ATOMIC requests received."),
        ("rx_dct_connect", Hw, "rx_dct_connect_requests", AsIs, "DCT connection requests received."),
        ("rx_read_requests", Hw, "rx_read_requests", AsIs, "READ requests received."),
        ("rx_write_requests", Hw, "rx_write_requests", AsIs, "WRITE requests received."),
        ("rx_icrc_encapsulated", Hw, "rx_icrc_encapsulated_errors", AsIs, "RoCE packets received with an ICRC error."),
        ("excessive_buffer_overrun_errors", Port, "excessive_buffer_overrun_errors", AsIs, "Flow control update periods in a row with a buffer overrun."),
        ("link_downed", Port, "link_downed", AsIs, "Times the link failed to recover from an error and went down."),
        ("link_error_recovery", Port, "link_error_recovery", AsIs, "Times the link recovered from an error."),
        ("local_link_integrity_errors", Port, "local_link_integrity_errors", AsIs, "Times local physical errors exceeded their threshold."),
        ("multicast_rcv_packets", Port, "multicast_packets_received", AsIs, "Multicast packets received (errors included)."),
        ("multicast_xmit_packets", Port, "multicast_packets_transmitted", AsIs, "Multicast packets sent (errors included)."),
        ("port_rcv_constraint_errors", Port, "port_constraint_errors_received", AsIs, "Packets received that the port discarded for a constraint."),
        ("port_xmit_constraint_errors", Port, "port_constraint_errors_transmitted", AsIs, "Packets not sent for a constraint."),
        ("port_rcv_data", Port, "port_data_received_bytes", WordsToBytes, "Data bytes received (the port counts 4-byte words)."),
        ("port_xmit_data", Port, "port_data_transmitted_bytes", WordsToBytes, "Data bytes sent (the port counts 4-byte words)."),
        ("port_rcv_discards", Port, "port_discards_received", AsIs, "Packets received and discarded (port down or congested)."),
        ("port_xmit_discards", Port, "port_discards_transmitted", AsIs, "Packets discarded instead of sent (port down or congested)."),
        ("port_rcv_errors", Port, "port_errors_received", AsIs, "Packets received with an error."),
        ("port_rcv_packets", Port, "port_packets_received", AsIs, "Packets received (errors included)."),
        ("port_xmit_packets", Port, "port_packets_transmitted", AsIs, "Packets sent (errors included)."),
        ("port_xmit_wait", Port, "port_transmit_wait", AsIs, "Ticks during which the port had data to send but sent none."),
        ("unicast_rcv_packets", Port, "unicast_packets_received", AsIs, "Unicast packets received (errors included)."),
        ("unicast_xmit_packets", Port, "unicast_packets_transmitted", AsIs, "Unicast packets sent (errors included)."),
        ("port_rcv_remote_physical_errors", Port, "port_receive_remote_physical_errors", AsIs, "Packets received marked with the EBP delimiter."),
        ("port_rcv_switch_relay_errors", Port, "port_receive_switch_relay_errors", AsIs, "Packets a switch could not forward."),
        ("symbol_error", Port, "symbol_error", AsIs, "Minor link errors on one or more physical lanes."),
        ("VL15_dropped", Port, "vl15_dropped", AsIs, "VL15 packets dropped for lack of resources."),
    ]
};

/// One RNIC counter as a sample of its family.
#[derive(Debug)]
pub(super) struct RnicMetric {
    /// Without `roce_rnic_` and `_total`.
    pub(super) name: String,
    pub(super) help: String,
    pub(super) kind: Kind,
    pub(super) value: Value,
}

impl RnicMetric {
    pub(super) fn of(c: &PortCounter) -> RnicMetric {
        let known = RNIC_NAMES
            .iter()
            .find(|(file, dir, ..)| *file == c.name && *dir == c.dir);
        match known {
            Some((_, _, name, conversion, help)) => {
                let (kind, value) = match conversion {
                    Conversion::AsIs => (Kind::Counter, Value::Int(c.value)),
                    Conversion::WordsToBytes => {
                        (Kind::Counter, Value::Int(c.value.wrapping_mul(4)))
                    }
                    Conversion::MillisecondsToSeconds => {
                        (Kind::Gauge, Value::Float(c.value as f64 / 1000.0))
                    }
                };
                RnicMetric {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind,
                    value,
                }
            }
            None => {
                let dir = match c.dir {
                    CounterDir::Hw => "hw_counters",
                    CounterDir::Port => "counters",
                };
                RnicMetric {
                    name: generic_rnic_name(&c.name),
                    help: format!(
                        "The RNIC port counter {dir}/{} as the driver counts it.",
                        c.name
                    ),
                    kind: Kind::Counter,
                    value: Value::Int(c.value),
                }
            }
        }
    }
}

/// A metric name for a counter file nobody named: lower case, anything but
/// `[a-z0-9_]` turned into `_`, without a trailing `_total` (the encoder adds it).
fn generic_rnic_name(file: &str) -> String {
    let mut name: String = file
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .collect();
    while name.ends_with("_total") {
        name.truncate(name.len() - "_total".len());
    }
    if name.is_empty() {
        name.push_str("unnamed");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::live::LiveDocument;
    use crate::telemetry::metrics::tests::{inputs, sample};
    use crate::telemetry::metrics::{encode, Inputs, RnicPortCounters};

    #[test]
    fn rnic_counters_are_named_as_node_exporter_names_them() {
        let c = |dir, name: &str, value| PortCounter {
            dir,
            name: name.to_string(),
            value,
        };
        let ports = [RnicPortCounters {
            device: "mlx5_0".to_string(),
            port: 1,
            netdev: "eth1".to_string(),
            counters: vec![
                c(CounterDir::Hw, "np_cnp_sent", 18234),
                c(CounterDir::Hw, "lifespan", 10),
                c(CounterDir::Hw, "vendor-Thing_total", 5),
                c(CounterDir::Port, "port_rcv_data", 100),
                c(CounterDir::Port, "VL15_dropped", 1),
            ],
        }];
        let doc = LiveDocument::default();
        let text = encode(&Inputs {
            rnic: &ports,
            ..inputs(&doc, &[], 10)
        })
        .unwrap();
        let labels = r#"{device="mlx5_0",port="1",netdev="eth1"}"#;
        let v = |name: &str| sample(&text, &format!("{name}{labels}"));
        assert_eq!(
            v("roce_rnic_np_cnp_packets_sent_total").as_deref(),
            Some("18234")
        );
        assert_eq!(
            v("roce_rnic_port_data_received_bytes_total").as_deref(),
            Some("400")
        );
        assert_eq!(v("roce_rnic_lifespan_seconds").as_deref(), Some("0.01"));
        assert_eq!(v("roce_rnic_vendor_thing_total").as_deref(), Some("5"));
        assert_eq!(v("roce_rnic_vl15_dropped_total").as_deref(), Some("1"));
        assert!(text.contains("# TYPE roce_rnic_lifespan_seconds gauge\n"));
        assert!(text.contains("# TYPE roce_rnic_np_cnp_packets_sent_total counter\n"));
    }

    #[test]
    fn generic_rnic_names_are_sanitized() {
        assert_eq!(generic_rnic_name("rx_foo"), "rx_foo");
        assert_eq!(generic_rnic_name("Rx-Foo.bar"), "rx_foo_bar");
        assert_eq!(generic_rnic_name("x_total"), "x");
        assert_eq!(generic_rnic_name("_total"), "unnamed");
    }
}
