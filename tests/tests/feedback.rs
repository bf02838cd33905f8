//! Limits that follow the downstream, through the real local stack: the limiter (Pub/Sub
//! emulator pushes), Redis, the Cloud Tasks stand-in and a dispatcher delivering a rule's overflow
//! to an HTTP target (`overflow: { url }`) that answers 429 with `Retry-After` for a while.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use drip_core::time::{Millis, wall_clock_millis};
use drip_tests::pubsub_emulator::Pubsub;
use drip_tests::redis_server::shared_url;
use drip_tests::stack::{LimiterWiring, TasksStandIn, spawn_limiter, spawn_rescheduling_dispatcher};
use drip_tests::unique;

const RULES: &str = r#"
default_dlq_topic: {p}-dlq
budgets:
  {p}-partner:
    limits: [ { limit: 4, per: 1s } ]
    adaptive: { margin: 0, decrease: 0.5, min: 0.25 }
rules:
  - name: {p}-hooks
    match: { attributes: { event_type: hook } }
    key: "endpoint_{data.endpoint}"
    limits: [ { limit: 2, per: 1s } ]
    budgets: [{p}-partner]
    feedback: {p}-partner
    max_delay: 5m
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    overflow: { url: "TARGET" }
"#;

/// One answer the target gave: the message, when, and the status.
type Answer = (String, Millis, u16);

/// An HTTP target that answers 429 with `Retry-After: 2` to its first `refusals` calls, then 204.
async fn throttling_target(refusals: usize) -> (String, Arc<Mutex<Vec<Answer>>>) {
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
                (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "2")]).into_response()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflow_target_that_says_wait_pauses_the_budget_and_gets_every_event_once_after_it() {
    let prefix = unique("feedback");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let (target, answers) = throttling_target(2).await;
    let rules = RULES.replace("{p}", &prefix).replace("TARGET", &target);
    let namespace = unique("drip");
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 2);
    let redis = shared_url();
    let dispatcher =
        spawn_rescheduling_dispatcher(&rules, (&redis, &namespace, &pubsub.host), &tasks.endpoint, &queues).await;
    let mut wiring =
        LimiterWiring::new(redis, pubsub.host.clone(), &tasks, queues, format!("{}/dispatch", dispatcher.url));
    wiring.namespace = namespace;
    let limiter = spawn_limiter(&rules, &wiring).await;
    let source = format!("{prefix}-source");
    pubsub.create_topic(&source).await;
    pubsub.create_subscription(&source, &source, Some(&format!("{}/push", limiter.url))).await;

    // Two endpoints, 2 a second each, 4 a second together: the first ones are forwarded, the rest
    // overflow to the target through the dispatcher.
    let attributes = BTreeMap::from([("event_type".to_owned(), "hook".to_owned())]);
    let mut ids = HashSet::new();
    for i in 0..10 {
        let data = format!(r#"{{"endpoint":{},"n":{i}}}"#, i % 2);
        ids.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await);
    }
    let forwarded: HashSet<String> = pubsub
        .pull_until(&format!("{prefix}-ready"), 1, Duration::from_secs(10))
        .await
        .into_iter()
        .map(|m| m.attributes["drip-message-id"].clone())
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let delivered_all = |answers: &[Answer], forwarded: &HashSet<String>| {
        let ok: HashSet<&String> = answers.iter().filter(|a| a.2 == 204).map(|a| &a.0).collect();
        ids.iter().all(|id| ok.contains(id) || forwarded.contains(id))
    };
    let mut forwarded = forwarded;
    while !delivered_all(&answers.lock().unwrap(), &forwarded) && std::time::Instant::now() < deadline {
        for m in pubsub.pull(&format!("{prefix}-ready"), 100).await {
            forwarded.insert(m.attributes["drip-message-id"].clone());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answers = answers.lock().unwrap().clone();
    assert!(delivered_all(&answers, &forwarded), "every event reached the topic or the target: {answers:?}");

    let mut successes: HashMap<&String, usize> = HashMap::new();
    for (id, _, status) in &answers {
        if *status == 204 {
            *successes.entry(id).or_default() += 1;
        }
    }
    assert!(successes.values().all(|&n| n == 1), "each event reached the target once: {successes:?}");
    assert!(successes.keys().all(|id| !forwarded.contains(*id)), "and not the topic too");
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.2 == 429).collect();
    assert_eq!(refused.len(), 2, "{answers:?}");
    let first_refusal = refused[0].1;
    // Requests already on their way when the first 429 came may land; nothing is sent after it
    // until the pause (Retry-After: 2) ends.
    for (id, at, _) in answers.iter().filter(|a| a.2 == 204) {
        let inside = *at > first_refusal + 300 && *at < first_refusal + 1_900;
        assert!(!inside, "{id} delivered at {at}, inside the pause from {first_refusal}: {answers:?}");
    }
    let dead_letters = pubsub.pull(&format!("{prefix}-dlq"), 100).await;
    assert!(dead_letters.is_empty(), "nothing dead-lettered: {dead_letters:?}");
    let metrics = dispatcher.state.metrics.shared.render();
    assert!(metrics.contains("outcome=\"rescheduled\""), "{metrics}");
    assert!(metrics.contains(&format!("drip_adaptive_level{{target=\"budget:{prefix}-partner\"}}")), "{metrics}");
}
