//! A partner behind the real local stack, shared by the tests that deliver to one: targets that
//! log what they answered (and refuse as a partner does), and the stack in front of them.
#![allow(dead_code)] // each test file uses its own part

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use drip_core::time::{Millis, wall_clock_millis};
use drip_tests::pubsub_emulator::Pubsub;
use drip_tests::redis_server::shared_url;
use drip_tests::stack::{LimiterWiring, TasksStandIn, spawn_limiter, spawn_rescheduling_dispatcher};
use drip_tests::unique;

/// One answer the target gave: the message, when, and the status.
pub type Answer = (String, Millis, u16);

/// An HTTP target that serves `quota` calls per epoch-aligned second, says so on every answer
/// (`RateLimit-Policy: "default";q=QUOTA;w=1` and `RateLimit: "default";r=LEFT;t=1`), and answers
/// 429 with `Retry-After: 1` past it.
pub async fn quota_target(quota: usize) -> (String, Arc<Mutex<Vec<Answer>>>) {
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let log = answers.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let log = log.clone();
        async move {
            let id = headers.get("x-drip-message-id").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
            let now = wall_clock_millis();
            let mut log = log.lock().unwrap();
            let served = log.iter().filter(|a| a.2 == 204 && a.1.div_euclid(1_000) == now.div_euclid(1_000)).count();
            let refuse = served >= quota;
            log.push((id, now, if refuse { 429 } else { 204 }));
            let left = quota - served.min(quota) - usize::from(!refuse);
            let said = [
                ("ratelimit-policy", format!("\"default\";q={quota};w=1")),
                ("ratelimit", format!("\"default\";r={left};t=1")),
            ];
            if refuse {
                (StatusCode::TOO_MANY_REQUESTS, said, [("retry-after", "1")]).into_response()
            } else {
                (StatusCode::NO_CONTENT, said).into_response()
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, answers)
}

/// Waits (up to 60 s) until each of `ids` has reached the target (204) or `{prefix}-ready`
/// (`forwarded` holds what was pulled from it already), then asserts that each did, exactly once
/// and at one of the two. Returns the target's answers.
pub async fn delivered_once(
    pubsub: &Pubsub,
    answers: &Mutex<Vec<Answer>>,
    prefix: &str,
    ids: &HashSet<String>,
    mut forwarded: HashSet<String>,
) -> Vec<Answer> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let delivered_all = |answers: &[Answer], forwarded: &HashSet<String>| {
        let ok: HashSet<&String> = answers.iter().filter(|a| a.2 == 204).map(|a| &a.0).collect();
        ids.iter().all(|id| ok.contains(id) || forwarded.contains(id))
    };
    while !delivered_all(&answers.lock().unwrap(), &forwarded) && std::time::Instant::now() < deadline {
        for m in pubsub.pull(&format!("{prefix}-ready"), 100).await {
            forwarded.insert(m.attributes["drip-message-id"].clone());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answers = answers.lock().unwrap().clone();
    assert!(delivered_all(&answers, &forwarded), "every event reached the topic or the target: {answers:?}");
    let mut successes: HashMap<&String, usize> = HashMap::new();
    for (id, _, _) in answers.iter().filter(|a| a.2 == 204) {
        *successes.entry(id).or_default() += 1;
    }
    assert!(successes.values().all(|&n| n == 1), "each event reached the target once: {successes:?}");
    assert!(successes.keys().all(|id| !forwarded.contains(*id)), "and not the topic too");
    answers
}

/// The real stack in front of an `overflow: { url }` target that says wait: the rule's topics
/// (`{p}-ready`, `-overflow`, `-dlq`), the target (`throttling_target`), the dispatcher and the
/// limiter on one namespace, and `{p}-source` pushing to the limiter. `rules` names `{p}` and
/// `TARGET`.
pub struct ThrottledStack {
    pub pubsub: Pubsub,
    pub answers: Arc<Mutex<Vec<Answer>>>,
    pub dispatcher: drip_tests::stack::DispatcherUnderTest,
    pub source: String,
    pub _limiter: drip_tests::stack::LimiterUnderTest,
    pub _tasks: TasksStandIn,
    /// The namespace of the stack's Redis keys (on the shared Redis).
    pub namespace: String,
}

pub async fn throttled_stack(prefix: &str, rules: &str, refusals: (usize, u64), queues: usize) -> ThrottledStack {
    stack_before(prefix, rules, throttling_target(refusals).await, queues).await
}

/// The same stack in front of any target (its URL, and what it answered).
pub async fn stack_before(
    prefix: &str,
    rules: &str,
    (target, answers): (String, Arc<Mutex<Vec<Answer>>>),
    queues: usize,
) -> ThrottledStack {
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules = rules.replace("{p}", prefix).replace("TARGET", &target);
    let namespace = unique("drip");
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(prefix, queues);
    let redis = shared_url();
    let dispatcher =
        spawn_rescheduling_dispatcher(&rules, (&redis, &namespace, &pubsub.host), &tasks.endpoint, &queues).await;
    let mut wiring =
        LimiterWiring::new(redis, pubsub.host.clone(), &tasks, queues, format!("{}/dispatch", dispatcher.url));
    wiring.namespace = namespace.clone();
    let limiter = spawn_limiter(&rules, &wiring).await;
    let source = format!("{prefix}-source");
    pubsub.create_topic(&source).await;
    pubsub.create_subscription(&source, &source, Some(&format!("{}/push", limiter.url))).await;
    ThrottledStack { pubsub, answers, dispatcher, source, _limiter: limiter, _tasks: tasks, namespace }
}

/// An HTTP target that answers 429 with `Retry-After: retry_after` to its first `refusals` calls,
/// then 204.
pub async fn throttling_target((refusals, retry_after): (usize, u64)) -> (String, Arc<Mutex<Vec<Answer>>>) {
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let log = answers.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let log = log.clone();
        async move {
            let id = headers.get("x-drip-message-id").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned();
            let mut log = log.lock().unwrap();
            let refuse = log.len() < refusals;
            log.push((id, wall_clock_millis(), if refuse { 429 } else { 204 }));
            if refuse {
                (StatusCode::TOO_MANY_REQUESTS, [("retry-after", retry_after.to_string())]).into_response()
            } else {
                StatusCode::NO_CONTENT.into_response()
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, answers)
}

/// The ids of the messages forwarded at once to `{prefix}-ready` (pulled for up to 10 s).
pub async fn forwarded_ids(pubsub: &Pubsub, prefix: &str) -> HashSet<String> {
    let ready = pubsub.pull_until(&format!("{prefix}-ready"), 1, Duration::from_secs(10)).await;
    ready.into_iter().map(|m| m.attributes["drip-message-id"].clone()).collect()
}

/// No epoch-aligned second at the partner took more than `limit` of the calls it accepted, and
/// nothing reached `{prefix}-dlq`.
pub async fn at_most_per_second_and_nothing_dead_lettered(
    pubsub: &Pubsub,
    prefix: &str,
    answers: &[Answer],
    limit: usize,
) {
    let mut windows: std::collections::BTreeMap<Millis, usize> = std::collections::BTreeMap::new();
    for (_, at, _) in answers.iter().filter(|a| a.2 == 204) {
        *windows.entry(at.div_euclid(1_000)).or_default() += 1;
    }
    assert!(windows.values().all(|&n| n <= limit), "at most {limit} a second at the partner: {windows:?}");
    let dead_letters = pubsub.pull(&format!("{prefix}-dlq"), 100).await;
    assert!(dead_letters.is_empty(), "nothing dead-lettered: {dead_letters:?}");
}
