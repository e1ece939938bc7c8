//! Passive round-trip times and retransmissions in a namespace lab (needs root): the
//! real `roce-agent` on the requester's veth (XDP on ingress, tc on egress), a RoCE
//! requester in that namespace and a responder in the other, both over UDP sockets
//! (`roce_tests::roce_peer`).
//!
//! - RTT: this kernel has no netem, so the responder holds each ACK for D ms (0, the
//!   baseline, then 1, 5, 20), timed against the monotonic clock. The agent's p50 on
//!   the ACKs' flow (ingress, to the requester's QP) must be D plus the baseline p50 to
//!   within 5% (or 50 µs): the buckets alone are good to 3.1%.
//! - Retransmissions: a requester that goes back after silence (its ACK timeout) and
//!   after the responder's NAK; the agent's `retransmitted_packets`/`_bytes` and
//!   `retransmit_timeouts` on the request flow (egress) equal what it resent and its
//!   go-backs after silence, exactly.
//!
//! The two tests take turns (a lock): RTT figures need the CPUs to themselves.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use roce_testkit::lab::{bins, Lab, LabOptions, Proc};
use roce_tests::roce_peer::{
    Requester, RequesterConfig, ResendPlan, Responder, ResponderConfig, ResponderReport, Round,
};
use serde_json::Value;

const API: &str = "127.0.0.1:9473";
/// The responder's QP (the requests' destination) and the requester's (the ACKs').
const RESPONDER_QP: u32 = 0x11;
const REQUESTER_QP: u32 = 0x22;
const REQUEST_SPORT: u16 = 0xC0DE;
const RESPONSE_SPORT: u16 = 0xC1DE;
const PAYLOAD: usize = 64;

/// Requests of each RTT run, one every `PACE`: about 50 samples at a hold of 20 ms
/// (one sample outstanding per flow), about 2,000 without hold.
const REQUESTS: u32 = 2000;
const PACE: Duration = Duration::from_micros(500);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the namespace lab tests need root (ip netns, XDP and tc attach)"
    );
}

/// A lab whose side A is the requester (the agent watches its veth) and side B the
/// responder. Fields drop in order: the agent before the lab.
struct Rig {
    agent: Option<Proc>,
    lab: Lab,
    bin: PathBuf,
    runs: u32,
}

impl Rig {
    fn new() -> Result<Rig> {
        let bin = bins::agent_bins_for_test()?;
        let lab = Lab::new(LabOptions {
            vxlan: false,
            ipv6: false,
            ..LabOptions::default()
        })?;
        Ok(Rig {
            agent: None,
            lab,
            bin,
            runs: 0,
        })
    }

    fn requester_ip(&self) -> IpAddr {
        self.lab.a.ip4.into()
    }

    fn responder_ip(&self) -> IpAddr {
        self.lab.b.ip4.into()
    }

    /// Starts a fresh agent (new flow table) on A's veth.
    fn start_agent(&mut self) -> Result<()> {
        self.stop_agent()?;
        self.runs += 1;
        let agent = self.lab.start_agent(
            &self.lab.a.ns,
            &self.bin.join("roce-agent"),
            &format!("roce-agent-{}", self.runs),
            &[
                "--iface",
                &self.lab.a.veth,
                "--listen",
                API,
                "--no-pin",
                "--interval",
                "0.5",
            ],
        )?;
        self.agent = Some(agent);
        Ok(())
    }

    fn stop_agent(&mut self) -> Result<()> {
        let Some(mut agent) = self.agent.take() else {
            return Ok(());
        };
        let st = agent.stop_with(libc::SIGINT, Duration::from_secs(10))?;
        if !st.success() {
            bail!(
                "roce-agent exited {st} on SIGINT; its stderr:\n{}",
                agent.stderr_text()
            );
        }
        Ok(())
    }

    fn doc(&self) -> Result<Value> {
        let out = self.lab.exec(
            &self.lab.a.ns,
            &self.bin.join("roce-agent").to_string_lossy(),
            &["flows", "--json", "--api", API],
        )?;
        serde_json::from_slice(&out.stdout).context("roce-agent flows --json printed no JSON")
    }

    /// The flow on A's veth in `direction` to `dest_qp`, if the agent has it.
    fn flow<'a>(&self, doc: &'a Value, direction: &str, dest_qp: u32) -> Result<Option<&'a Value>> {
        let flows = doc
            .get("flows")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("document without a flows array"))?;
        let veth = self.lab.a.veth.as_str();
        Ok(flows.iter().find(|f| {
            f.get("ifname").and_then(Value::as_str) == Some(veth)
                && f.get("direction").and_then(Value::as_str) == Some(direction)
                && f.get("dest_qp").and_then(Value::as_u64) == Some(dest_qp as u64)
        }))
    }

    /// Polls the agent until the request flow (egress) holds `requests` packets and the
    /// response flow (ingress) `acks` ACKs, for 10 s; returns both flows.
    fn settled(&self, requests: u64, acks: u64) -> Result<(Value, Value)> {
        let start = Instant::now();
        loop {
            let doc = self.doc()?;
            let out = self.flow(&doc, "egress", RESPONDER_QP)?;
            let back = self.flow(&doc, "ingress", REQUESTER_QP)?;
            if let (Some(out), Some(back)) = (out, back) {
                if num(out, "packets")? == requests && num(back, "acks")? == acks {
                    return Ok((out.clone(), back.clone()));
                }
            }
            if start.elapsed() > Duration::from_secs(10) {
                bail!(
                    "after 10 s the agent does not show {requests} requests (egress, QP \
                     {RESPONDER_QP:#x}) and {acks} ACKs (ingress, QP {REQUESTER_QP:#x}) on {}; \
                     flows:\n{}",
                    self.lab.a.veth,
                    pretty(doc.get("flows").unwrap_or(&Value::Null))
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Err(e) = self.stop_agent() {
            eprintln!("stopping the agent: {e:#}");
        }
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn num(flow: &Value, name: &str) -> Result<u64> {
    flow.get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("flow without a number {name}: {flow}"))
}

/// A flow's `rtt` object as the agent reports it.
#[derive(Clone, Copy, Debug)]
struct Rtt {
    samples: u64,
    min_us: f64,
    p50_us: f64,
    p99_us: f64,
}

/// The `rtt` of the ACKs' flow: the field must be there (a missing field fails, so
/// that the test cannot pass without the feature) and hold samples.
fn rtt_of(flow: &Value) -> Result<Rtt> {
    let Some(rtt) = flow.get("rtt") else {
        bail!("the agent's flow has no `rtt` field at all (not implemented?): {flow}");
    };
    if rtt.is_null() {
        bail!("`rtt` is null (no sample) on the ACKs' flow: {flow}");
    }
    let f = |k: &str| {
        rtt.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| anyhow!("rtt without a number {k}: {rtt}"))
    };
    Ok(Rtt {
        samples: rtt
            .get("samples")
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("rtt without samples: {rtt}"))?,
        min_us: f("min_us")?,
        p50_us: f("p50_us")?,
        p99_us: f("p99_us")?,
    })
}

/// One steady run against a responder that holds each ACK `hold`: the agent's RTT
/// on the ACKs' flow, and the responder's account of its holds.
fn rtt_run(rig: &mut Rig, hold: Duration, first_psn: u32) -> Result<(Rtt, ResponderReport)> {
    rig.start_agent()?;
    let responder = Responder::start(
        &rig.lab.b.ns,
        rig.responder_ip(),
        ResponderConfig {
            requester_qp: REQUESTER_QP,
            hold,
            sport: RESPONSE_SPORT,
            lose: Vec::new(),
        },
    )?;
    let mut requester = Requester::open(
        &rig.lab.a.ns,
        rig.requester_ip(),
        rig.responder_ip(),
        RequesterConfig {
            requester_qp: REQUESTER_QP,
            responder_qp: RESPONDER_QP,
            sport: REQUEST_SPORT,
            payload_len: PAYLOAD,
        },
    )?;
    requester.steady(first_psn, REQUESTS, PACE)?;
    let deadline = Instant::now() + hold + Duration::from_secs(3);
    while responder.acks() < REQUESTS as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = responder.stop()?;
    if report.acks != REQUESTS as u64 {
        bail!(
            "the responder ACKed {} of {REQUESTS} requests: {report:?}",
            report.acks
        );
    }
    let (out, back) = rig
        .settled(REQUESTS as u64, report.acks)
        .with_context(|| format!("hold {hold:?}"))?;
    // Steady traffic: nothing resent, nothing missing.
    for k in ["retransmitted_packets", "retransmit_timeouts", "psn_gaps"] {
        assert_eq!(num(&out, k)?, 0, "{k} on the request flow: {out}");
    }
    let rtt = rtt_of(&back).with_context(|| format!("hold {hold:?}"))?;
    rig.stop_agent()?;
    Ok((rtt, report))
}

#[test]
fn rtt_p50_is_the_responders_hold_plus_the_baseline() -> Result<()> {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut rig = Rig::new()?;
    let mut lines = Vec::new();
    let mut results = Vec::new();
    for (i, hold_ms) in [0u64, 1, 5, 20].into_iter().enumerate() {
        let hold = Duration::from_millis(hold_ms);
        // PSN spaces far apart, as queue pairs start at random.
        let (rtt, resp) = rtt_run(&mut rig, hold, 0x10_0000 * (i as u32 + 1) + 0x0F_FF00)?;
        lines.push(format!(
            "hold {hold_ms:>2} ms: samples {:>5}, min {:>9.1} µs, p50 {:>9.1} µs, p99 {:>9.1} µs; \
             responder held min/p50/max {:.1}/{:.1}/{:.1} µs",
            rtt.samples,
            rtt.min_us,
            rtt.p50_us,
            rtt.p99_us,
            resp.held_us.0,
            resp.held_us.1,
            resp.held_us.2
        ));
        results.push((hold_ms, rtt));
    }
    eprintln!("{}", lines.join("\n"));
    let base = results[0].1.p50_us;
    let mut problems = Vec::new();
    for &(hold_ms, rtt) in &results {
        if rtt.samples < 10 {
            problems.push(format!("hold {hold_ms} ms: only {} samples", rtt.samples));
        }
        if !(rtt.min_us <= rtt.p50_us && rtt.p50_us <= rtt.p99_us) {
            problems.push(format!(
                "hold {hold_ms} ms: min <= p50 <= p99 fails: {rtt:?}"
            ));
        }
        if rtt.samples > REQUESTS as u64 {
            problems.push(format!(
                "hold {hold_ms} ms: {} samples of {REQUESTS} requests",
                rtt.samples
            ));
        }
        // The minimum is exact (not a bucket): no ACK comes back before its hold.
        if rtt.min_us < hold_ms as f64 * 1000.0 {
            problems.push(format!(
                "hold {hold_ms} ms: min {:.1} µs is shorter than the hold",
                rtt.min_us
            ));
        }
        if hold_ms == 0 {
            continue;
        }
        let want = hold_ms as f64 * 1000.0 + base;
        let tolerance = (want * 0.05).max(50.0);
        if (rtt.p50_us - want).abs() > tolerance {
            problems.push(format!(
                "hold {hold_ms} ms: p50 {:.1} µs, expected {want:.1} µs (hold + baseline p50 \
                 {base:.1}) ± {tolerance:.1}",
                rtt.p50_us
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\nfigures:\n{}",
        problems.join("\n"),
        lines.join("\n")
    );
    Ok(())
}

#[test]
fn retransmissions_and_timeouts_equal_what_the_requester_resent() -> Result<()> {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut rig = Rig::new()?;
    rig.start_agent()?;
    let silence = Duration::from_millis(30);
    // PSNs from just below the 24-bit wrap: the go-backs cross it.
    let plan = ResendPlan {
        first_psn: 0xFF_FFE0,
        rounds: vec![
            Round::AfterSilence {
                new: 20,
                silence,
                back: 5,
            },
            Round::AfterNak { new: 20, lost: 7 },
            Round::AfterSilence {
                new: 10,
                silence,
                back: 1,
            },
            Round::AfterNak { new: 15, lost: 0 },
            Round::AfterSilence {
                new: 12,
                silence,
                back: 12,
            },
        ],
        tail: 10,
        pace: Duration::from_micros(300),
    };
    let responder = Responder::start(
        &rig.lab.b.ns,
        rig.responder_ip(),
        ResponderConfig {
            requester_qp: REQUESTER_QP,
            hold: Duration::ZERO,
            sport: RESPONSE_SPORT,
            lose: plan.lost_psns(),
        },
    )?;
    let mut requester = Requester::open(
        &rig.lab.a.ns,
        rig.requester_ip(),
        rig.responder_ip(),
        RequesterConfig {
            requester_qp: REQUESTER_QP,
            responder_qp: RESPONDER_QP,
            sport: REQUEST_SPORT,
            payload_len: PAYLOAD,
        },
    )?;
    let sent = requester.run_plan(&plan)?;
    let frame_len = requester.request_frame_len()?;
    let deadline = Instant::now() + Duration::from_secs(3);
    while responder.requests() < sent.sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    let answered = responder.stop()?;
    eprintln!("requester: {sent:?}\nresponder: {answered:?}");
    // The scenario is what it claims: resends of both kinds, each NAK acted on.
    assert_eq!(
        (sent.go_backs_after_silence, sent.go_backs_after_nak),
        (3, 2)
    );
    assert_eq!(sent.naks_acted_on, answered.naks);
    assert_eq!(sent.resent, 5 + 13 + 1 + 15 + 12);
    assert_eq!(answered.requests, sent.sent);

    let (out, back) = rig.settled(sent.sent, answered.acks)?;
    let got = (
        num(&out, "retransmitted_packets")?,
        num(&out, "retransmitted_bytes")?,
        num(&out, "retransmit_timeouts")?,
        num(&out, "psn_gaps")?,
    );
    assert_eq!(
        got,
        (
            sent.resent,
            sent.resent * frame_len,
            sent.go_backs_after_silence,
            0
        ),
        "(retransmitted packets, bytes, timeouts, PSN gaps) on the request flow \
         (a go-back after a NAK is no timeout): {}",
        pretty(&out)
    );
    assert_eq!(num(&back, "naks")?, answered.naks, "{back}");
    for k in ["retransmitted_packets", "retransmit_timeouts"] {
        assert_eq!(num(&back, k)?, 0, "a response is no request: {back}");
    }
    rig.stop_agent()?;
    Ok(())
}

#[test]
fn a_flow_without_the_rtt_field_or_with_a_null_one_is_an_error() {
    let missing = serde_json::json!({"dest_qp": 0x22, "acks": 5});
    let e = rtt_of(&missing).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("no `rtt` field"), "{e}");
    let null = serde_json::json!({"dest_qp": 0x22, "rtt": null});
    assert!(rtt_of(&null).is_err());
    let some =
        serde_json::json!({"rtt": {"samples": 3, "min_us": 1.0, "p50_us": 2.5, "p99_us": 4.0}});
    assert_eq!(
        rtt_of(&some).map(|r| (r.samples, r.p50_us)).ok(),
        Some((3, 2.5))
    );
}
