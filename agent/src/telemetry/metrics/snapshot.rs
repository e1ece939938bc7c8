//! What one scrape's exposition is made of: its families, each with its samples, in the
//! order they are written (a `Snapshot`, made once per scrape), and how they are
//! written: as one prometheus-client `Collector`, with `ConstCounter`/`ConstGauge`
//! values (no atomics, no label-set hash maps).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Counter,
    Gauge,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Value {
    Int(u64),
    Float(f64),
}

pub(super) type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
pub(super) struct Family {
    /// Without `_total`: the encoder adds it to counters.
    pub(super) name: String,
    pub(super) help: String,
    pub(super) kind: Kind,
    pub(super) samples: Vec<(Labels, Value)>,
}

/// A histogram family: per label set, the buckets (upper bound, count in it, not
/// cumulative: the encoder sums them), the count and the sum.
#[derive(Debug)]
pub(super) struct HistogramFamily {
    pub(super) name: String,
    pub(super) help: String,
    pub(super) samples: Vec<(Labels, HistogramValue)>,
}

#[derive(Debug)]
pub(super) struct HistogramValue {
    pub(super) buckets: Vec<(f64, u64)>,
    pub(super) count: u64,
    pub(super) sum: f64,
}

/// The families of one scrape, in the order they are written (the histograms last).
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    pub(super) families: Vec<Family>,
    pub(super) histograms: Vec<HistogramFamily>,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.families.iter().filter(|f| !f.samples.is_empty()) {
            let metric_type = match family.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut metric =
                encoder.encode_descriptor(&family.name, &family.help, None, metric_type)?;
            for (labels, value) in &family.samples {
                let sample = metric.encode_family(labels)?;
                match (family.kind, *value) {
                    (Kind::Counter, Value::Int(v)) => ConstCounter::new(v).encode(sample)?,
                    (Kind::Counter, Value::Float(v)) => ConstCounter::new(v).encode(sample)?,
                    (Kind::Gauge, Value::Int(v)) => ConstGauge::new(v).encode(sample)?,
                    (Kind::Gauge, Value::Float(v)) => ConstGauge::new(v).encode(sample)?,
                }
            }
        }
        for family in self.histograms.iter().filter(|f| !f.samples.is_empty()) {
            let mut metric = encoder.encode_descriptor(
                &family.name,
                &family.help,
                None,
                MetricType::Histogram,
            )?;
            for (labels, h) in &family.samples {
                let mut sample = metric.encode_family(labels)?;
                sample.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
            }
        }
        Ok(())
    }
}

impl Snapshot {
    pub(super) fn family(
        &mut self,
        name: impl Into<String>,
        kind: Kind,
        help: impl Into<String>,
    ) -> &mut Family {
        self.families.push(Family {
            name: name.into(),
            help: help.into(),
            kind,
            samples: Vec::new(),
        });
        let last = self.families.len() - 1;
        &mut self.families[last]
    }
}
