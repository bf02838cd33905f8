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
use drip_service::metrics::ServiceMetrics;
use drip_service::settings::CommonSettings;
use drip_store::AnyConnection;
use envconfig::Envconfig;

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

#[derive(Debug, Clone)]
pub struct AppState {
    pub rules: Arc<RuleSet>,
    pub redis: AnyConnection,
    pub namespace: String,
    pub publishers: Arc<Publishers>,
    pub oidc: Option<Arc<OidcVerifier>>,
    pub metrics: Arc<ServiceMetrics>,
}

pub async fn build_state(settings: &Settings) -> anyhow::Result<AppState> {
    let common = &settings.common;
    Ok(AppState {
        rules: common.load_rules(false)?,
        redis: common.connect_redis().await?,
        namespace: common.redis_namespace.clone(),
        publishers: common.connect_pubsub().await?,
        oidc: common.oidc_verifier(),
        metrics: Arc::new(ServiceMetrics::new(
            ("dispatches", "Tasks received, by rule and outcome"),
            ("dispatch_lateness_seconds", "How long after its slot a task reached the dispatcher"),
        )),
    })
}

pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/dispatch", post(dispatch::dispatch))
        .layer(DefaultBodyLimit::max(1024 * 1024))
        .with_state(state.clone());
    drip_service::service_router(api, state.oidc, state.redis, state.metrics.shared.clone())
}
