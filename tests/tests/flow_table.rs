//! The flow table's upkeep against the real programs (BPF_PROG_TEST_RUN): a table of
//! 64 slots filled by packets, the least recently seen flows evicted by the agent when
//! free slots run short, their slots given back zeroed one poll later, and new flows
//! counted as "insert failed" while no slot is free (`agent/src/flow_table.rs`).

use std::net::Ipv4Addr;
use std::time::Duration;

use roce_agent::loader::LoadOptions;
use roce_common::counters::STAT_FLOW_INSERT_FAILED;
use roce_common::flow::FlowKey;
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
