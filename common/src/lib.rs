//! Shared between roce-agent's kernel programs and its user side.
//!
//! Everything here is `no_std` and allocation-free so that the XDP/tc programs can
//! call the very same parsing and counting code that the user side runs as the
//! reference classifier: the kernel and the reference agree by construction, and
//! the differential tests check the glue around it.
#![cfg_attr(not(feature = "std"), no_std)]
// Atomic adds on the BPF target (which has no compare-and-swap, so no `fetch_add`).
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

// Tests use std's collections also without the `std` feature.
#[cfg(all(test, not(feature = "std")))]
extern crate std;

pub mod bth;
pub mod classify;
pub mod cnp;
pub mod config;
pub mod counters;
pub mod event;
pub mod flow;
pub mod gaps;
pub mod icrc;
pub mod key;
pub mod mirror;
pub mod nak;
pub mod names;
pub mod packet;
pub mod parsed;
pub mod policy;
pub mod psn;
pub mod rtt;
pub mod wire;

// The kernel programs need neither: the user side only.
#[cfg(any(feature = "std", test))]
pub mod headers;
#[cfg(feature = "std")]
pub mod reference;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)], made of integers only, with explicit padding.
    unsafe impl aya::Pod for crate::key::FlowKey {}
    unsafe impl aya::Pod for crate::key::FlowKey4 {}
    unsafe impl aya::Pod for crate::key::FlowKeyMid {}
    unsafe impl aya::Pod for crate::key::FlowKeyMirror {}
    unsafe impl aya::Pod for crate::mirror::MirrorTag {}
    unsafe impl aya::Pod for crate::nak::NakKey {}
    unsafe impl aya::Pod for crate::rtt::RttHist {}
    unsafe impl aya::Pod for crate::cnp::CnpWrongClass {}
    unsafe impl aya::Pod for crate::cnp::CnpTimes {}
    unsafe impl aya::Pod for crate::rtt::RttWait {}
    unsafe impl aya::Pod for crate::flow::FlowStats {}
    unsafe impl aya::Pod for crate::flow::FlowSlot {}
    unsafe impl aya::Pod for crate::config::RuntimeConfig {}
    unsafe impl aya::Pod for crate::config::Generation {}
    unsafe impl aya::Pod for crate::policy::DscpEntry {}
    unsafe impl aya::Pod for crate::policy::QosConfig {}
    unsafe impl aya::Pod for crate::policy::IfaceQos {}
    unsafe impl aya::Pod for crate::policy::VtepKey {}
    unsafe impl aya::Pod for crate::policy::VtepStats {}
    unsafe impl aya::Pod for crate::event::EventRecord {}
}
