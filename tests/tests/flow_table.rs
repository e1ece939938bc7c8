//! The flow table's upkeep against the real programs (BPF_PROG_TEST_RUN): a table of
//! 64 slots filled by packets, the least recently seen flows evicted by the agent when
//! free slots run short, their slots given back zeroed one poll later, and new flows
//! counted as "insert failed" while no slot is free (`agent/src/flow_table.rs`).

use std::net::Ipv4Addr;
use std::time::Duration;

use roce_agent::datapath::loader::LoadOptions;
use roce_common::counters::STAT_FLOW_INSERT_FAILED;
use roce_common::key::FlowKey;
use roce_testkit::frame::{roce_frame, Eth, RoceMsg, L3};
use roce_tests::expect::key;
use roce_tests::harness::Harness;

const SLOTS: u32 = 64;

fn host() -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106)
}

fn send(h: &Harness, qp: u32) {
    h.pass(&roce_frame(
        &Eth::default(),
        &host(),
        0xC0DE,
        &RoceMsg::ack(qp, 1, 0x1f),
    ));
}

fn flow(qp: u32) -> FlowKey {
    key(&host(), qp)
}

/// Flow `qp` as made by hand (`Loaded::insert_flows`): one packet, last seen at `seen`.
fn made(qp: u32, seen: u64) -> (FlowKey, roce_common::flow::FlowStats) {
    let stats = roce_common::flow::FlowStats {
        packets: 1,
        first_seen_ns: seen,
        last_seen_ns: seen,
        ..Default::default()
    };
    (flow(qp), stats)
}

#[test]
fn the_least_recently_seen_flows_make_room_and_their_slots_come_back_zeroed() {
    let mut h = Harness::load_with(&LoadOptions {
        flows_max_entries: SLOTS,
        ..LoadOptions::default()
    });
    assert_eq!(h.loaded().flow_capacity(), SLOTS as usize);
    let old: Vec<u32> = (1..=32).collect();
    let new: Vec<u32> = (101..=130).collect();
    for &qp in &old {
        send(&h, qp);
    }
    // Past a few clock ticks: the old flows were last seen before any new one.
    std::thread::sleep(Duration::from_millis(30));
    for &qp in &new {
        send(&h, qp);
    }
    assert_eq!(h.flows().len(), 62);

    // 2 of 64 free, fewer than a sixteenth: evict 6, so that 8 will be free.
    let evicted = h.loaded_mut().maintain_flows(62).expect("upkeep");
    assert_eq!(evicted, 6);
    let flows = h.flows();
    assert_eq!(flows.len(), 56);
    let gone: Vec<u32> = old
        .iter()
        .copied()
        .filter(|&qp| !flows.contains_key(&flow(qp)))
        .collect();
    assert_eq!(gone.len(), 6, "six old flows went");
    assert!(new.iter().all(|&qp| flows.contains_key(&flow(qp))));
    assert!(gone
        .iter()
        .all(|&qp| h.loaded().flow_index(&flow(qp)).unwrap().is_none()));

    // The evicted slots wait for the next poll: two flows fill the table, a third
    // finds no slot and is counted as such, not on any flow.
    send(&h, 201);
    send(&h, 202);
    assert_eq!(h.stats()[STAT_FLOW_INSERT_FAILED as usize], 0);
    send(&h, 203);
    assert_eq!(h.stats()[STAT_FLOW_INSERT_FAILED as usize], 1);
    assert!(!h.flows().contains_key(&flow(203)));
    assert_eq!(h.flows().len(), 58);

    // The next poll gives the six back: new flows and an evicted one come (back) with
    // their own counts only, nothing left from the slots' earlier flows.
    let evicted = h.loaded_mut().maintain_flows(58).expect("upkeep");
    assert_eq!(evicted, 0, "6 free of 64: no more evictions");
    send(&h, 203);
    send(&h, gone[0]);
    send(&h, gone[0]);
    let flows = h.flows();
    assert_eq!(flows[&flow(203)].packets, 1);
    assert_eq!(flows[&flow(gone[0])].packets, 2);
    assert_eq!(flows.len(), 60);
    assert_eq!(h.loaded().flows_evicted_here(), 6);
}

#[test]
fn a_full_table_counts_insert_failures_and_keeps_every_flow_it_has() {
    let h = Harness::load_with(&LoadOptions {
        flows_max_entries: SLOTS,
        ..LoadOptions::default()
    });
    for qp in 1..=SLOTS + 10 {
        send(&h, qp);
    }
    for qp in 1..=SLOTS {
        send(&h, qp);
    }
    let flows = h.flows();
    assert_eq!(flows.len(), SLOTS as usize);
    assert!(flows.values().all(|s| s.packets == 2));
    assert_eq!(h.stats()[STAT_FLOW_INSERT_FAILED as usize], 10);
}

#[test]
fn an_adopted_table_gets_back_the_slots_its_last_agent_had_evicted() {
    use roce_agent::datapath::loader::{load_pinned, LoadError};
    use roce_agent::datapath::pin::PinDir;
    let bpffs = roce_testkit::bpffs::Bpffs::for_loads().expect("a bpffs (root needed)");
    let dir = bpffs.pin_dir();
    let opts = LoadOptions {
        flows_max_entries: SLOTS,
        ..LoadOptions::default()
    };
    let made = |qp: u32| made(qp, qp as u64 * 1_000_000);
    {
        let mut loaded =
            load_pinned(&opts, PinDir::prepare(&dir).expect("pin directory")).expect("load");
        let flows: Vec<_> = (1..=62).map(made).collect();
        assert_eq!(loaded.insert_flows(&flows).expect("62 flows"), 62);
        assert_eq!(loaded.maintain_flows(62).expect("upkeep"), 6);
        // The agent ends here, before its next poll would have given the six back.
    }
    let mut loaded =
        load_pinned(&opts, PinDir::prepare(&dir).expect("pin directory")).expect("adopt");
    let flows = loaded.flows().expect("flows");
    assert_eq!(flows.len(), 56);
    assert!(
        (1..=6).all(|qp| flows.iter().all(|(k, _)| *k != flow(qp))),
        "the six least recently seen went"
    );
    // 56 live of 64: the eight others are free again, the six evicted ones among them.
    // A flow already there, or twice in the list, takes no second slot.
    assert_eq!(loaded.insert_flows(&[made(10)]).expect("a live flow"), 0);
    let more: Vec<_> = (101..=108).chain([101]).map(made).collect();
    assert_eq!(loaded.insert_flows(&more).expect("eight free slots"), 8);
    let full = loaded.insert_flows(&[made(109)]);
    assert!(matches!(full, Err(LoadError::SlotsFull)), "{full:?}");
    assert_eq!(loaded.flows().expect("flows").len(), 64);
    // Nothing was attached: the maps go with the bpffs, once `loaded` lets go of them.
    drop(loaded);
}

/// A slot left live by an agent that died between deleting its flow's key and marking
/// it (played here by deleting the key behind the loader's back), while the flow came
/// back in another slot: eviction takes the stale slot back and leaves the key, which
/// belongs to the flow's new slot.
#[test]
fn eviction_takes_back_a_stale_slot_without_deleting_the_live_flows_key() {
    use aya::maps::{HashMap, Map, MapData};
    use roce_common::key::FlowKey4;
    use roce_common::names::map;
    let mut h = Harness::load_with(&LoadOptions {
        flows_max_entries: SLOTS,
        ..LoadOptions::default()
    });
    let loaded = h.loaded_mut();
    assert_eq!(loaded.insert_flows(&[made(1, 1)]).expect("flow 1"), 1);
    let stale = loaded
        .flow_index(&flow(1))
        .expect("lookup")
        .expect("flow 1 is in");
    {
        let fd = loaded.map_fd(map::FLOWS4).expect("FLOWS4");
        let data = MapData::from_fd(fd.try_clone_to_owned().expect("dup")).expect("FLOWS4");
        let mut flows4: HashMap<MapData, FlowKey4, u64> =
            HashMap::try_from(Map::HashMap(data)).expect("a hash");
        let k4 = FlowKey4::narrow(&flow(1)).expect("plain IPv4");
        flows4.remove(&k4).expect("the key was there");
    }
    // The flow comes back in a new slot, the most recently seen, and 60 more fill the
    // table to 62 of 64.
    let back: Vec<_> = [made(1, 1000)]
        .into_iter()
        .chain((2..=61).map(|qp| made(qp, 100 + qp as u64)))
        .collect();
    assert_eq!(loaded.insert_flows(&back).expect("61 flows"), 61);
    let fresh = loaded
        .flow_index(&flow(1))
        .expect("lookup")
        .expect("flow 1 is back");
    assert_ne!(fresh, stale);
    assert_eq!(
        loaded.flows().expect("flows").len(),
        62,
        "flow 1 shows twice"
    );

    // Short of free slots: the oldest six go, the stale slot first.
    assert_eq!(loaded.maintain_flows(62).expect("upkeep"), 6);
    assert_eq!(
        loaded.flow_index(&flow(1)).expect("lookup"),
        Some(fresh),
        "the live flow's key stays"
    );
    let flows = loaded.flows().expect("flows");
    assert_eq!(flows.len(), 56);
    assert_eq!(flows.iter().filter(|(k, _)| *k == flow(1)).count(), 1);
    assert_eq!(
        flows
            .iter()
            .find(|(k, _)| *k == flow(1))
            .unwrap()
            .1
            .last_seen_ns,
        1000
    );
}
