//! OTLP/gRPC export (`--otlp-endpoint URL`): at each interval, the same
//! snapshot the Prometheus endpoint serves, converted to OpenTelemetry's
//! metrics protocol (the official protobufs) and pushed to a collector, so
//! that both paths always agree. Counters become cumulative monotonic sums,
//! gauges gauges, histograms explicit-bucket histograms; names stay as
//! Prometheus has them.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus::proto::{MetricFamily, MetricType};

use super::snapshot::Observed;

/// Where and how often to push, and what the resource says of this process.
pub struct OtlpConfig {
    pub endpoint: String,
    pub every: Duration,
    /// `service.name`, `service.instance.id`, `tailflight.source`, ...
    pub resource: Vec<(String, String)>,
}

/// Pushes every `config.every` until aborted. A collector that is down
/// costs one warning per outage; nothing is buffered (the next push
/// carries the cumulative values anyway).
pub async fn run(config: OtlpConfig, observed: Arc<dyn Observed>) {
    let channel = match tonic::transport::Endpoint::from_shared(config.endpoint.clone()) {
        Ok(endpoint) => endpoint
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect_lazy(),
        Err(error) => {
            tracing::error!(endpoint = %config.endpoint, %error, "--otlp-endpoint is not a valid URL; no OTLP export");
            return;
        }
    };
    let mut client = MetricsServiceClient::new(channel);
    let started = unix_nanos(SystemTime::now());
    let resource = Resource {
        attributes: config
            .resource
            .iter()
            .map(|(key, value)| string_attribute(key, value))
            .collect(),
        ..Default::default()
    };
    let mut every = tokio::time::interval(config.every);
    let mut failing = false;
    loop {
        every.tick().await;
        let snapshot_of = observed.clone();
        let Ok(snapshot) = tokio::task::spawn_blocking(move || snapshot_of.snapshot()).await else {
            continue;
        };
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "tailflight".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    metrics: to_otlp(&snapshot.metrics, started, unix_nanos(SystemTime::now())),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        match client.export(request).await {
            Ok(_) => {
                if std::mem::take(&mut failing) {
                    tracing::info!(endpoint = %config.endpoint, "OTLP export works again");
                }
            }
            Err(status) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(endpoint = %config.endpoint, error = %status, "cannot export metrics over OTLP; retrying at each interval");
                }
            }
        }
    }
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn string_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

/// Prometheus families as OTLP metrics, with `start` as the start of every
/// cumulative value (the process's start) and `now` as their time.
pub fn to_otlp(families: &[MetricFamily], start: u64, now: u64) -> Vec<Metric> {
    families
        .iter()
        .filter_map(|family| {
            let attributes = |m: &prometheus::proto::Metric| -> Vec<KeyValue> {
                m.get_label()
                    .iter()
                    .map(|l| string_attribute(l.name(), l.value()))
                    .collect()
            };
            let point = |m: &prometheus::proto::Metric, value: f64| NumberDataPoint {
                attributes: attributes(m),
                start_time_unix_nano: start,
                time_unix_nano: now,
                value: Some(number_data_point::Value::AsDouble(value)),
                ..Default::default()
            };
            let metrics = family.get_metric();
            let data = match family.get_field_type() {
                MetricType::COUNTER => metric::Data::Sum(Sum {
                    data_points: metrics
                        .iter()
                        .map(|m| point(m, m.get_counter().get_value()))
                        .collect(),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                }),
                MetricType::GAUGE => metric::Data::Gauge(Gauge {
                    data_points: metrics
                        .iter()
                        .map(|m| point(m, m.get_gauge().get_value()))
                        .collect(),
                }),

                MetricType::HISTOGRAM => metric::Data::Histogram(Histogram {
                    data_points: metrics
                        .iter()
                        .map(|m| {
                            let h = m.get_histogram();
                            // Prometheus buckets are cumulative and end
                            // before +Inf; OTLP's are per bucket, with one
                            // more for what lies above the last bound.
                            let mut bucket_counts = Vec::new();
                            let mut explicit_bounds = Vec::new();
                            let mut below = 0;
                            for bucket in h.get_bucket() {
                                if bucket.upper_bound().is_infinite() {
                                    continue;
                                }
                                explicit_bounds.push(bucket.upper_bound());
                                bucket_counts.push(bucket.cumulative_count().saturating_sub(below));
                                below = bucket.cumulative_count();
                            }
                            bucket_counts.push(h.get_sample_count().saturating_sub(below));
                            HistogramDataPoint {
                                attributes: attributes(m),
                                start_time_unix_nano: start,
                                time_unix_nano: now,
                                count: h.get_sample_count(),
                                sum: Some(h.get_sample_sum()),
                                bucket_counts,
                                explicit_bounds,
                                ..Default::default()
                            }
                        })
                        .collect(),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                }),
                // None of ours are summaries or untyped.
                MetricType::SUMMARY | MetricType::UNTYPED => return None,
            };
            Some(Metric {
                name: family.name().to_string(),
                description: family.help().to_string(),
                data: Some(data),
                ..Default::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::core::Collector;

    #[test]
    fn counters_gauges_and_histograms_keep_their_values() {
        let registry = prometheus::Registry::new();
        let counter =
            prometheus::CounterVec::new(prometheus::Opts::new("bytes_total", "bytes"), &["source"])
                .expect("counter");
        counter.with_label_values(&["a"]).inc_by(42.0);
        let gauge = prometheus::Gauge::new("lag_seconds", "lag").expect("gauge");
        gauge.set(1.5);
        let histogram = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new("latency_seconds", "latency").buckets(vec![0.1, 1.0]),
        )
        .expect("histogram");
        for v in [0.05, 0.5, 0.5, 5.0] {
            histogram.observe(v);
        }
        for c in [
            Box::new(counter) as Box<dyn Collector>,
            Box::new(gauge),
            Box::new(histogram),
        ] {
            registry.register(c).expect("register");
        }
        let metrics = to_otlp(&registry.gather(), 1, 2);
        let by_name = |name: &str| {
            metrics
                .iter()
                .find(|m| m.name == name)
                .and_then(|m| m.data.clone())
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        let metric::Data::Sum(sum) = by_name("bytes_total") else {
            panic!("a counter is a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.data_points[0].value,
            Some(number_data_point::Value::AsDouble(42.0))
        );
        assert_eq!(sum.data_points[0].attributes[0].key, "source");
        let metric::Data::Gauge(gauge) = by_name("lag_seconds") else {
            panic!("a gauge is a gauge")
        };
        assert_eq!(
            gauge.data_points[0].value,
            Some(number_data_point::Value::AsDouble(1.5))
        );
        let metric::Data::Histogram(h) = by_name("latency_seconds") else {
            panic!("a histogram is a histogram")
        };
        let point = &h.data_points[0];
        assert_eq!(point.count, 4);
        assert_eq!(point.explicit_bounds, vec![0.1, 1.0]);
        assert_eq!(point.bucket_counts, vec![1, 2, 1]);
        assert_eq!(point.sum, Some(6.05));
    }
}
