//! The dispatcher: Cloud Tasks calls `POST /dispatch` at each delayed event's slot, and it
//! publishes the event to the overflow topic of its rule, answering 200 only once published
//! (5xx otherwise, so Cloud Tasks retries with backoff).

mod dispatch;

use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use drip_core::overflow::TaskSigner;
use drip_core::time::Millis;
use drip_gcp::Publish;
use drip_gcp::oidc::OidcVerifier;
use drip_service::live_rules::LiveRules;
use drip_service::metrics::ServiceMetrics;
use drip_service::settings::CommonSettings;
use drip_store::{AnyConnection, RedisStore};

/// Cloud Tasks sends at most 1 MB per task.
const MAX_TASK_BYTES: usize = 1024 * 1024;
/// A dispatch claim outlives the attempt that holds it by this much.
const LEASE_MARGIN_MS: u64 = 5_000;
use envconfig::Envconfig;

/// The dispatcher's settings: the ones it shares with the limiter (README: "Settings").
#[derive(Debug, Clone, Envconfig)]
pub struct Settings {
    #[envconfig(nested)]
    pub common: CommonSettings,
    /// The queues' `max_attempts` (Terraform passes it): on the last attempt a failing task is
    /// dead-lettered instead of deleted by Cloud Tasks. -1: unlimited (no attempt is the last).
    #[envconfig(from = "DRIP_TASKS_MAX_ATTEMPTS", default = "100")]
    pub tasks_max_attempts: i64,
}

impl Settings {
    pub fn from_env() -> anyhow::Result<Self> {
        Self::init_from_env().context("reading settings from the environment")
    }
}

#[derive(Debug, Clone)]
pub struct AppState {
    pub rules: Arc<LiveRules>,
    pub store: RedisStore<AnyConnection>,
    /// For `/readyz`.
    pub publishers: Arc<dyn Publish>,
    pub oidc: Option<Arc<OidcVerifier>>,
    pub metrics: Arc<ServiceMetrics>,
    pub signer: TaskSigner,
    pub max_attempts: i64,
    /// How long one attempt publishes a task's message alone.
    pub lease: Millis,
}

impl AppState {
    /// `retry_count` is `X-CloudTasks-TaskRetryCount` (0 on the first attempt).
    pub fn is_last_attempt(&self, retry_count: i64) -> bool {
        self.max_attempts > 0 && retry_count + 1 >= self.max_attempts
    }
}

pub async fn build_state(settings: &Settings) -> anyhow::Result<AppState> {
    let common = &settings.common;
    let redis = common.connect_redis().await?;
    let metrics = Arc::new(ServiceMetrics::new(
        ("dispatches", "Tasks received, by rule and outcome"),
        ("dispatch_lateness_seconds", "How long after its slot a task reached the dispatcher"),
    ));
    Ok(AppState {
        rules: common.load_rules(Box::new(|_| Ok(())), metrics.shared.clone())?,
        store: RedisStore::new(redis, common.redis_namespace.clone()),
        signer: common.task_signer()?,
        max_attempts: settings.tasks_max_attempts,
        lease: (2 * common.publish_timeout_ms + 2 * common.redis_timeout_ms + LEASE_MARGIN_MS) as Millis,
        publishers: common.connect_pubsub().await?,
        oidc: common.oidc_verifier(),
        metrics,
    })
}

pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/dispatch", post(dispatch::dispatch))
        .layer(DefaultBodyLimit::max(MAX_TASK_BYTES))
        .with_state(state.clone());
    drip_service::service_router(api, state.oidc, Arc::new(state.store), state.rules, state.metrics.shared.clone())
}
