//! `GET /metrics`: the Prometheus text exposition (format 0.0.4), built at scrape time
//! from what the agent already holds (the latest flow [`Document`](crate::doc::Document),
//! the findings of the last audit) and from what is read for the scrape (RNIC port
//! counters in sysfs, PFC pause counters from ethtool statistics or DCB).
//!
//! Cardinality stays bounded whatever the table holds: flows are summed per interface,
//! direction and encapsulation in one pass; only the K flows with the most problems
//! (`top_flows`, default 10) get series of their own.
//!
//! This module holds the entry ([`Exporter::render`]) and what it is given; the parts:
//! - `host`: what is read from the host at scrape time ([`HostSources::read`]);
//! - `flow_pass`: the one pass over the flows (sums per group, the top K);
//! - `encode`: which families, from which inputs, and the text they make;
//! - `snapshot`: one scrape's families and samples, as prometheus-client writes them;
//! - `rnic_names`: the names of the RNIC port counters;
//! - `process`: the agent's own `process_*` families (CPU, memory, descriptors), from
//!   `/proc/self` at each scrape;
//! - `qps`: the QP table's families and the interfaces' visibility, from the last
//!   refresh of the table (`telemetry::qps::QpView`).

mod encode;
mod flow_pass;
mod host;
mod process;
mod qps;
mod rnic_names;
mod snapshot;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::doc::finding::Finding;
use crate::telemetry::ethtool::PfcCounters;
use crate::telemetry::live::LiveDocument;

pub use encode::encode;
use encode::{encode_ring, encode_snapshot, encode_subscribers};
pub use flow_pass::problems;
pub use host::{HostReadings, HostSources, RnicPortCounters};
pub use process::ProcessStats;
pub use qps::encode_qps;

/// The `Content-Type` of `GET /metrics`: the text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The agent's version, as `roce_agent_build_info` shows it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Why the exposition could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("encoding the metrics failed")]
    Encode(#[from] std::fmt::Error),
}

/// The sampled-event counters of the document (`counters.events` by kind,
/// `counters.events_dropped` by reason), when it has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub by_kind: BTreeMap<String, u64>,
    pub dropped: BTreeMap<String, u64>,
}

/// The sampled-event counters of `counters` (`counters.events` by kind,
/// `counters.events_dropped` by reason; zero when the agent has events off).
pub fn event_counts(counters: &crate::doc::Counters) -> Option<EventCounts> {
    let owned = |m: BTreeMap<&'static str, u64>| {
        m.into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<BTreeMap<String, u64>>()
    };
    Some(EventCounts {
        by_kind: owned(counters.events.named()),
        dropped: owned(counters.events_dropped.named()),
    })
}

/// Everything one exposition is made of.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub document: &'a LiveDocument,
    pub findings: &'a [Finding],
    /// None: the document has no event counters (no `roce_events_*` series).
    pub events: Option<&'a EventCounts>,
    pub rnic: &'a [RnicPortCounters],
    pub pfc: &'a [PfcCounters],
    /// How many flows get `roce_top_flow_*` series.
    pub top_flows: usize,
}

/// Makes `GET /metrics` for a running agent: the host sources and K.
#[derive(Debug)]
pub struct Exporter {
    /// A reload changes its interfaces ([`Exporter::set_interfaces`]).
    pub host: std::sync::RwLock<HostSources>,
    pub top_flows: usize,
    /// Configuration reloads (SIGHUP) so far.
    pub reloads: Arc<ReloadCounts>,
    /// The EVENTS ring's positions, for `roce_agent_events_ring_*` (None: no reader).
    pub events_ring: Option<Arc<crate::telemetry::ring_progress::RingProgress>>,
    /// The events' broadcast, for `roce_agent_events_subscribers` (None: no reader).
    pub events_feed: Option<tokio::sync::broadcast::Sender<Arc<crate::doc::event::Event>>>,
}

/// What the reloads of the configuration file did, for `roce_agent_config_*`.
#[derive(Debug)]
pub struct ReloadCounts {
    pub succeeded: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
    /// Whether the last reload succeeded (true before the first).
    pub last_ok: std::sync::atomic::AtomicBool,
}

impl Default for ReloadCounts {
    fn default() -> Self {
        ReloadCounts {
            succeeded: Default::default(),
            failed: Default::default(),
            last_ok: std::sync::atomic::AtomicBool::new(true),
        }
    }
}

impl ReloadCounts {
    pub fn record(&self, ok: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if ok {
            self.succeeded.fetch_add(1, Relaxed);
        } else {
            self.failed.fetch_add(1, Relaxed);
        }
        self.last_ok.store(ok, Relaxed);
    }
}

impl Exporter {
    /// The interfaces whose PFC counters are read from now on (a reload's).
    pub fn set_interfaces(&self, interfaces: Vec<String>) {
        let mut host = self
            .host
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        host.interfaces = interfaces;
    }

    /// The exposition for `document` and `findings`, reading the host's counters and
    /// the agent's own process figures (`process_*`) now.
    /// Blocking (sysfs, ioctl, netlink): call it off the async workers.
    pub fn render(
        &self,
        document: &LiveDocument,
        findings: &[Finding],
    ) -> Result<String, MetricsError> {
        self.render_with(document, findings, None)
    }

    /// [`Exporter::render`] with the QP table's and the visibility's families of
    /// `qps` (None: an agent without them).
    pub fn render_with(
        &self,
        document: &LiveDocument,
        findings: &[Finding],
        qps: Option<&crate::telemetry::qps::QpView>,
    ) -> Result<String, MetricsError> {
        let host = self
            .host
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .read();
        let events = event_counts(&document.counters);
        let mut text = encode(&Inputs {
            document,
            findings,
            events: events.as_ref(),
            rnic: &host.rnic,
            pfc: &host.pfc,
            top_flows: self.top_flows,
        })?;
        text.push_str(&self.reloads.encode()?);
        if let Some(ring) = &self.events_ring {
            text.push_str(&encode_ring(ring.read())?);
        }
        if let Some(feed) = &self.events_feed {
            text.push_str(&encode_subscribers(feed.receiver_count())?);
        }
        if let Some(view) = qps {
            text.push_str(&encode_qps(view, document)?);
        }
        text.push_str(&encode_snapshot(ProcessStats::read().snapshot())?);
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{test_flow, Counters, Ecn, Flow};
    use std::net::IpAddr;

    pub(super) fn flow(ifname: &str, src: &str, qp: u32, vni: Option<u32>) -> Flow {
        Flow {
            vni,
            inner_family: vni.map(|_| crate::doc::Family::Ipv4),
            inner_src: vni.map(|_| "198.19.0.1".parse::<IpAddr>().unwrap()),
            inner_dst: vni.map(|_| "198.19.0.2".parse::<IpAddr>().unwrap()),
            packets: 10,
            bytes: 1000,
            ecn: Ecn {
                ect0: 10,
                ..Ecn::default()
            },
            inner_ecn: vni.map(|_| Ecn {
                ect0: 10,
                ..Ecn::default()
            }),
            ..test_flow(ifname, src, "198.18.0.2", qp)
        }
    }

    pub(super) fn inputs<'a>(
        doc: &'a LiveDocument,
        findings: &'a [Finding],
        k: usize,
    ) -> Inputs<'a> {
        Inputs {
            document: doc,
            findings,
            events: None,
            rnic: &[],
            pfc: &[],
            top_flows: k,
        }
    }

    /// The value of the sample `name{labels}` (labels as they are written).
    pub(super) fn sample(text: &str, series: &str) -> Option<String> {
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')
                .map(str::to_string)
        })
    }

    #[test]
    fn event_counters_are_read_from_the_document() {
        let mut counters = Counters::default();
        counters.events.ce = 4;
        counters.events.cnp = 2;
        counters.events_dropped.rate_limit = 1;
        let events = event_counts(&counters).unwrap();
        assert_eq!(events.by_kind["ce"], 4);
        assert_eq!(events.by_kind["psn_gap"], 0);
        assert_eq!(events.dropped["rate_limit"], 1);
        assert_eq!(events.dropped["ring_full"], 0);
        // Every kind and reason, zero or not: the series exist from the start.
        let zero = event_counts(&Counters::default()).unwrap();
        assert_eq!(zero.by_kind.len(), 6);
        assert_eq!(zero.dropped.len(), 2);
        let doc = LiveDocument::default();
        let text = encode(&Inputs {
            events: Some(&events),
            ..inputs(&doc, &[], 10)
        })
        .unwrap();
        assert_eq!(
            sample(&text, r#"roce_events_total{kind="ce"}"#).as_deref(),
            Some("4")
        );
        assert_eq!(
            sample(&text, r#"roce_events_dropped_total{reason="rate_limit"}"#).as_deref(),
            Some("1")
        );
    }
}
