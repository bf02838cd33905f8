//! The limiter: Pub/Sub pushes each event to `POST /push`; it reserves the event's slot with one
//! `reserve.lua` call, then forwards it now (after an inline wait of at most the rule's
//! `inline_wait`), schedules a Cloud Task for the slot, or dead-letters it with its reason, and
//! answers 204 only once that is done (5xx otherwise, so Pub/Sub redelivers).

mod actions;
mod envelope;
mod push;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use drip_core::rules::RuleSet;
use drip_gcp::oidc::OidcVerifier;
use drip_gcp::pubsub::Publishers;
use drip_gcp::tasks::{TaskCreator, TaskTarget};
use drip_service::metrics::ServiceMetrics;
use drip_store::{AnyConnection, RedisStore};

pub use actions::{ForwardIdToken, queue_index, task_id};
pub use envelope::{PushedMessage, Unusable};
pub use settings::Settings;

/// Pub/Sub push requests carry up to 10 MB of data, base64-encoded in JSON.
const MAX_PUSH_BYTES: usize = 16 * 1024 * 1024;

/// Everything a request needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub rules: Arc<RuleSet>,
    pub store: RedisStore<AnyConnection>,
    pub redis: AnyConnection,
    pub namespace: String,
    pub publishers: Arc<Publishers>,
    pub tasks: TaskCreator,
    pub queues: Arc<Vec<String>>,
    pub http: reqwest::Client,
    pub id_tokens: Arc<ForwardIdToken>,
    pub oidc: Option<Arc<OidcVerifier>>,
    pub metrics: Arc<ServiceMetrics>,
    pub claim_check_max_bytes: usize,
}

pub async fn build_state(settings: &Settings) -> anyhow::Result<AppState> {
    let common = &settings.common;
    let rules = common.load_rules(true)?;
    let redis = common.connect_redis().await?;
    let target = TaskTarget {
        url: settings.dispatcher_url.clone(),
        service_account: settings.tasks_service_account.clone(),
        audience: settings.tasks_audience(),
    };
    let tasks = TaskCreator::connect(
        settings.cloud_tasks_endpoint.as_deref(),
        target,
        Duration::from_millis(settings.tasks_timeout_ms),
    )
    .await
    .context("creating the Cloud Tasks client (CLOUD_TASKS_ENDPOINT / credentials)")?;
    let http = reqwest::Client::builder().timeout(Duration::from_millis(settings.forward_timeout_ms)).build()?;
    Ok(AppState {
        rules,
        store: RedisStore::new(redis.clone(), common.redis_namespace.clone()),
        redis,
        namespace: common.redis_namespace.clone(),
        publishers: common.connect_pubsub().await?,
        tasks,
        queues: Arc::new(settings.queues()?),
        http,
        id_tokens: Arc::new(ForwardIdToken::new(&settings.forward_id_token)),
        oidc: common.oidc_verifier(),
        metrics: Arc::new(ServiceMetrics::new(
            ("decisions", "Events by rule and outcome (forward, delay or the dead-letter reason)"),
            ("delay_seconds", "How far after its decision an event's slot lies"),
        )),
        claim_check_max_bytes: settings.claim_check_max_bytes,
    })
}

/// `GET /v1/rules/{rule}/keys/{key}`: the entity's state, as `drip inspect --json` prints it.
async fn inspect_entity(
    axum::extract::State(state): axum::extract::State<AppState>,
    axum::extract::Path((rule, key)): axum::extract::Path<(String, String)>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(rule) = state.rules.rule(&rule) else {
        return (axum::http::StatusCode::NOT_FOUND, "no such rule").into_response();
    };
    let key = drip_core::template::cap_key(key);
    let mut redis = state.redis.clone();
    match drip_store::inspect::inspect(&mut redis, &state.namespace, rule, &key).await {
        Ok(report) => axum::Json(report).into_response(),
        Err(error) => {
            tracing::warn!(%error, "inspect failed");
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, "redis unavailable").into_response()
        }
    }
}

pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/push", post(push::push))
        .layer(DefaultBodyLimit::max(MAX_PUSH_BYTES))
        .route("/v1/rules/{rule}/keys/{key}", axum::routing::get(inspect_entity))
        .with_state(state.clone());
    drip_service::service_router(api, state.oidc, state.redis, state.metrics.shared.clone())
}
