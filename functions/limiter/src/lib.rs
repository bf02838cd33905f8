//! The limiter: Pub/Sub pushes each event to `POST /push`; it reserves the event's slot with one
//! `reserve.lua` call, then forwards it now (after an inline wait of at most the rule's
//! `inline_wait`), schedules a Cloud Task for the slot, or dead-letters it with its reason, and
//! answers 204 only once that is done (5xx otherwise, so Pub/Sub redelivers).

mod actions;
pub mod console;
mod entities;
mod envelope;
mod push;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use drip_core::rules::ServiceRules;
use drip_core::time::Millis;
use drip_gcp::Publish;
use drip_gcp::http_target::HttpTarget;
use drip_service::answer::count_outcomes;
use drip_service::latency::LatencyWindows;
use drip_service::live_rules::{Acceptance, LiveRules};
use drip_service::metrics::ServiceMetrics;
use drip_service::shutdown::Shutdown;
use drip_service::task_batches::TaskBatcher;
use drip_store::Store;

pub use drip_core::overflow::MAX_INLINE_TASK_BODY;
pub use envelope::{PushedMessage, Unusable};
pub use settings::{ConsoleSettings, LimiterAuth, Routes, Settings};

/// Pub/Sub push requests carry up to 10 MB of data, base64-encoded (×4/3) in JSON, plus up to 100
/// attributes of at most 1,280 bytes each.
const MAX_PUSH_BYTES: usize = 14 * 1024 * 1024;

/// Everything a request needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub rules: Arc<LiveRules>,
    pub store: Arc<dyn Store>,
    pub publishers: Arc<dyn Publish>,
    /// Creates delayed events' tasks, those of one queue and bucket that arrive together in one;
    /// `None` on an instance that serves no `/push` (the admin service needs neither Cloud Tasks
    /// nor the task signing key).
    pub tasks: Option<Arc<TaskBatcher>>,
    /// Forward URLs.
    pub target: Arc<HttpTarget>,
    /// The calls to those targets of the current window, for latency-driven adaptive limits.
    pub latency: Arc<LatencyWindows>,
    /// Who may call each route class.
    pub auth: LimiterAuth,
    pub metrics: Arc<ServiceMetrics>,
    pub claim_check_max_bytes: usize,
    /// How long an attempt may take to act (the inline wait, the forward or task creation, and a
    /// dead letter); it is then answered 503 and its lease released.
    pub attempt_deadline: Duration,
    /// How long an attempt acts alone on its message: the deadline plus a margin.
    pub lease: Millis,
    /// After SIGTERM, what is left of each request is bounded by the time left.
    pub shutdown: Arc<Shutdown>,
    /// What the console's dead-letters page may read and replay to.
    pub dead_letters: Arc<console::DeadLetterSources>,
}

pub async fn build_state(settings: &Settings) -> anyhow::Result<AppState> {
    let common = &settings.common;
    let metrics = Arc::new(ServiceMetrics::new(
        ("decisions", "Events by rule and outcome (forward, delay or the dead-letter reason)"),
        ("delay_seconds", "How far after its decision an event's slot lies"),
    ));
    // The attempt deadline (and so the lease) is sized for the longest inline wait at start-up: a
    // reload may not lengthen it (that takes a new revision).
    let deadline_sized_for = Arc::new(std::sync::OnceLock::new());
    let accept: Acceptance = {
        let (settings, sized_for) = (settings.clone(), deadline_sized_for.clone());
        Box::new(move |rules: &ServiceRules| {
            let longest = longest_inline_wait(rules);
            settings.check_shutdown_budget(longest as u64).map_err(|e| e.to_string())?;
            match sized_for.get() {
                Some(&sized) if longest > sized => Err(format!(
                    "an inline_wait of {longest} ms is longer than this revision's attempt deadline allows ({sized} ms): deploy a new revision to lengthen it"
                )),
                _ => Ok(()),
            }
        })
    };
    let rules = common.load_rules(accept, metrics.shared.clone())?;
    let longest_inline_wait = longest_inline_wait(&rules.current());
    let _ = deadline_sized_for.set(longest_inline_wait);
    let attempt_deadline = settings.attempt_deadline(longest_inline_wait as u64);
    let redis = common.redis_store(metrics.shared.clone()).await?;
    let auth = settings.route_auth()?;
    let tasks = match auth.routes.push {
        true => Some(TaskBatcher::for_pushes(
            settings.tasks.connect(&common.project, common.task_signer()?).await?,
            settings.tasks.batching(),
        )),
        false => None,
    };
    let target = HttpTarget::new(Duration::from_millis(settings.forward_timeout_ms), settings.forward_id_token)?;
    Ok(AppState {
        rules,
        // Every Redis request is timed by the connection (drip_dependency_call_seconds{dependency="redis"}).
        store: Arc::new(redis),
        publishers: common.connect_pubsub(metrics.shared.clone()).await?,
        tasks,
        target: Arc::new(target),
        latency: Arc::default(),
        auth,
        metrics,
        claim_check_max_bytes: settings.claim_check_max_bytes,
        attempt_deadline,
        lease: attempt_deadline.as_millis() as Millis + drip_service::LEASE_MARGIN,
        shutdown: settings.shutdown(),
        dead_letters: Arc::new(settings.console.dead_letters(&common.project, common.pubsub_emulator_host.as_deref())),
    })
}

fn longest_inline_wait(rules: &ServiceRules) -> Millis {
    rules.rules.iter().map(|r| r.inline_wait).max().unwrap_or(0)
}

/// Each route class behind its own callers: `/push` (push subscriptions), `/v1/rules/...`
/// (operators), `/v1/feedback` (overflow consumers), `/console` (people, as IAP names them),
/// `/metrics` (the collector). A class that `DRIP_ROUTES` leaves out is not served at all (404),
/// whoever calls.
pub fn app(state: AppState) -> Router {
    let auth = &state.auth;
    let served = |on: bool, router: Router<AppState>| if on { router } else { Router::new() };
    let push = Router::new()
        .route("/push", post(push::push))
        .layer(DefaultBodyLimit::max(MAX_PUSH_BYTES))
        .route_layer(axum::middleware::from_fn_with_state(state.metrics.clone(), count_outcomes));
    let admin = Router::new()
        .route("/v1/rules/{rule}/keys/{key}", axum::routing::get(entities::inspect))
        .route(
            "/v1/rules/{rule}/keys/{key}/limits",
            axum::routing::get(entities::get_limits).put(entities::put_limit).delete(entities::delete_limit),
        )
        .route(
            "/v1/rules/{rule}/keys/{key}/pause",
            axum::routing::put(entities::pause_key).delete(entities::resume_key),
        )
        .route(
            "/v1/rules/{rule}/budgets/{budget}/pause",
            axum::routing::put(entities::pause_budget).delete(entities::resume_budget),
        )
        .route("/v1/rules/{rule}/limits", axum::routing::get(entities::list_limits))
        .route("/v1/rules/{rule}/history", axum::routing::get(entities::history));
    let feedback = Router::new().route("/v1/feedback", post(entities::feedback));
    // The console identifies its callers itself (a browser sends IAP's header, not a bearer token).
    let api = served(auth.routes.push, auth.push.protect(push))
        .merge(served(auth.routes.admin, auth.admin.protect(admin)))
        .merge(served(auth.routes.console, console::routes()))
        .merge(served(auth.routes.feedback, auth.feedback.protect(feedback)))
        .with_state(state.clone());
    drip_service::service_router(api, &auth.metrics, state.store, state.rules, state.metrics.shared.clone())
}
