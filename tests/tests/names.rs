//! The names declared once in `roce_common::names` are exactly the kernel object's:
//! a map or program renamed on one side only fails here, not at attach time on a host.

use roce_agent::datapath::loader::{load, LoadOptions};
use roce_common::names::{map, program};

#[test]
fn every_declared_map_and_program_is_in_the_object_and_nothing_else() {
    let loaded = load(&LoadOptions::default()).expect("loading the object (run as root)");
    let (maps, programs) = loaded.object_names();
    // aya also creates maps of its own for .rodata/.bss and logging: only ours count.
    let ours: Vec<&String> = maps
        .iter()
        .filter(|n| {
            n.starts_with(|c: char| c.is_ascii_uppercase())
                && n.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    let mut declared: Vec<&str> = map::ALL.to_vec();
    declared.sort();
    assert_eq!(ours, declared, "maps of the object: {maps:?}");
    let mut declared: Vec<&str> = program::ALL.to_vec();
    declared.sort();
    assert_eq!(programs, declared);
}

/// The maps as layout version 8 lays them out: (name, BPF map type, key size, value
/// size, entries; 0 where the configuration sizes the map). A change here is a change
/// of layout: raise `LAYOUT_VERSION` with it, so that a new binary never reads an old
/// pin the wrong way. Version 4: the mirror maps (FLOWS_MIRROR, MIRROR_TAGS,
/// MIRROR_SCRATCH, XDP_TAIL) and three more reasons in STATS, which
/// moved the counters after them. Version 5: the retransmission counters in FLOW_SLOTS
/// (320 bytes a slot, with a request flow's round-trip sample), the spike threshold in
/// CONFIG, the rtt_spike event counter in STATS, NAK_PSNS, NAK_WAITING
/// and the round-trip maps RTT_WAIT, RTT_WAIT_PSNS, RTT_HIST and RTT_HIST_ZERO;
/// COUNT_SCRATCH and a third XDP_TAIL slot (`xdp_count`). Version 6: a fourth
/// XDP_TAIL slot (`xdp_count_mirror`), a request flow's requester QP in its FLOW_SLOTS
/// slot (`rtt_peer_qp`, where 4 bytes were reserved), the rtt_unpaired counters in
/// STATS, and the capture-gap maps of mirror sessions (CAPTURE_GAP_WAIT,
/// CAPTURE_GAP_WAITING, CAPTURE_GAPS). Version 7: CNP_WRONG_CLASS, and the last
/// STATS entry (capture_gaps_undecided) taken. Version 8: TUNNEL_PORTS (a tunnelled
/// flow's outer UDP source port beside its slot), the VNI in VTEPS' key and the
/// inner CE count in its value, the outer port in COUNT_SCRATCH's parsed packet; the
/// ECN -> CNP timing maps (CE_WAIT, CNP_TIMES, CNP_TIMES_ZERO, CNP_SCRATCH, CE_ANSWERS; a flow's
/// `ce_wait_tag` where FlowStats had a byte of padding).
const LAYOUT_8: [(&str, u32, u32, u32, u32); 37] = [
    ("CAPTURE_GAPS", 1, 4, 8, 65536),
    ("CNP_WRONG_CLASS", 1, 4, 16, 65536),
    ("CE_WAIT", 9, 80, 8, 4096),
    ("CNP_TIMES", 1, 4, 2888, 65536),
    ("CNP_TIMES_ZERO", 2, 4, 2888, 1),
    ("CNP_SCRATCH", 6, 4, 112, 1),
    ("CE_ANSWERS", 2, 4, 8, 1),
    ("CAPTURE_GAP_WAIT", 9, 80, 12, 4096),
    ("CAPTURE_GAP_WAITING", 2, 4, 8, 1),
    ("CONFIG", 2, 4, 20, 2),
    ("COUNT_SCRATCH", 6, 4, 120, 1),
    ("EVENTS", 27, 0, 0, 0),
    ("EVENT_BUDGET", 6, 4, 40, 1),
    ("FLOWS", 1, 80, 8, 0),
    ("FLOWS4", 1, 16, 8, 0),
    ("FLOWS_MID", 1, 40, 8, 0),
    ("FLOWS_MIRROR", 1, 104, 8, 0),
    ("FLOW_FREE", 22, 0, 4, 0),
    ("FLOW_SLOTS", 2, 4, 320, 0),
    ("GENERATION", 2, 4, 8, 1),
    ("IFACE_QOS", 1, 4, 4, 256),
    ("IFACE_QOS_DIRECT", 2, 4, 4, 4096),
    ("MIRROR_SCRATCH", 6, 4, 36, 1),
    ("MIRROR_TAGS", 2, 4, 24, 0),
    ("NAK_PSNS", 9, 80, 8, 8192),
    ("NAK_WAITING", 2, 4, 8, 1),
    ("POLICY", 2, 4, 8, 128),
    ("QOS", 2, 4, 8, 2),
    ("RTT_HIST", 1, 4, 1440, 65536),
    ("RTT_HIST_ZERO", 2, 4, 1440, 1),
    ("RTT_WAIT", 9, 80, 16, 16384),
    ("RTT_WAIT_PSNS", 2, 4, 8, 4096),
    ("STATS", 6, 4, 8, 0),
    ("TC_TAIL", 3, 4, 4, 1),
    ("TUNNEL_PORTS", 2, 4, 8, 0),
    ("VTEPS", 10, 20, 48, 4096),
    ("XDP_TAIL", 3, 4, 4, 4),
];

/// Maps whose size is not part of the layout (the configuration or a counter list
/// sets it).
const SIZED_ELSEWHERE: [&str; 10] = [
    "EVENTS",
    "FLOWS",
    "FLOWS4",
    "FLOWS_MID",
    "FLOWS_MIRROR",
    "MIRROR_TAGS",
    "TUNNEL_PORTS",
    "FLOW_FREE",
    "FLOW_SLOTS",
    "STATS",
];

#[test]
fn the_pinned_maps_have_the_shapes_of_their_layout_version() {
    assert_eq!(
        roce_common::config::LAYOUT_VERSION,
        8,
        "a new version: give it its table"
    );
    let bpffs = roce_testkit::bpffs::Bpffs::for_loads().expect("a bpffs (root needed)");
    let dir = bpffs.pin_dir();
    let pins = roce_agent::datapath::pin::PinDir::prepare(&dir).expect("pin directory");
    let loaded =
        roce_agent::datapath::loader::load_pinned(&LoadOptions::default(), pins).expect("load");
    let mut shapes = Vec::new();
    for name in map::ALL {
        let info = aya::maps::MapInfo::from_pin(dir.join("maps").join(name)).expect(name);
        let kind = info.map_type().map(|t| t as u32).unwrap_or(u32::MAX);
        let entries = if SIZED_ELSEWHERE.contains(&name) {
            0
        } else {
            info.max_entries()
        };
        shapes.push((name, kind, info.key_size(), info.value_size(), entries));
    }
    drop(loaded);
    shapes.sort();
    let mut expected = LAYOUT_8.to_vec();
    expected.sort();
    assert_eq!(
        shapes, expected,
        "the map layout changed: raise LAYOUT_VERSION"
    );
}

/// `loader::flow_tables_kernel_bytes` (what the agent warns with at start) against the
/// kernel's own account of FLOWS4, FLOWS_MID, FLOWS, FLOWS_MIRROR (empty: not
/// preallocated), FLOW_SLOTS, MIRROR_TAGS, TUNNEL_PORTS and FLOW_FREE: `memlock` in each map's fdinfo.
#[test]
fn the_flow_table_memory_estimate_is_the_kernels_own_figure() {
    use std::os::fd::AsRawFd;
    let cpus = aya::util::nr_cpus().expect("possible CPUs");
    for entries in [4096u32, 65536, 300_000] {
        let loaded = load(&LoadOptions {
            flows_max_entries: entries,
            ..LoadOptions::default()
        })
        .expect("load");
        let mut kernel = 0u64;
        for name in [
            map::FLOWS4,
            map::FLOWS_MID,
            map::FLOWS,
            map::FLOWS_MIRROR,
            map::FLOW_SLOTS,
            map::MIRROR_TAGS,
            map::TUNNEL_PORTS,
            map::FLOW_FREE,
        ] {
            let fd = loaded.map_fd(name).expect(name);
            let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
                .expect("fdinfo");
            let memlock = fdinfo
                .lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("memlock in fdinfo");
            kernel += memlock;
        }
        let estimate = roce_agent::datapath::loader::flow_tables_kernel_bytes(entries, cpus);
        let ratio = estimate as f64 / kernel as f64;
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{entries} entries at {cpus} CPUs: estimate {estimate} B, kernel {kernel} B ({ratio:.3})"
        );
    }
}
