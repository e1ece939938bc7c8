//! The real tc programs (`tc_egress`, `tc_ingress`), loaded once per harness and run on
//! single frames through BPF_PROG_TEST_RUN with an `__sk_buff` context in and out, so
//! that the skb priority they set can be read back.
//!
//! BPF_PROG_TEST_RUN gives the skb the loopback device of the caller's namespace
//! (ifindex 1): the harness configures the policy for that interface.

use std::collections::BTreeMap;

use roce_agent::datapath::loader::{load, LoadOptions, Loaded, TC_EGRESS, TC_INGRESS};
use roce_agent::datapath::testrun::{test_run, TestRun};
use roce_common::flow::FlowStats;
use roce_common::key::FlowKey;
use roce_common::policy::{IfaceQos, Policy, VtepKey, VtepStats};

use crate::harness::pin_to_current_cpu;
use crate::hex;

/// The interface the kernel gives test runs: loopback.
pub const TEST_RUN_IFINDEX: u32 = 1;
/// sizeof(struct __sk_buff).
pub const SKB_CTX_LEN: usize = 192;
/// offsetof(struct __sk_buff, priority).
pub const SKB_PRIORITY_OFF: usize = 32;
/// offsetof(struct __sk_buff, ifindex): a test run may name a device of the namespace.
pub const SKB_IFINDEX_OFF: usize = 40;
/// TCX_NEXT / TC_ACT_UNSPEC (-1): what the tc programs always return.
pub const TC_NEXT: u32 = u32::MAX;

/// Whether BPF_PROG_TEST_RUN refuses `frame` for a tc program (EINVAL): the kernel
/// (6.18) wants a whole IP header behind an IPv4 or IPv6 EtherType in the skb it
/// builds (XDP test runs take any frame of 14 bytes or more). Such frames cannot be
/// run through the tc programs here; `tests/differential.rs` checks this rule
/// against the kernel.
/// The test interface with the host policy in audit mode and the kernel's ECN
/// propagation: `tc_egress` counts egress flows and changes no byte.
pub fn audit_iface() -> IfaceQos {
    IfaceQos {
        host: roce_common::policy::HOST_AUDIT,
        vtep: 0,
        ecn: roce_common::policy::ECN_KERNEL,
        _pad: 0,
    }
}

pub fn refuses_skb_test_run(frame: &[u8]) -> bool {
    let Some(t) = frame.get(12..14) else {
        return true;
    };
    match u16::from_be_bytes([t[0], t[1]]) {
        roce_common::wire::ETH_P_IPV4 => frame.len() < 14 + 20,
        roce_common::wire::ETH_P_IPV6 => frame.len() < 14 + 40,
        _ => false,
    }
}

/// The output of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcOut {
    pub retval: u32,
    pub data: Vec<u8>,
    pub priority: u32,
}

pub struct TcHarness {
    loaded: Loaded,
}

impl TcHarness {
    /// Loads the object, writes `policy`, and configures the test interface as `iface`.
    pub fn load(policy: &Policy, iface: IfaceQos) -> Self {
        pin_to_current_cpu();
        let opts = LoadOptions {
            config: policy.config,
            ..LoadOptions::default()
        };
        let mut loaded = match load(&opts) {
            Ok(l) => l,
            Err(e) => panic!("loading the eBPF object (these tests need root): {e}"),
        };
        for name in [TC_EGRESS, TC_INGRESS] {
            if let Err(e) = loaded.tc_fd(name) {
                panic!("loading {name}: {e}");
            }
        }
        let mut h = TcHarness { loaded };
        h.set_policy(policy);
        h.set_iface(iface);
        h
    }

    pub fn set_policy(&mut self, policy: &Policy) {
        if let Err(e) = self.loaded.set_policy(policy) {
            panic!("writing the policy: {e}");
        }
    }

    pub fn set_iface(&mut self, iface: IfaceQos) {
        self.set_iface_at(TEST_RUN_IFINDEX, Some(iface));
    }

    pub fn set_iface_at(&mut self, ifindex: u32, iface: Option<IfaceQos>) {
        if let Err(e) = self.loaded.set_iface_qos(ifindex, iface) {
            panic!("writing IFACE_QOS for {ifindex}: {e}");
        }
    }

    /// Runs program `name` once on `frame`, with skb->priority `priority` on the way in.
    pub fn run(&mut self, name: &'static str, frame: &[u8], priority: u32) -> TcOut {
        self.run_on(name, frame, priority, 0)
    }

    /// `run` on the device of index `ifindex` of the caller's namespace (0: loopback).
    pub fn run_on(
        &mut self,
        name: &'static str,
        frame: &[u8],
        priority: u32,
        ifindex: u32,
    ) -> TcOut {
        match self.try_run_on(name, frame, priority, ifindex) {
            Ok(out) => out,
            Err(e) => panic!("BPF_PROG_TEST_RUN of {name} failed: {e}\n{}", hex(frame)),
        }
    }

    /// `run_on`, with the kernel's refusal as an error (see `refuses_skb_test_run`).
    pub fn try_run_on(
        &mut self,
        name: &'static str,
        frame: &[u8],
        priority: u32,
        ifindex: u32,
    ) -> std::io::Result<TcOut> {
        let mut ctx = [0u8; SKB_CTX_LEN];
        ctx[SKB_PRIORITY_OFF..SKB_PRIORITY_OFF + 4].copy_from_slice(&priority.to_ne_bytes());
        ctx[SKB_IFINDEX_OFF..SKB_IFINDEX_OFF + 4].copy_from_slice(&ifindex.to_ne_bytes());
        let fd = match self.loaded.tc_fd(name) {
            Ok(fd) => fd,
            Err(e) => panic!("{name}: {e}"),
        };
        let run = TestRun {
            data: frame,
            repeat: 1,
            ctx_in: Some(&ctx),
            ctx_out_len: SKB_CTX_LEN,
        };
        let out = test_run(fd, &run)?;
        let Some(p) = out.ctx.get(SKB_PRIORITY_OFF..SKB_PRIORITY_OFF + 4) else {
            return Err(std::io::Error::other("no __sk_buff came back"));
        };
        Ok(TcOut {
            retval: out.retval,
            priority: u32::from_ne_bytes([p[0], p[1], p[2], p[3]]),
            data: out.data,
        })
    }

    pub fn egress(&mut self, frame: &[u8], priority: u32) -> TcOut {
        self.run(TC_EGRESS, frame, priority)
    }

    pub fn ingress(&mut self, frame: &[u8]) -> TcOut {
        self.run(TC_INGRESS, frame, 0)
    }

    /// STATS summed over CPUs.
    pub fn stats(&self) -> Vec<u64> {
        match self.loaded.stats() {
            Ok(v) => v,
            Err(e) => panic!("reading STATS: {e}"),
        }
    }

    /// Every flow in FLOWS (both directions) with CPUs merged, sorted by key.
    pub fn flows(&self) -> BTreeMap<FlowKey, FlowStats> {
        match self.loaded.flows() {
            Ok(v) => v.into_iter().collect(),
            Err(e) => panic!("reading FLOWS: {e}"),
        }
    }

    pub fn vteps(&self) -> Vec<(VtepKey, VtepStats)> {
        match self.loaded.vteps() {
            Ok(v) => v,
            Err(e) => panic!("reading VTEPS: {e}"),
        }
    }

    /// Zeroes STATS and empties FLOWS and VTEPS.
    pub fn reset(&mut self) {
        if let Err(e) = self.loaded.reset().and_then(|_| self.loaded.reset_vteps()) {
            panic!("resetting the maps: {e}");
        }
    }

    pub fn loaded_mut(&mut self) -> &mut Loaded {
        &mut self.loaded
    }

    /// Runs `xdp_classify` of the same object (its maps are these) once on `frame`:
    /// the frame arriving on the host whose egress the tc programs see.
    pub fn xdp(&self, frame: &[u8]) -> u32 {
        let fd = match self.loaded.xdp_fd() {
            Ok(fd) => fd,
            Err(e) => panic!("xdp_classify: {e}"),
        };
        let run = TestRun {
            data: frame,
            repeat: 1,
            ..Default::default()
        };
        match test_run(fd, &run) {
            Ok(out) => out.retval,
            Err(e) => panic!(
                "BPF_PROG_TEST_RUN of xdp_classify failed: {e}\n{}",
                hex(frame)
            ),
        }
    }
}
