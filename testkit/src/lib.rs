//! roce-agent's test kit: what tests, benches, the demo and the lab need to make
//! traffic and check it, kept out of the agent crate that ships to hosts.
//!
//! - [`bpffs`]: a bpffs of the test's own for agents that pin their datapath.
//! - [`frame`]: RoCEv2 frames (plain, tagged, in VXLAN, IPv4/IPv6) as bytes, with a
//!   correct ICRC.
//! - [`gen`]: the `roce-gen` traffic generator (the binary is `src/bin/roce-gen.rs`).
//! - [`mirror`]: mirror copies (GRE, ERSPAN II/III) of frames.
//! - [`netns`]: a network namespace that deletes itself when dropped.
//! - [`lab`]: two namespaces, a veth pair and a VXLAN pair, with processes, captures
//!   and the flow-table oracle built on tshark.
//! - [`tshark`]: running `tshark -T fields` and splitting what it prints.
//! - [`sock`]: an integer socket option, binding to a device, pinning to a CPU.
//! - [`temp`]: temporary files and directories removed when dropped.
//!
//! The BPF_PROG_TEST_RUN wrapper stays in the agent (`roce_agent::datapath::testrun`): its
//! `analyze --engine kernel` runs captures through it in production.

pub mod bpffs;
pub mod frame;
pub mod gen;
pub mod lab;
pub mod mirror;
pub mod netns;
pub mod pki;
pub mod prom;
pub mod sock;
pub mod temp;
pub mod tshark;
