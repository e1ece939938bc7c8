//! Which go-backs a NAK asked for (the `retransmit_timeouts` rule in the README, "The
//! flow document"): a requester resends after a NAK or an RNR NAK from its responder,
//! or after its ACK timeout fired. The NAK travels on the other flow of the queue pair
//! (the responder's, towards the requester's QP), and the wire does not say which QP
//! answers which; but a NAK names the PSN the requester goes back to (the PSN the
//! responder expected, or the one it could not take), and PSNs start at random in a
//! 24-bit space. So a NAK is remembered under the two hosts' addresses and its PSN
//! ([`NakKey`]), and a go-back that starts at that PSN between the same two hosts takes
//! it: that go-back followed a NAK; a go-back that finds none is a timeout.
//!
//! The kernel keeps the memory in an LRU hash (NAK_PSNS, shared by all CPUs and both
//! directions: on the requester's host the NAK arrives in XDP and the go-back leaves
//! through tc, on the responder's the other way round); the user side in a hash map
//! (`reference::ReferenceTable`, `analyze`).

use crate::key::{FlowKey, KEY_INNER_V6, KEY_MIRROR, KEY_OUTER_V6, KEY_TUNNELLED};
use crate::mirror::MirrorTag;

/// Key bits of the flow key that a [`NakKey`] keeps: the shape, not the direction.
pub const NAK_KEY_FLAGS: u32 = KEY_OUTER_V6 | KEY_INNER_V6 | KEY_TUNNELLED | KEY_MIRROR;

/// A NAK as the go-back it asks for will find it: the requester's and the responder's
/// addresses (outer, and inner when tunnelled), the VNI and the PSN. Whole words, 80
/// bytes. No interface, no direction, no QP: the NAK and the go-back travel on two
/// different flows, which may cross two interfaces.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NakKey {
    /// Outer addresses: the requester (the NAK's destination, the request's source)
    /// and the responder. Raw words as in [`FlowKey`].
    pub requester: [u32; 4],
    pub responder: [u32; 4],
    /// Inner addresses when tunnelled, zero otherwise.
    pub inner_requester: [u32; 4],
    pub inner_responder: [u32; 4],
    pub vni: u32,
    /// The PSN the NAK names, where the go-back starts.
    pub psn: u32,
    /// The flow key's [`NAK_KEY_FLAGS`].
    pub flags: u32,
    /// A mirrored flow's session ([`mirror_scope`]), 0 otherwise: copies of one
    /// session answer each other, not another session's copies of the same traffic.
    pub scope: u32,
}

impl NakKey {
    /// The key a NAK (or RNR NAK) on the flow `key` leaves: its source is the
    /// responder.
    #[inline(always)]
    pub fn of_nak(key: &FlowKey, psn: u32, scope: u32) -> NakKey {
        NakKey {
            requester: key.dst,
            responder: key.src,
            inner_requester: key.inner_dst,
            inner_responder: key.inner_src,
            vni: key.vni,
            psn,
            flags: key.flags & NAK_KEY_FLAGS,
            scope,
        }
    }

    /// The key a go-back starting at `psn` on the request flow `key` looks for: its
    /// source is the requester.
    #[inline(always)]
    pub fn of_request(key: &FlowKey, psn: u32, scope: u32) -> NakKey {
        NakKey {
            requester: key.src,
            responder: key.dst,
            inner_requester: key.inner_src,
            inner_responder: key.inner_dst,
            vni: key.vni,
            psn,
            flags: key.flags & NAK_KEY_FLAGS,
            scope,
        }
    }
}

/// The [`NakKey::scope`] of the copies of the session `tag` names: its mirroring
/// device's address, session and encapsulation folded into a word. A session, not a
/// device: a device that copies the same traffic into several sessions (to several
/// collectors, or as the VM lab does) sends each packet once a session, and a NAK,
/// a request or a gap of one session must meet its answer in that session, not in a
/// twin's copy. So a device that mirrors each direction of a port into a session of
/// its own gives round trips and NAK pairings none (README, "Mirror sessions").
#[inline(always)]
pub fn mirror_scope(tag: &MirrorTag) -> u32 {
    tag.source[0]
        ^ tag.source[1]
        ^ tag.source[2]
        ^ tag.source[3]
        ^ tag.session.rotate_left(16)
        ^ tag.kind.rotate_left(8)
}

/// Where NAKs wait for their go-back. `FlowStats::record` remembers each NAK and RNR
/// NAK (with when it was seen), and a go-back takes the one that names its first PSN.
pub trait NakMemory {
    /// The [`NakKey::scope`] of the packet being counted.
    fn scope(&self) -> u32;
    /// The clock NAK-to-resend and recovery times are measured on, ns: the kernel's
    /// monotonic clock, a capture's frame time. Read only for NAKs, retransmissions
    /// and the end of a recovery.
    fn now_ns(&self) -> u64;
    fn remember(&mut self, key: &NakKey);
    /// When the NAK remembered under `key` was seen, if one was; forgets it (one NAK,
    /// one go-back: a responder NAKs a PSN once, so when the resend after it is lost
    /// too, the next go-back to that PSN follows the requester's timeout).
    fn take(&mut self, key: &NakKey) -> Option<u64>;
}

/// A memory that forgets everything: every go-back counts as a timeout. For callers
/// that count flows without their other direction (tests of a single flow).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoNaks;

impl NakMemory for NoNaks {
    fn scope(&self) -> u32 {
        0
    }
    fn now_ns(&self) -> u64 {
        0
    }
    fn remember(&mut self, _: &NakKey) {}
    fn take(&mut self, _: &NakKey) -> Option<u64> {
        None
    }
}

/// NAKs the user side's memory holds at most: beyond, the oldest is forgotten (the
/// kernel's LRU hash forgets the least recently used, NAK_PSNS's size in
/// `ebpf/src/maps.rs`). Either is far more NAKs than wait for a go-back at once.
#[cfg(any(feature = "std", test))]
pub const NAK_SET_MAX: usize = 1 << 16;

/// The user side's memory, and the scope of the packet being counted.
#[cfg(any(feature = "std", test))]
#[derive(Clone, Debug, Default)]
pub struct NakSet {
    /// Key -> (when it was remembered, a count of NAKs; when it was seen, ns).
    naks: std::collections::HashMap<NakKey, (u64, u64)>,
    /// Keys in the order they were remembered, with that count (a key taken or
    /// remembered again since leaves a stale entry, skipped when it comes up).
    order: std::collections::VecDeque<(NakKey, u64)>,
    remembered: u64,
    /// Go-backs that found their NAK.
    pub taken: u64,
    pub scope: u32,
    /// The time of the frame being counted (the caller's clock), ns.
    pub now_ns: u64,
}

#[cfg(any(feature = "std", test))]
impl NakSet {
    /// NAKs waiting for their go-back.
    pub fn len(&self) -> usize {
        self.naks.len()
    }
    pub fn is_empty(&self) -> bool {
        self.naks.is_empty()
    }
}

#[cfg(any(feature = "std", test))]
impl NakMemory for NakSet {
    fn scope(&self) -> u32 {
        self.scope
    }
    fn now_ns(&self) -> u64 {
        self.now_ns
    }
    fn remember(&mut self, key: &NakKey) {
        self.remembered += 1;
        self.naks.insert(*key, (self.remembered, self.now_ns));
        self.order.push_back((*key, self.remembered));
        while self.naks.len() > NAK_SET_MAX {
            let Some((old, at)) = self.order.pop_front() else {
                break;
            };
            if self.naks.get(&old).map(|v| v.0) == Some(at) {
                self.naks.remove(&old);
            }
        }
        // Stale entries beyond twice the bound: drop them.
        if self.order.len() > 2 * NAK_SET_MAX {
            let naks = &self.naks;
            self.order
                .retain(|(k, at)| naks.get(k).map(|v| v.0) == Some(*at));
        }
    }
    fn take(&mut self, key: &NakKey) -> Option<u64> {
        let found = self.naks.remove(key).map(|v| v.1);
        self.taken += u64::from(found.is_some());
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{addr_v4_mapped, KEY_EGRESS};

    #[test]
    fn a_nak_and_the_go_back_it_asks_for_meet_under_one_key() {
        let a = addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 1]));
        let b = addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 2]));
        let x = addr_v4_mapped(u32::from_ne_bytes([198, 19, 0, 1]));
        let y = addr_v4_mapped(u32::from_ne_bytes([198, 19, 0, 2]));
        // Requests a -> b (inner x -> y) to QP 0x11, leaving through tc; the NAK
        // b -> a to the requester's QP 0x22, arriving in XDP on another interface.
        let request = FlowKey {
            src: a,
            dst: b,
            inner_src: x,
            inner_dst: y,
            vni: 5001,
            dest_qp: 0x11,
            ifindex: 3,
            flags: KEY_TUNNELLED | KEY_EGRESS,
        };
        let nak = FlowKey {
            src: b,
            dst: a,
            inner_src: y,
            inner_dst: x,
            vni: 5001,
            dest_qp: 0x22,
            ifindex: 4,
            flags: KEY_TUNNELLED,
        };
        assert_eq!(
            NakKey::of_nak(&nak, 77, 0),
            NakKey::of_request(&request, 77, 0)
        );
        assert_ne!(
            NakKey::of_nak(&nak, 77, 0),
            NakKey::of_request(&request, 78, 0)
        );
        // The requests of the other direction (b -> a) do not take it.
        assert_ne!(NakKey::of_nak(&nak, 77, 0), NakKey::of_request(&nak, 77, 0));
        let mut m = NakSet {
            now_ns: 5_000,
            ..NakSet::default()
        };
        m.remember(&NakKey::of_nak(&nak, 77, 0));
        assert_eq!(m.take(&NakKey::of_request(&request, 77, 0)), Some(5_000));
        assert_eq!(
            m.take(&NakKey::of_request(&request, 77, 0)),
            None,
            "taken once"
        );
    }
}
