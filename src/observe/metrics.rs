//! Metric families built afresh from each snapshot: a registry per scrape,
//! filled with the values the snapshot holds, so that a scrape shows one
//! moment and the names, types and escaping are the Prometheus library's.

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, GaugeVec, Opts, Registry};

/// Every metric name starts with this.
pub const PREFIX: &str = "tailflight";

pub struct Families {
    registry: Registry,
}

impl Families {
    pub fn new() -> Self {
        Self {
            registry: Registry::new(),
        }
    }

    /// A gauge family named `tailflight_<name>`. The names are ours: an
    /// invalid one is a bug, found by the first scrape of any test.
    pub fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        let family = GaugeVec::new(Opts::new(format!("{PREFIX}_{name}"), help), labels)
            .unwrap_or_else(|e| panic!("metric {name}: {e}"));
        self.register(family.clone());
        family
    }

    /// A counter family, set to totals the snapshot holds.
    pub fn counters(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        let family = CounterVec::new(Opts::new(format!("{PREFIX}_{name}"), help), labels)
            .unwrap_or_else(|e| panic!("metric {name}: {e}"));
        self.register(family.clone());
        family
    }

    /// One unlabelled gauge.
    pub fn gauge(&self, name: &str, help: &str, value: f64) {
        self.gauges(name, help, &[])
            .with_label_values::<&str>(&[])
            .set(value);
    }

    /// One unlabelled counter at `total`.
    pub fn counter(&self, name: &str, help: &str, total: f64) {
        self.counters(name, help, &[])
            .with_label_values::<&str>(&[])
            .inc_by(total.max(0.0));
    }

    /// A collector that lives across scrapes (a histogram, the process).
    pub fn register(&self, collector: impl Collector + 'static) {
        if let Err(error) = self.registry.register(Box::new(collector)) {
            tracing::warn!(%error, "a metric could not be registered; it is left out of the scrape");
        }
    }

    /// The process's CPU, memory, descriptors and start time (`process_*`,
    /// the names every Prometheus client uses).
    pub fn process(&self) {
        self.register(prometheus::process_collector::ProcessCollector::for_self());
    }

    /// `tailflight_build_info`.
    pub fn build_info(&self, role: &str) {
        self.gauges(
            "build_info",
            "The version of tailflight running, and whether it runs as a watcher or a sink.",
            &["version", "role"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION"), role])
        .set(1.0);
    }

    pub fn gather(&self) -> Vec<MetricFamily> {
        self.registry.gather()
    }
}
