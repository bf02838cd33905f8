//! The dispatcher: Cloud Tasks calls `POST /dispatch` at each delayed event's slot, and it
//! publishes the event to the overflow topic of its rule, answering 200 only once published
//! (5xx otherwise, so Cloud Tasks retries with backoff).

mod dispatch;

use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use drip_core::rules::RuleSet;
use drip_gcp::oidc::OidcVerifier;
use drip_gcp::pubsub::Publishers;
use drip_service::metrics::{HistogramFamily, Metrics, seconds_histogram};
use drip_service::settings::CommonSettings;
use drip_store::AnyConnection;
use envconfig::Envconfig;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The dispatcher's settings: the ones it shares with the limiter (README: "Settings").
#[derive(Debug, Clone, Envconfig)]
pub struct Settings {
    #[envconfig(nested)]
    pub common: CommonSettings,
}

impl Settings {
    pub fn from_env() -> anyhow::Result<Self> {
        Self::init_from_env().context("reading settings from the environment")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub rule: String,
    /// `published`, `duplicate`, or why the task was refused or dead-lettered.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

#[derive(Debug)]
pub struct DispatcherMetrics {
    pub shared: Arc<Metrics>,
    pub dispatches: Family<OutcomeLabels, Counter>,
    pub lateness: HistogramFamily<RuleLabels>,
}

impl DispatcherMetrics {
    pub fn new(mut metrics: Metrics) -> Self {
        let dispatches = Family::<OutcomeLabels, Counter>::default();
        let lateness: HistogramFamily<RuleLabels> = Family::new_with_constructor(seconds_histogram);
        metrics.registry.register("dispatches", "Tasks received, by rule and outcome", dispatches.clone());
        metrics.registry.register(
            "dispatch_lateness_seconds",
            "How long after its slot a task reached the dispatcher",
            lateness.clone(),
        );
        Self { shared: Arc::new(metrics), dispatches, lateness }
    }

    pub fn counted(&self, rule: &str, outcome: &str) {
        self.dispatches.get_or_create(&OutcomeLabels { rule: rule.to_owned(), outcome: outcome.to_owned() }).inc();
    }
}

#[derive(Debug, Clone)]
pub struct AppState {
    pub rules: Arc<RuleSet>,
    pub redis: AnyConnection,
    pub namespace: String,
    pub publishers: Arc<Publishers>,
    pub oidc: Option<Arc<OidcVerifier>>,
    pub metrics: Arc<DispatcherMetrics>,
    pub project: String,
}

pub async fn build_state(settings: &Settings) -> anyhow::Result<AppState> {
    let common = &settings.common;
    Ok(AppState {
        rules: common.load_rules(false)?,
        redis: common.connect_redis().await?,
        namespace: common.redis_namespace.clone(),
        publishers: common.connect_pubsub().await?,
        oidc: common.oidc_verifier(),
        metrics: Arc::new(DispatcherMetrics::new(Metrics::default())),
        project: common.project.clone(),
    })
}

pub fn app(state: AppState) -> Router {
    let authenticated = Router::new()
        .route("/dispatch", post(dispatch::dispatch))
        .layer(DefaultBodyLimit::max(1024 * 1024))
        .route_layer(axum::middleware::from_fn_with_state(state.oidc.clone(), drip_service::auth::require_oidc))
        .with_state(state.clone());
    Router::new()
        .merge(authenticated)
        .merge(drip_service::health::routes(state.redis.clone()))
        .merge(Metrics::routes(state.metrics.shared.clone()))
        .layer(drip_service::telemetry::trace_layer(&state.project))
}
