//! The local stack a test runs Drip against: Redis, the Pub/Sub emulator, the Cloud Tasks
//! stand-in (in-process, the real stand-in code) and the limiter itself on a loopback port.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use cloud_tasks_emulator::client::EmulatorClient;
use cloud_tasks_emulator::{Emulator, RetryConfig, Settings as EmulatorSettings};
use drip_limiter::{AppState, Settings, app, build_state};
use drip_service::settings::CommonSettings;
use drip_service::tasks::TaskSettings;

use crate::pubsub_emulator::PROJECT;
use crate::unique;

pub const LOCATION: &str = "local";
/// The task signing key every service under test shares (DRIP_TASK_SIGNING_KEY).
pub const SIGNING_KEY: &str = "test-signing-key-0123456789abcdef0123456789";

/// A running Cloud Tasks stand-in.
#[derive(Debug, Clone)]
pub struct TasksStandIn {
    pub endpoint: String,
    pub client: EmulatorClient,
    pub emulator: Emulator,
}

impl TasksStandIn {
    pub async fn start() -> Self {
        let emulator = Emulator::new(EmulatorSettings::default());
        let (addr, _) =
            emulator.clone().serve(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await.expect("bind the stand-in");
        let endpoint = format!("http://{addr}");
        Self { client: EmulatorClient::new(endpoint.clone()), endpoint, emulator }
    }

    /// Creates `count` queues named after `prefix`, retrying fast; returns their full names.
    pub fn queues(&self, prefix: &str, count: usize) -> Vec<String> {
        (0..count)
            .map(|i| {
                let name = format!("projects/{PROJECT}/locations/{LOCATION}/queues/{prefix}-{i}");
                let retry =
                    RetryConfig { max_attempts: 20, min_backoff_ms: 100, max_backoff_ms: 1_000, max_doublings: 3 };
                self.emulator.create_queue(&name, retry).expect("a new queue");
                name
            })
            .collect()
    }
}

/// What a recording HTTP target received.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// An HTTP endpoint on loopback that records requests and answers `status` (changeable).
#[derive(Debug, Clone)]
pub struct RecordingTarget {
    pub url: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    pub status: Arc<Mutex<u16>>,
}

impl RecordingTarget {
    pub async fn start() -> Self {
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let status = Arc::new(Mutex::new(200u16));
        let (log, answer) = (received.clone(), status.clone());
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (log, answer) = (log.clone(), answer.clone());
            async move {
                log.lock().expect("lock").push(Received { headers, body: body.to_vec() });
                StatusCode::from_u16(*answer.lock().expect("lock")).unwrap_or(StatusCode::OK)
            }
        });
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
        let url = format!("http://{}/receive", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, received, status }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }
}

/// Each route class's callers (comma-separated emails).
#[derive(Debug, Clone, Default)]
pub struct Callers {
    pub push: String,
    pub admin: String,
    pub feedback: String,
    pub metrics: String,
}

/// How to wire a limiter under test.
#[derive(Debug, Clone)]
pub struct LimiterWiring {
    pub redis_url: String,
    pub pubsub_host: String,
    pub tasks_endpoint: String,
    pub queues: Vec<String>,
    pub dispatcher_url: String,
    /// With an audience, OIDC is on (DRIP_AUTH=oidc); without, off.
    pub oidc_audience: Option<String>,
    pub oidc_jwks_url: Option<String>,
    /// DRIP_PUSH_CALLERS, DRIP_ADMIN_CALLERS, DRIP_FEEDBACK_CALLERS and DRIP_METRICS_CALLERS.
    pub callers: Callers,
    pub claim_check_max_bytes: usize,
    /// `DRIP_RESERVE_BATCH_MAX` and `DRIP_TASK_BATCH_MAX` (1: one call, one task per event).
    pub batch_max: usize,
    /// `DRIP_TASK_BATCH_LINGER_MS` (0 here: a lone delayed push goes at once).
    pub task_linger_ms: u64,
    pub timeouts_ms: u64,
    /// The Redis key namespace (a dispatcher working with this limiter must share it).
    pub namespace: String,
    /// `redis_url` is a node of a Redis Cluster.
    pub redis_cluster: bool,
    /// How often the limiter re-reads its rules file (0: never, in tests that do not change it).
    pub rules_poll_ms: u64,
    /// `DRIP_ROUTES`: the route classes it serves.
    pub routes: String,
    /// Who may use the console.
    pub console: drip_limiter::ConsoleSettings,
}

impl LimiterWiring {
    pub fn new(
        redis_url: String,
        pubsub_host: String,
        tasks: &TasksStandIn,
        queues: Vec<String>,
        dispatcher_url: String,
    ) -> Self {
        Self {
            redis_url,
            pubsub_host,
            tasks_endpoint: tasks.endpoint.clone(),
            queues,
            dispatcher_url,
            oidc_audience: None,
            oidc_jwks_url: None,
            callers: Callers::default(),
            claim_check_max_bytes: 1024 * 1024,
            batch_max: 64,
            task_linger_ms: 0,
            timeouts_ms: 3_000,
            namespace: unique("drip"),
            redis_cluster: false,
            rules_poll_ms: 0,
            routes: "push,admin,feedback,console".into(),
            console: drip_limiter::ConsoleSettings::default(),
        }
    }
}

/// A limiter serving on loopback.
#[derive(Debug, Clone)]
pub struct LimiterUnderTest {
    pub url: String,
    pub state: AppState,
    pub namespace: String,
    pub redis_url: String,
    /// The rules file it runs: rewrite it to change its rules (with `rules_poll_ms` set).
    pub rules_path: std::path::PathBuf,
}

pub async fn spawn_limiter(rules_yaml: &str, wiring: &LimiterWiring) -> LimiterUnderTest {
    let rules_path = std::env::temp_dir().join(format!("{}.yaml", unique("rules")));
    std::fs::write(&rules_path, rules_yaml).expect("write rules");
    let namespace = wiring.namespace.clone();
    let settings = Settings {
        common: CommonSettings {
            port: 0,
            redis_url: wiring.redis_url.clone(),
            redis_ca_cert: None,
            redis_cluster: wiring.redis_cluster,
            redis_namespace: namespace.clone(),
            redis_timeout_ms: wiring.timeouts_ms,
            reserve_batch_max: wiring.batch_max,
            publish_batch_max: wiring.batch_max,
            redis_iam_auth: false,
            project: PROJECT.into(),
            rules: rules_path.display().to_string(),
            rules_poll_ms: wiring.rules_poll_ms,
            pubsub_emulator_host: Some(wiring.pubsub_host.clone()),
            publish_timeout_ms: wiring.timeouts_ms,
            // Generous: these in-process services never get SIGTERM, and their 3 s timeouts
            // add up to more than Cloud Run's 10 s.
            shutdown_grace_ms: 60_000,
            auth: if wiring.oidc_audience.is_some() { "oidc" } else { "off" }.into(),
            oidc_audience: wiring.oidc_audience.clone(),
            oidc_allowed_emails: None,
            metrics_port: None,
            metrics_callers: wiring.callers.metrics.clone(),
            oidc_jwks_url: wiring.oidc_jwks_url.clone(),
            task_signing_key: SIGNING_KEY.into(),
            task_signing_key_previous: None,
        },
        tasks: TaskSettings {
            task_batch_max: wiring.batch_max,
            task_batch_linger_ms: wiring.task_linger_ms,
            ..task_settings(&wiring.tasks_endpoint, &wiring.queues, &wiring.dispatcher_url, wiring.timeouts_ms)
        },
        claim_check_max_bytes: wiring.claim_check_max_bytes,
        forward_timeout_ms: wiring.timeouts_ms,
        forward_id_token: drip_gcp::http_target::IdTokenMode::Never,
        routes: wiring.routes.clone(),
        push_callers: wiring.callers.push.clone(),
        admin_callers: wiring.callers.admin.clone(),
        feedback_callers: wiring.callers.feedback.clone(),
        console: wiring.console.clone(),
    };
    let state = build_state(&settings).await.expect("the limiter starts");
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let router = app(state.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    LimiterUnderTest { url, state, namespace, redis_url: wiring.redis_url.clone(), rules_path }
}

/// Cloud Tasks settings for the stand-in at `endpoint`.
pub fn task_settings(endpoint: &str, queues: &[String], dispatcher_url: &str, timeout_ms: u64) -> TaskSettings {
    TaskSettings {
        cloud_tasks_endpoint: Some(endpoint.to_owned()),
        tasks_queues: Some(queues.join(",")),
        tasks_location: LOCATION.into(),
        dispatcher_url: Some(dispatcher_url.to_owned()),
        tasks_service_account: Some("drip-tasks@drip-test.iam.gserviceaccount.com".into()),
        tasks_audience: None,
        tasks_timeout_ms: timeout_ms,
        tasks_retry_span_ms: drip_service::tasks::DEFAULT_RETRY_SPAN as u64,
        task_batch_max: 500,
        task_batch_bucket_ms: 1_000,
        task_batch_in_flight: 2,
        task_batch_linger_ms: 0,
    }
}

/// The queue index the limiter uses for a key (re-exported for assertions).
pub fn queue_of(rule: &str, key: &str, queues: usize) -> usize {
    drip_core::overflow::queue_index(rule, key, queues)
}

/// A dispatcher serving on loopback.
#[derive(Debug, Clone)]
pub struct DispatcherUnderTest {
    pub url: String,
    pub state: drip_dispatcher::AppState,
    /// Its Redis namespace.
    pub namespace: String,
}

/// Starts a dispatcher reading the same rules, Redis namespace and emulator as a limiter.
pub async fn spawn_dispatcher(
    rules_yaml: &str,
    redis_url: &str,
    namespace: &str,
    pubsub_host: &str,
    oidc: Option<(&str, &str, &str)>,
) -> DispatcherUnderTest {
    spawn_dispatcher_with(rules_yaml, redis_url, namespace, pubsub_host, oidc, 100).await
}

/// As [`spawn_dispatcher`], with the queues' `max_attempts` (DRIP_TASKS_MAX_ATTEMPTS).
pub async fn spawn_dispatcher_with(
    rules_yaml: &str,
    redis_url: &str,
    namespace: &str,
    pubsub_host: &str,
    oidc: Option<(&str, &str, &str)>,
    max_attempts: i64,
) -> DispatcherUnderTest {
    start_dispatcher(rules_yaml, (redis_url, namespace, pubsub_host), oidc, max_attempts, None, None, false).await
}

/// As [`spawn_dispatcher`], publishing unsealed tasks (to owned topics) until `until` (RFC 3339):
/// DRIP_ACCEPT_UNSIGNED_TASKS_UNTIL, the upgrade window.
pub async fn spawn_dispatcher_accepting_unsigned(
    rules_yaml: &str,
    (redis_url, namespace, pubsub_host): (&str, &str, &str),
    until: &str,
) -> DispatcherUnderTest {
    start_dispatcher(rules_yaml, (redis_url, namespace, pubsub_host), None, 100, None, Some(until), false).await
}

/// A dispatcher that can give events new slots (an `overflow: { url }` that says wait): it
/// creates tasks on `queues` of the stand-in at `tasks_endpoint`, calling itself.
pub async fn spawn_rescheduling_dispatcher(
    rules_yaml: &str,
    (redis_url, namespace, pubsub_host): (&str, &str, &str),
    tasks_endpoint: &str,
    queues: &[String],
) -> DispatcherUnderTest {
    let tasks = Some((tasks_endpoint, queues));
    start_dispatcher(rules_yaml, (redis_url, namespace, pubsub_host), None, 100, tasks, None, false).await
}

/// As [`spawn_dispatcher`], on a Redis Cluster (`redis_url` one of its nodes).
pub async fn spawn_dispatcher_on_cluster(
    rules_yaml: &str,
    (redis_url, namespace, pubsub_host): (&str, &str, &str),
) -> DispatcherUnderTest {
    start_dispatcher(rules_yaml, (redis_url, namespace, pubsub_host), None, 100, None, None, true).await
}

async fn start_dispatcher(
    rules_yaml: &str,
    (redis_url, namespace, pubsub_host): (&str, &str, &str),
    oidc: Option<(&str, &str, &str)>,
    max_attempts: i64,
    tasks: Option<(&str, &[String])>,
    accept_unsigned_until: Option<&str>,
    redis_cluster: bool,
) -> DispatcherUnderTest {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let tasks = match tasks {
        Some((endpoint, queues)) => task_settings(endpoint, queues, &format!("{url}/dispatch"), 3_000),
        None => TaskSettings {
            cloud_tasks_endpoint: None,
            tasks_queues: None,
            tasks_location: LOCATION.into(),
            dispatcher_url: None,
            tasks_service_account: None,
            tasks_audience: None,
            tasks_timeout_ms: 3_000,
            tasks_retry_span_ms: drip_service::tasks::DEFAULT_RETRY_SPAN as u64,
            task_batch_max: 500,
            task_batch_bucket_ms: 1_000,
            task_batch_in_flight: 2,
            task_batch_linger_ms: 0,
        },
    };
    let rules_path = std::env::temp_dir().join(format!("{}.yaml", unique("rules")));
    std::fs::write(&rules_path, rules_yaml).expect("write rules");
    let settings = drip_dispatcher::Settings {
        common: CommonSettings {
            port: 0,
            redis_url: redis_url.to_owned(),
            redis_ca_cert: None,
            redis_cluster,
            redis_namespace: namespace.to_owned(),
            redis_timeout_ms: 3_000,
            reserve_batch_max: 64,
            publish_batch_max: 100,
            redis_iam_auth: false,
            project: PROJECT.into(),
            rules: rules_path.display().to_string(),
            rules_poll_ms: 0,
            pubsub_emulator_host: Some(pubsub_host.to_owned()),
            publish_timeout_ms: 3_000,
            shutdown_grace_ms: 10_000,
            auth: if oidc.is_some() { "oidc" } else { "off" }.into(),
            oidc_audience: oidc.map(|(audience, _, _)| audience.to_owned()),
            oidc_allowed_emails: None,
            metrics_port: None,
            metrics_callers: String::new(),
            oidc_jwks_url: oidc.map(|(_, _, jwks)| jwks.to_owned()),
            task_signing_key: SIGNING_KEY.into(),
            task_signing_key_previous: None,
        },
        tasks_max_attempts: max_attempts,
        tasks,
        forward_timeout_ms: 3_000,
        forward_id_token: drip_gcp::http_target::IdTokenMode::Never,
        early_tolerance_ms: 1_000,
        accept_unsigned_tasks_until: accept_unsigned_until.map(str::to_owned),
        task_callers: oidc.map(|(_, emails, _)| emails.to_owned()).unwrap_or_default(),
    };
    let state = drip_dispatcher::build_state(&settings).await.expect("the dispatcher starts");
    let router = drip_dispatcher::app(state.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    DispatcherUnderTest { url, state, namespace: namespace.to_owned() }
}

/// A proxy that answers 500 to the first `failures` requests, then passes them to `target`:
/// a dispatcher that fails once, as seen by Cloud Tasks.
#[derive(Debug, Clone)]
pub struct FlakyProxy {
    pub url: String,
    pub seen: Arc<Mutex<usize>>,
}

impl FlakyProxy {
    pub async fn start(target: String, failures: usize) -> Self {
        let seen = Arc::new(Mutex::new(0usize));
        let counter = seen.clone();
        let client = reqwest::Client::new();
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (counter, client, target) = (counter.clone(), client.clone(), target.clone());
            async move {
                let n = {
                    let mut seen = counter.lock().expect("lock");
                    *seen += 1;
                    *seen
                };
                if n <= failures {
                    return StatusCode::INTERNAL_SERVER_ERROR;
                }
                let mut request = client.post(&target).body(body.to_vec());
                for (name, value) in &headers {
                    if name != "host" && name != "content-length" {
                        request = request.header(name.as_str(), value.as_bytes());
                    }
                }
                match request.send().await {
                    Ok(response) => StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
                    Err(_) => StatusCode::BAD_GATEWAY,
                }
            }
        });
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
        let url = format!("http://{}/dispatch", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, seen }
    }
}
