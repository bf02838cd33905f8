//! The dispatcher: Cloud Tasks calls `POST /dispatch` at each delayed event's slot, and it
//! publishes the event to the overflow topic of its rule (or POSTs it to the rule's
//! `overflow: { url }`), answering 200 only once done (5xx otherwise, so Cloud Tasks retries with
//! backoff). A URL that says wait gets the event back later: a new slot, a new task.

mod dispatch;
mod drain;
mod task;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use drip_core::overflow::{MAX_TASK_BYTES, TaskSigner};
use drip_core::rules::ServiceRules;
use drip_core::time::Millis;
use drip_gcp::Publish;
use drip_gcp::http_target::{HttpTarget, IdTokenMode};
use drip_service::answer::count_outcomes;
use drip_service::auth::RouteAuth;
use drip_service::latency::LatencyWindows;
use drip_service::live_rules::{Acceptance, LiveRules};
use drip_service::metrics::ServiceMetrics;
use drip_service::settings::CommonSettings;
use drip_service::task_batches::TaskBatcher;
use drip_service::tasks::TaskSettings;
use drip_store::Store;

use envconfig::Envconfig;

/// The dispatcher's settings: the ones it shares with the limiter (docs/operations.md: "Settings").
#[derive(Debug, Clone, Envconfig)]
pub struct Settings {
    #[envconfig(nested)]
    pub common: CommonSettings,
    /// The queues' `max_attempts` (Terraform passes it): on the last attempt a failing task is
    /// dead-lettered instead of deleted by Cloud Tasks. -1: unlimited (no attempt is the last).
    #[envconfig(from = "DRIP_TASKS_MAX_ATTEMPTS", default = "100")]
    pub tasks_max_attempts: i64,
    /// To give an event a new slot when an `overflow: { url }` target says wait (optional when no
    /// rule has one).
    #[envconfig(nested)]
    pub tasks: TaskSettings,
    #[envconfig(from = "DRIP_FORWARD_TIMEOUT_MS", default = "5000")]
    pub forward_timeout_ms: u64,
    /// `auto` (a Google ID token for `*.run.app` URLs), `always` or `never`.
    #[envconfig(from = "DRIP_FORWARD_ID_TOKEN", default = "auto")]
    pub forward_id_token: IdTokenMode,
    /// A sealed task that runs at most this long before its slot waits for it; earlier, it is
    /// answered 503 and Cloud Tasks tries again later.
    #[envconfig(from = "DRIP_DISPATCH_EARLY_TOLERANCE_MS", default = "1000")]
    pub early_tolerance_ms: u64,
    /// Until this time (RFC 3339), tasks made by a version that did not seal them (unsigned, or
    /// signed over the body alone) are still published, to topics a rule owns (docs/operations.md: "Upgrading").
    /// Unset: every unsealed task is refused.
    #[envconfig(from = "DRIP_ACCEPT_UNSIGNED_TASKS_UNTIL")]
    pub accept_unsigned_tasks_until: Option<String>,
    /// Service accounts whose tokens Cloud Tasks sends to `/dispatch`; required with OIDC on.
    #[envconfig(from = "DRIP_TASK_CALLERS", default = "")]
    pub task_callers: String,
}

impl Settings {
    pub fn from_env() -> anyhow::Result<Self> {
        let settings: Self = drip_service::settings::from_env()?;
        settings.accept_unsigned_until()?;
        settings.route_auth()?;
        Ok(settings)
    }

    /// `/dispatch`'s callers and `/metrics`'.
    pub fn route_auth(&self) -> anyhow::Result<(RouteAuth, RouteAuth)> {
        let auth = self.common.auth()?;
        Ok((
            auth.route("DRIP_TASK_CALLERS", &self.task_callers, true)?,
            auth.route("DRIP_METRICS_CALLERS", &self.common.metrics_callers, false)?,
        ))
    }

    pub fn accept_unsigned_until(&self) -> anyhow::Result<Option<Millis>> {
        match self.accept_unsigned_tasks_until.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(None),
            Some(text) => drip_core::time::parse_rfc3339(text).map(Some).map_err(|e| {
                anyhow::anyhow!("DRIP_ACCEPT_UNSIGNED_TASKS_UNTIL: {e} (expected e.g. 2027-01-15T00:00:00Z)")
            }),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AppState {
    pub rules: Arc<LiveRules>,
    pub store: Arc<dyn Store>,
    /// For `/readyz`.
    pub publishers: Arc<dyn Publish>,
    /// Who may run tasks (`/dispatch`) and read `/metrics`.
    pub auth: (RouteAuth, RouteAuth),
    pub metrics: Arc<ServiceMetrics>,
    pub signer: TaskSigner,
    pub max_attempts: i64,
    /// How long one attempt publishes a task's message alone.
    pub lease: Millis,
    /// `overflow: { url }` targets.
    pub target: Arc<HttpTarget>,
    /// The calls to those targets of the current window, for latency-driven adaptive limits.
    pub latency: Arc<LatencyWindows>,
    /// For new slots of events such a target told to wait; `None` when not configured.
    /// Creates rescheduled events' tasks, those of one queue and bucket that arrive together in
    /// one (as the limiter's).
    pub tasks: Option<Arc<TaskBatcher>>,
    /// How long before its slot a sealed task may run (it then waits for the slot).
    pub early_tolerance: Millis,
    /// Unsealed tasks are published until then (an upgrade window); `None`: never.
    pub accept_unsigned_until: Option<Millis>,
}

impl AppState {
    /// `retry_count` is `X-CloudTasks-TaskRetryCount` (0 on the first attempt).
    pub fn is_last_attempt(&self, retry_count: i64) -> bool {
        self.max_attempts > 0 && retry_count + 1 >= self.max_attempts
    }

    pub fn accepts_unsigned(&self, now: Millis) -> bool {
        self.accept_unsigned_until.is_some_and(|until| now < until)
    }
}

pub async fn build_state(settings: &Settings) -> anyhow::Result<AppState> {
    let common = &settings.common;
    let metrics = Arc::new(ServiceMetrics::new(
        ("dispatches", "Tasks received, by rule and outcome"),
        ("dispatch_lateness_seconds", "How long after its slot a task reached the dispatcher"),
    ));
    let redis = common.redis_store(metrics.shared.clone()).await?;
    let tasks = match settings.tasks.configured() {
        true => Some(TaskBatcher::new(
            settings.tasks.connect(&common.project, common.task_signer()?).await?,
            settings.tasks.batching(),
        )),
        false => None,
    };
    // An `overflow: { url }` target may say wait: then this service creates the event's next task.
    let can_reschedule = tasks.is_some();
    let accept: Acceptance = Box::new(move |rules: &ServiceRules| {
        match rules.rules.iter().find(|r| r.overflow_url.is_some()) {
            Some(rule) if !can_reschedule => Err(format!(
                "rule '{}' has overflow: {{ url }}, which needs DRIP_TASKS_QUEUES and DRIP_DISPATCHER_URL on the dispatcher",
                rule.name
            )),
            _ => Ok(()),
        }
    });
    Ok(AppState {
        rules: common.load_rules(accept, metrics.shared.clone())?,
        // Every Redis request is timed by the connection (drip_dependency_call_seconds{dependency="redis"}).
        store: Arc::new(redis),
        signer: common.task_signer()?,
        max_attempts: settings.tasks_max_attempts,
        // A publish or a delivery, a dead letter, a new slot and its task, and Redis around them.
        lease: (2 * common.publish_timeout_ms
            + settings.forward_timeout_ms
            + settings.tasks.tasks_timeout_ms
            + 4 * common.redis_timeout_ms
            + drip_service::LEASE_MARGIN as u64) as Millis,
        publishers: common.connect_pubsub(metrics.shared.clone()).await?,
        auth: settings.route_auth()?,
        metrics,
        target: Arc::new(HttpTarget::new(
            std::time::Duration::from_millis(settings.forward_timeout_ms),
            settings.forward_id_token,
        )?),
        latency: Arc::default(),
        tasks,
        early_tolerance: settings.early_tolerance_ms as Millis,
        accept_unsigned_until: settings.accept_unsigned_until()?,
    })
}

pub fn app(state: AppState) -> Router {
    let (tasks, metrics) = &state.auth;
    let dispatch = Router::new()
        .route("/dispatch", post(dispatch::dispatch))
        .layer(DefaultBodyLimit::max(MAX_TASK_BYTES))
        .route_layer(axum::middleware::from_fn_with_state(state.metrics.clone(), count_outcomes));
    let api = tasks.protect(dispatch).with_state(state.clone());
    drip_service::service_router(api, metrics, state.store, state.rules, state.metrics.shared.clone())
}
