//! Judges the `netem_delay` scenario: the agent's passive round trips (`rtt` of the
//! flows) of ib_send_lat between rxe0 and rxe1, run once as it is and once with netem
//! delaying veth0's egress (tests/vm/scenarios.sh). Both directions' requests cross the
//! delay once (rxe0's on the way out, rxe1's in the ACK rxe0 sends back): on veth0 the
//! delayed run's p50 is the undelayed run's plus the delay, within 5% of the delay (or
//! 50 µs), the figure; on both, no round trip is shorter than the delay. Where the samples land: the flows the
//! responses travel in, veth0 ingress (rxe1's ACKs to rxe0's QP) and veth1 ingress
//! (rxe0's ACKs to rxe1's QP).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::judge::Outcome;

/// The interface whose p50 must be the undelayed one plus the delay: rxe0's requests
/// leave there into the delay, and rxe1 answers them as it did without it. On veth1,
/// rxe1's requests are answered by rxe0's ACKs, which rxe0 defers (its `ack_deferred`
/// counter) differently while its own requests wait in the delay: that direction's
/// p50 moves by more than the delay (the responder's turnaround is part of a round
/// trip), and is held only to the delay as a floor.
const STRICT: &str = "veth0";

/// Samples a run needs on an interface for its p50 to mean anything.
const MIN_SAMPLES: u64 = 20;

/// One interface's round trips in one run: the flow with the most samples.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rtt {
    dest_qp: u64,
    samples: u64,
    min_us: f64,
    p50_us: f64,
    p99_us: f64,
}

fn read(path: &Path) -> Result<Value> {
    serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", path.display()))
}

/// The ingress flows of `ifname` with round trips, but those whose QP is in `skip`.
fn ingress_rtts(doc: &Value, ifname: &str, skip: &BTreeSet<u64>) -> Vec<Rtt> {
    let flows = doc["flows"].as_array().cloned().unwrap_or_default();
    flows
        .iter()
        .filter(|f| f["ifname"] == ifname && f["direction"] == "ingress")
        .filter_map(|f| {
            let qp = f["dest_qp"].as_u64()?;
            let r = &f["rtt"];
            if skip.contains(&qp) || r.is_null() {
                return None;
            }
            Some(Rtt {
                dest_qp: qp,
                samples: r["samples"].as_u64()?,
                min_us: r["min_us"].as_f64()?,
                p50_us: r["p50_us"].as_f64()?,
                p99_us: r["p99_us"].as_f64()?,
            })
        })
        .collect()
}

/// The flow of `rtts` with the most samples.
fn busiest(rtts: &[Rtt]) -> Option<Rtt> {
    rtts.iter().copied().max_by_key(|r| r.samples)
}

pub fn netem_delay(dir: &Path, o: &mut Outcome) -> Result<()> {
    let delay_ms: f64 = std::fs::read_to_string(dir.join("delay_ms"))
        .context("reading delay_ms")?
        .trim()
        .parse()
        .context("delay_ms is not a number")?;
    let delay_us = delay_ms * 1000.0;
    let baseline = read(&dir.join("flows-baseline.json"))?;
    let end = read(&dir.join("flows.json"))?;
    for ifname in ["veth0", "veth1"] {
        // One agent a run: each document holds its run's flows only.
        let before = ingress_rtts(&baseline, ifname, &BTreeSet::new());
        let delayed = ingress_rtts(&end, ifname, &BTreeSet::new());
        o.flows += before.len() + delayed.len();
        o.figures += 1;
        let (Some(b), Some(d)) = (busiest(&before), busiest(&delayed)) else {
            o.problem(format!(
                "{ifname} ingress: no flow with round trips in the {} run",
                if before.is_empty() {
                    "undelayed"
                } else {
                    "delayed"
                }
            ));
            continue;
        };
        o.notes.push(format!(
            "{ifname} ingress: undelayed QP {:#x} {} samples, min {:.0} µs, p50 {:.0} µs, p99 {:.0} µs; \
             delayed {delay_ms} ms QP {:#x} {} samples, min {:.0} µs, p50 {:.0} µs, p99 {:.0} µs",
            b.dest_qp, b.samples, b.min_us, b.p50_us, b.p99_us, d.dest_qp, d.samples, d.min_us,
            d.p50_us, d.p99_us
        ));
        for (run, r) in [("undelayed", b), ("delayed", d)] {
            o.figures += 1;
            if r.samples < MIN_SAMPLES {
                o.problem(format!(
                    "{ifname} {run}: {} round-trip samples, fewer than {MIN_SAMPLES}",
                    r.samples
                ));
            }
            o.figures += 1;
            if !(r.min_us <= r.p50_us && r.p50_us <= r.p99_us) {
                o.problem(format!("{ifname} {run}: min, p50, p99 out of order: {r:?}"));
            }
        }
        let want = b.p50_us + delay_us;
        let tolerance = (0.05 * delay_us).max(50.0);
        o.figures += 1;
        if ifname == STRICT && (d.p50_us - want).abs() > tolerance {
            o.problem(format!(
                "{ifname}: delayed p50 {:.0} µs, expected {want:.0} µs (undelayed p50 + {delay_ms} ms) within {tolerance:.0} µs",
                d.p50_us
            ));
        }
        // No round trip is shorter than the delay it crossed.
        o.figures += 1;
        if d.min_us < delay_us {
            o.problem(format!(
                "{ifname}: a delayed round trip of {:.0} µs, under the {delay_ms} ms delay",
                d.min_us
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_new_flow_of_each_interface_is_compared() {
        let doc = serde_json::json!({"flows": [
            {"ifname": "veth0", "direction": "ingress", "dest_qp": 17,
             "rtt": {"samples": 40, "min_us": 90.0, "p50_us": 120.0, "p99_us": 300.0}},
            {"ifname": "veth0", "direction": "ingress", "dest_qp": 18,
             "rtt": {"samples": 2, "min_us": 90.0, "p50_us": 100.0, "p99_us": 100.0}},
            {"ifname": "veth0", "direction": "egress", "dest_qp": 19,
             "rtt": {"samples": 90, "min_us": 1.0, "p50_us": 1.0, "p99_us": 1.0}},
            {"ifname": "veth0", "direction": "ingress", "dest_qp": 20, "rtt": null},
            {"ifname": "veth1", "direction": "ingress", "dest_qp": 21,
             "rtt": {"samples": 50, "min_us": 20100.0, "p50_us": 20130.0, "p99_us": 20400.0}}
        ]});
        let all = ingress_rtts(&doc, "veth0", &BTreeSet::new());
        assert_eq!(busiest(&all).map(|r| r.dest_qp), Some(17));
        let new = ingress_rtts(&doc, "veth0", &BTreeSet::from([17]));
        assert_eq!(busiest(&new).map(|r| r.dest_qp), Some(18));
        assert_eq!(ingress_rtts(&doc, "veth1", &BTreeSet::new()).len(), 1);
    }
}
