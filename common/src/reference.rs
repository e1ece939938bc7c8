//! The reference classifier: the same `classify` and `FlowStats::record` as the
//! kernel program, over byte slices, into an ordinary hash map. `analyze` and the
//! differential tests run it.

use std::collections::HashMap;

use crate::classify::{walk, Walk};
use crate::config::RuntimeConfig;
use crate::counters::{stat_indices, STATS_LEN};
use crate::flow::FlowStats;
use crate::key::FlowKey;
use crate::packet::SlicePacket;
use crate::parsed::Outcome;

/// Flows and counters of everything fed to it, as the kernel would hold them (one CPU).
#[derive(Clone, Debug)]
pub struct ReferenceTable {
    pub config: RuntimeConfig,
    pub flows: HashMap<FlowKey, FlowStats>,
    pub stats: [u64; STATS_LEN as usize],
    /// The tick `FlowStats::record` is given: one per frame.
    tick: u32,
}

impl ReferenceTable {
    pub fn new(config: RuntimeConfig) -> Self {
        ReferenceTable {
            config,
            flows: HashMap::new(),
            stats: [0; STATS_LEN as usize],
            tick: 0,
        }
    }

    /// Classifies and counts one frame, as the XDP program does; returns the walk
    /// (outcome and layers) for callers that look further.
    pub fn process(&mut self, frame: &[u8], ifindex: u32, now_ns: u64) -> Walk {
        let walk = walk(&SlicePacket(frame), &self.config);
        let outcome = walk.outcome;
        count_stats(&mut self.stats, &outcome);
        if let Outcome::Flow(p) = &outcome {
            let mut key = p.key;
            key.ifindex = ifindex;
            let entry = self.flows.entry(key).or_insert_with(|| {
                self.stats[crate::counters::STAT_FLOW_CREATED as usize] += 1;
                FlowStats::default()
            });
            // Every frame its own tick: first/last seen are exact here.
            self.tick = self.tick.wrapping_add(1);
            entry.record(
                p,
                frame.len() as u32,
                self.tick,
                || now_ns,
                self.config.default_pmtu_log2,
            );
        }
        walk
    }
}

/// Counts one classified frame in STATS as the XDP program does: its class or parse
/// error (and the extra counter some outcomes have). Creating a flow is counted where
/// the flow is created. `analyze` counts through this too, in tables of its own.
#[inline]
pub fn count_stats(stats: &mut [u64; STATS_LEN as usize], outcome: &Outcome) {
    let (main, extra) = stat_indices(outcome);
    stats[main as usize] += 1;
    if let Some(i) = extra {
        stats[i as usize] += 1;
    }
}
