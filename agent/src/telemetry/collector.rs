//! Reading the kernel's maps into the flows document ([`LiveDocument`]): the flow
//! table (FLOW_SLOTS, read as memory a mapped window at a time; then the table's upkeep, see
//! `flow_table`) and STATS (CPUs summed), with interface indexes turned into names,
//! the kernel's monotonic first/last-seen times turned into Unix-epoch times, and
//! each flow's rates since the previous poll.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::datapath::loader::{LoadError, Loaded};
use crate::doc::event::monotonic_to_unix_offset_ns;
use crate::sys::netif;
use crate::telemetry::live::rtt_totals::RttTotals;
use crate::telemetry::live::{Beside, Builder, LiveDocument};

/// Owns the loaded programs and turns their maps into documents on demand.
pub struct Collector {
    loaded: Loaded,
    /// The previous poll's document (the one the API serves now) and when it was made:
    /// what rates are measured against.
    previous: Option<(Arc<LiveDocument>, Instant)>,
    /// Each interface's round trips so far (`roce_rtt_seconds`).
    rtt: RttTotals,
}

/// One poll's result and what it cost.
#[derive(Debug)]
pub struct Poll {
    /// Shared with the collector, which measures the next poll's rates against it.
    pub document: Arc<LiveDocument>,
    /// How long the whole poll took.
    pub elapsed: Duration,
    /// How long reading the flow table took (part of `elapsed`).
    pub read: Duration,
    /// Live flows in the table (including any not yet counted on).
    pub entries: usize,
}

impl Collector {
    pub fn new(loaded: Loaded) -> Collector {
        Collector {
            loaded,
            previous: None,
            rtt: RttTotals::default(),
        }
    }

    /// Reads the flow table and STATS once.
    pub fn poll(&mut self) -> Result<Poll, LoadError> {
        let start = Instant::now();
        // About as many flows as last time: the rows are not copied while they grow.
        let expected = self.previous.as_ref().map_or(0, |(d, _)| d.len());
        // Names are looked up once per interface per poll: interfaces come, go and
        // get renamed.
        // The clocks are compared once a poll: a step of the wall clock (NTP) shows
        // at the next one.
        let mut builder = Builder::new(expected + expected / 16, netif::name_of)
            .unix_offset_ns(monotonic_to_unix_offset_ns());
        let rtt = self.loaded.rtt_hists()?;
        let capture_gaps = self.loaded.capture_gaps()?;
        let cnps_wrong_class = self.loaded.cnps_wrong_class()?;
        let cnp_times = self.loaded.cnp_times()?;
        let mut rtt_now = HashMap::with_capacity(rtt.len());
        let entries = self
            .loaded
            .for_each_flow_indexed(|slot, key, stats, side| {
                let h = rtt.get(&slot);
                if let Some(h) = h {
                    rtt_now.insert(slot, (key.ifindex, *h));
                }
                let beside = Beside {
                    rtt: h,
                    capture_gaps: capture_gaps.get(&slot).copied().unwrap_or(0),
                    cnps_wrong_class: cnps_wrong_class.get(&slot),
                    outer_sport: side.outer_sport,
                    cnp_times: cnp_times.get(&slot),
                };
                builder.add_flow(key, stats, side.tag.as_ref(), beside)
            })?;
        self.rtt.update(rtt_now);
        let read = start.elapsed();
        self.loaded.maintain_flows(entries)?;
        let stats = self.loaded.stats()?;
        let vteps = crate::datapath::qos::vtep_records(&self.loaded.vteps()?);
        let now = Instant::now();
        let before = self
            .previous
            .as_ref()
            .map(|(d, at)| (&**d, now.duration_since(*at).as_secs_f64()));
        let mut document = builder.finish(&stats, before);
        document.counters.qos.vteps = vteps;
        document.counters.tunnels = document.tunnels();
        document.rtt = self
            .rtt
            .by_ifindex()
            .iter()
            .map(|(i, t)| {
                let name = netif::name_of(*i).unwrap_or_else(|| format!("if#{i}"));
                (name, t.clone())
            })
            .collect();
        document.rtt.sort_by(|a, b| a.0.cmp(&b.0));
        let document = Arc::new(document);
        // The old document goes when the API lets go of it too.
        self.previous = Some((document.clone(), now));
        Ok(Poll {
            document,
            elapsed: start.elapsed(),
            read,
            entries,
        })
    }

    /// The loaded programs (to attach or detach them).
    pub fn loaded_mut(&mut self) -> &mut Loaded {
        &mut self.loaded
    }
}
