//! The reference classifier: the same `classify` and `FlowStats::record` as the
//! kernel program, over byte slices, into an ordinary hash map. `analyze` and the
//! differential tests run it.

use std::collections::HashMap;

use crate::classify::{walk, walk_mirror, MirrorWalk, Walk};
use crate::config::RuntimeConfig;
use crate::counters::{stat_indices, STATS_LEN};
use crate::flow::FlowStats;
use crate::key::{FlowKey, FlowKeyMirror};
use crate::nak::{mirror_scope, NakSet};
use crate::packet::SlicePacket;
use crate::parsed::Outcome;
use crate::rtt::NoRtt;

/// Flows and counters of everything fed to it, as the kernel would hold them (one CPU).
#[derive(Clone, Debug)]
pub struct ReferenceTable {
    pub config: RuntimeConfig,
    pub flows: HashMap<FlowKey, FlowStats>,
    /// Flows of mirror copies (`decapsulate_mirrors`), under their key and session.
    pub mirror_flows: HashMap<FlowKeyMirror, FlowStats>,
    pub stats: [u64; STATS_LEN as usize],
    /// Walk frames as `xdp_mirror` does (a mirror collector interface, a capture of a
    /// mirror port) rather than as `xdp_classify` does.
    pub decapsulate_mirrors: bool,
    /// NAKs waiting for their go-back (`nak`), as the kernel's NAK_PSNS holds them.
    pub naks: NakSet,
    /// The tick `FlowStats::record` is given: one per frame.
    tick: u32,
}

impl ReferenceTable {
    pub fn new(config: RuntimeConfig) -> Self {
        ReferenceTable {
            config,
            flows: HashMap::new(),
            mirror_flows: HashMap::new(),
            stats: [0; STATS_LEN as usize],
            decapsulate_mirrors: false,
            naks: NakSet::default(),
            tick: 0,
        }
    }

    /// The same, decapsulating mirror copies as `xdp_mirror` does.
    pub fn with_mirrors(config: RuntimeConfig) -> Self {
        ReferenceTable {
            decapsulate_mirrors: true,
            ..ReferenceTable::new(config)
        }
    }

    /// Classifies and counts one frame, as the XDP program does; returns the walk
    /// (outcome and layers) for callers that look further.
    pub fn process(&mut self, frame: &[u8], ifindex: u32, now_ns: u64) -> Walk {
        self.process_copy(frame, ifindex, now_ns).walk
    }

    /// [`Self::process`], saying also which mirror copy the frame was (None when not
    /// one, or when not decapsulating).
    pub fn process_copy(&mut self, frame: &[u8], ifindex: u32, now_ns: u64) -> MirrorWalk {
        let w = if self.decapsulate_mirrors {
            walk_mirror(frame, &self.config)
        } else {
            MirrorWalk {
                walk: walk(&SlicePacket(frame), &self.config),
                copy: None,
            }
        };
        let outcome = w.walk.outcome;
        count_stats(&mut self.stats, &outcome);
        if let Outcome::Flow(p) = &outcome {
            let mut key = p.key;
            key.ifindex = ifindex;
            let created = &mut self.stats[crate::counters::STAT_FLOW_CREATED as usize];
            self.naks.scope = w.copy.map_or(0, |c| mirror_scope(&c.tag));
            let (entry, frame_len) = match w.copy {
                Some(c) => (
                    self.mirror_flows
                        .entry(FlowKeyMirror { key, tag: c.tag })
                        .or_insert_with(|| {
                            *created += 1;
                            FlowStats::default()
                        }),
                    c.wire_len,
                ),
                None => (
                    self.flows.entry(key).or_insert_with(|| {
                        *created += 1;
                        FlowStats::default()
                    }),
                    frame.len() as u32,
                ),
            };
            // Every frame its own tick: first/last seen are exact here.
            self.tick = self.tick.wrapping_add(1);
            entry.record(
                p,
                frame_len,
                self.tick,
                || now_ns,
                self.config.default_pmtu_log2,
                &mut self.naks,
                // One program's view: round trips need tc and XDP together.
                &mut NoRtt,
            );
        }
        w
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
