//! Shared helpers of the integration tests: a BPF_PROG_TEST_RUN harness around the
//! real XDP program (and one that reads the EVENTS ring), expected-value builders (flow keys, STATS vectors), comparison
//! with the reference classifier, and a small pcap reader; the frame generator and
//! the differential runs shared by `tests/differential.rs` and `roce-fuzz`; a RoCE
//! requester and responder over UDP sockets for namespace labs (`roce_peer`).

pub mod differential;
pub mod events;
pub mod expect;
pub mod gen;
pub mod harness;
pub mod pcap;
pub mod roce_peer;
pub mod tc;

/// Hex dump of a frame, 16 bytes a line, for failure messages.
pub fn hex(frame: &[u8]) -> String {
    let mut s = String::new();
    for (i, chunk) in frame.chunks(16).enumerate() {
        s.push_str(&format!("{:04x} ", i * 16));
        for b in chunk {
            s.push_str(&format!(" {b:02x}"));
        }
        s.push('\n');
    }
    s
}
