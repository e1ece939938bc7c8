//! The programs as they load on a kernel without the helpers newer than 5.10
//! (`KernelHelpers::NONE`: bpf_ktime_get_coarse_ns, 5.11, and bpf_xdp_load_bytes,
//! 5.18), run on this kernel through BPF_PROG_TEST_RUN beside the programs with every
//! helper: the same frame heads in events, the same rate limit, the same flows, and
//! first/last seen on CLOCK_MONOTONIC. Needs root.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use roce_agent::datapath::loader::{KernelHelpers, LoadOptions};
use roce_common::event::{
    EventRecord, EVENTS_PER_CPU_PER_WINDOW, EVENT_CE, EVENT_CNP, EVENT_PACKET_BYTES,
};
use roce_common::policy::{IfaceQos, ECN_KERNEL, HOST_AUDIT};
use roce_testkit::frame::{cnp, roce_frame, vxlan_frame, Eth, RoceMsg, L3};
use roce_tests::events::{EventsHarness, EventsOptions};
use roce_tests::expect::{key, untimed};
use roce_tests::harness::Harness;

const QP: u32 = 0x01_2345;
const SPORT: u16 = 0xC0DE;

fn host4(tos: u8) -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(tos)
}

fn host6(tos: u8) -> L3 {
    L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2),
    )
    .with_tos(tos)
}

/// DSCP 26 with CE.
const CE: u8 = (26 << 2) | 3;

/// CE frames of every length from 58 to 137 bytes (IPv4 SENDs), then a CNP, an IPv6
/// WRITE and a WRITE in VXLAN: frame heads of every length modulo 8, shorter and
/// longer than the 128 bytes an event keeps.
fn frames() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = (0..80)
        .map(|len| {
            roce_frame(
                &Eth::default(),
                &host4(CE),
                SPORT,
                &RoceMsg::send_only(QP, len as u32, len),
            )
        })
        .collect();
    out.push(roce_frame(&Eth::default(), &host4(CE), SPORT, &cnp(QP)));
    out.push(roce_frame(
        &Eth::default(),
        &host6(CE),
        SPORT,
        &RoceMsg::write_only(QP, 1, 300),
    ));
    let inner = roce_frame(
        &Eth::default(),
        &host4(CE),
        SPORT,
        &RoceMsg::write_only(QP, 2, 40),
    );
    out.push(vxlan_frame(&Eth::default(), &host4(0), 0xBEEF, 42, &inner));
    out
}

fn events(helpers: KernelHelpers) -> EventsHarness {
    EventsHarness::load(EventsOptions {
        helpers: Some(helpers),
        ..EventsOptions::default()
    })
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A record without its time.
fn untimed_record(mut r: EventRecord) -> EventRecord {
    r.ts_ns = 0;
    r
}

#[test]
fn the_probe_finds_every_helper_on_a_kernel_from_5_18_on() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let version = (next(), next());
    if version >= (5, 18) {
        assert_eq!(
            KernelHelpers::probe(),
            KernelHelpers::ALL,
            "kernel {version:?}"
        );
    }
}

#[test]
fn xdp_events_copy_the_same_frame_heads_from_packet_memory() {
    let mut with = events(KernelHelpers::ALL);
    let mut without = events(KernelHelpers::NONE);
    let frames = frames();
    assert!(frames.len() < EVENTS_PER_CPU_PER_WINDOW as usize);
    for f in &frames {
        with.xdp(f, 1);
        without.xdp(f, 1);
        let (a, b) = (with.drain(), without.drain());
        assert!(!a.is_empty(), "a CE event for a frame of {} bytes", f.len());
        assert_eq!(a.len(), b.len(), "frame of {} bytes", f.len());
        let want = f.len().min(EVENT_PACKET_BYTES);
        for (a, b) in a.into_iter().zip(b) {
            assert_eq!(b.captured as usize, want, "frame of {} bytes", f.len());
            assert_eq!(b.packet(), &f[..want], "frame of {} bytes", f.len());
            assert_eq!(
                untimed_record(b),
                untimed_record(a),
                "frame of {} bytes",
                f.len()
            );
        }
    }
    assert_eq!(without.stats(), with.stats());
}

#[test]
fn the_rate_limit_holds_on_the_monotonic_clock() {
    let mut h = events(KernelHelpers::NONE);
    let f = roce_frame(&Eth::default(), &host4(CE), SPORT, &cnp(QP));
    let before = monotonic_ns();
    h.xdp(&f, 250);
    let after = monotonic_ns();
    let records = h.drain();
    let limit = EVENTS_PER_CPU_PER_WINDOW as u64;
    // A CNP with CE is two events (CE and CNP), both under the one limit.
    assert_eq!(records.len() as u64, limit);
    assert!(records
        .iter()
        .all(|r| (before..=after).contains(&r.ts_ns) && [EVENT_CE, EVENT_CNP].contains(&r.kind)));
    let s = h.stats();
    assert_eq!((s.rate_limit, s.ring_full), (2 * 250 - limit, 0));
}

#[test]
fn egress_events_keep_their_frame_heads_without_the_new_helpers() {
    let mut h = EventsHarness::load(EventsOptions {
        helpers: Some(KernelHelpers::NONE),
        iface: IfaceQos {
            host: HOST_AUDIT,
            vtep: 0,
            ecn: ECN_KERNEL,
            _pad: 0,
        },
        ..EventsOptions::default()
    });
    let f = roce_frame(
        &Eth::default(),
        &host4(CE),
        SPORT,
        &RoceMsg::write_only(QP, 4, 200),
    );
    assert_eq!(h.tc_egress(&f), f, "audit changes no byte");
    let records = h.drain();
    assert_eq!(records.len(), 1);
    assert!(records[0].egress());
    assert_eq!(records[0].packet(), &f[..EVENT_PACKET_BYTES]);
}

#[test]
fn flows_are_the_same_and_stamped_on_the_monotonic_clock() {
    let opts = |helpers| LoadOptions {
        helpers: Some(helpers),
        ..LoadOptions::default()
    };
    let with = Harness::load_with(&opts(KernelHelpers::ALL));
    let without = Harness::load_with(&opts(KernelHelpers::NONE));
    let before = monotonic_ns();
    for f in frames() {
        with.pass(&f);
        without.pass(&f);
    }
    let after = monotonic_ns();
    let (a, b) = (with.flows(), without.flows());
    // The IPv4 SENDs and the CNP, the IPv6 WRITE, the WRITE in VXLAN.
    assert_eq!(a.len(), 3, "{a:#?}");
    assert_eq!(
        b.iter().map(|(k, s)| (*k, untimed(*s))).collect::<Vec<_>>(),
        a.iter().map(|(k, s)| (*k, untimed(*s))).collect::<Vec<_>>()
    );
    for s in b.values() {
        assert!((before..=after).contains(&s.first_seen_ns), "{s:?}");
        assert!((s.first_seen_ns..=after).contains(&s.last_seen_ns), "{s:?}");
    }
    // A packet at least a tick (10 ms at HZ=100) later moves last seen, not first.
    let flow = key(&host4(0), QP);
    let first = b[&flow];
    std::thread::sleep(Duration::from_millis(25));
    let again = monotonic_ns();
    without.pass(&frames()[0]);
    let done = monotonic_ns();
    let s = without.flows()[&flow];
    assert_eq!(s.first_seen_ns, first.first_seen_ns);
    assert!(
        (again..=done).contains(&s.last_seen_ns),
        "{s:?} {again}..{done}"
    );
}

#[test]
fn mirrored_flows_are_the_same_without_the_new_helpers() {
    use roce_testkit::mirror::{mirror_frame, truncated_copy, Encap};
    // xdp_mirror and the xdp_mirror_flows it tail-calls, loaded as on 5.10.
    let opts = |helpers| LoadOptions {
        helpers: Some(helpers),
        ..LoadOptions::default()
    };
    let with = Harness::load_mirror_with(&opts(KernelHelpers::ALL));
    let without = Harness::load_mirror_with(&opts(KernelHelpers::NONE));
    let outer = L3::v4(Ipv4Addr::new(198, 18, 9, 1), Ipv4Addr::new(198, 18, 9, 2));
    let before = monotonic_ns();
    for (i, f) in frames().iter().enumerate() {
        let encap = [Encap::gre(7), Encap::erspan2(8), Encap::erspan3(9)][i % 3];
        for copy in [
            mirror_frame(&Eth::default(), &outer, &encap, f),
            truncated_copy(&Eth::default(), &outer, &encap, f, 64),
        ] {
            with.pass(&copy);
            without.pass(&copy);
        }
    }
    let after = monotonic_ns();
    let (a, b) = (with.mirrored_flows(), without.mirrored_flows());
    // The IPv4 SENDs in each of the three sessions, the IPv6 WRITE, the VXLAN WRITE.
    assert_eq!(a.len(), 5, "{a:#?}");
    assert_eq!(
        b.iter().map(|(k, s)| (*k, untimed(*s))).collect::<Vec<_>>(),
        a.iter().map(|(k, s)| (*k, untimed(*s))).collect::<Vec<_>>()
    );
    for s in b.values() {
        assert!((before..=after).contains(&s.first_seen_ns), "{s:?}");
    }
    assert_eq!(with.stats(), without.stats());
}
