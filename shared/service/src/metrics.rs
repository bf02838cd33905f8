//! Prometheus metrics in text format at `/metrics`. Each service registers its own families on
//! top of the shared one: the latency and outcome of every call to Redis, Pub/Sub, Cloud Tasks
//! and forward URLs.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub dependency: &'static str,
    pub result: &'static str,
}

pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from 1 ms to about 30 min, for call latencies, delays and lateness.
pub fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 22))
}

#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub calls: HistogramFamily<CallLabels>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("drip");
        let calls: HistogramFamily<CallLabels> = Family::new_with_constructor(seconds_histogram);
        registry.register(
            "dependency_call_seconds",
            "Calls to Redis, Pub/Sub, Cloud Tasks and forward URLs",
            calls.clone(),
        );
        Self { registry, calls }
    }
}

impl Metrics {
    /// Runs a call to `dependency`, recording its latency and whether it failed.
    pub async fn time<T, E>(&self, dependency: &'static str, call: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let started = Instant::now();
        let result = call.await;
        let labels = CallLabels { dependency, result: if result.is_ok() { "ok" } else { "error" } };
        self.calls.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        result
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn routes(metrics: Arc<Metrics>) -> Router {
        Router::new().route("/metrics", get(render)).with_state(metrics)
    }
}

async fn render(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.render())
}
