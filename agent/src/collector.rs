//! Reading the kernel's maps into a flow [`Document`]: FLOWS (CPUs merged) and STATS
//! (CPUs summed), with interface indexes turned into names, and each flow's rates since
//! the previous poll.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::doc::Document;
use crate::loader::{LoadError, Loaded};
use crate::netif;
use crate::rates::RateTracker;

/// Owns the loaded programs and turns their maps into documents on demand.
pub struct Collector {
    loaded: Loaded,
    rates: RateTracker,
}

/// One poll's result and what it cost.
#[derive(Debug)]
pub struct Poll {
    pub document: Document,
    /// How long reading the maps took.
    pub elapsed: Duration,
    /// Entries in FLOWS (including any not yet counted on).
    pub entries: usize,
}

impl Collector {
    pub fn new(loaded: Loaded) -> Collector {
        Collector {
            loaded,
            rates: RateTracker::default(),
        }
    }

    /// Reads FLOWS and STATS once.
    pub fn poll(&mut self) -> Result<Poll, LoadError> {
        let start = Instant::now();
        let flows = self.loaded.flows()?;
        let stats = self.loaded.stats()?;
        let entries = flows.len();
        // Names are looked up once per poll: interfaces come, go and get renamed.
        let mut names: HashMap<u32, Option<String>> = HashMap::new();
        for (k, _) in &flows {
            names
                .entry(k.ifindex)
                .or_insert_with(|| netif::name_of(k.ifindex));
        }
        let resolve = |i: u32| names.get(&i).cloned().flatten();
        let mut document = Document::build(flows, &stats, Some(&resolve));
        document.counters.qos.vteps = crate::qos::vtep_records(&self.loaded.vteps()?);
        self.rates.apply(&mut document, Instant::now());
        Ok(Poll {
            document,
            elapsed: start.elapsed(),
            entries,
        })
    }

    /// The loaded programs (to attach or detach them).
    pub fn loaded_mut(&mut self) -> &mut Loaded {
        &mut self.loaded
    }
}
