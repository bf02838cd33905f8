//! Limits that follow the downstream, through the real local stack: the limiter (Pub/Sub
//! emulator pushes), Redis, the Cloud Tasks stand-in and a dispatcher delivering a rule's overflow
//! to an HTTP target (`overflow: { url }`) that answers 429 with `Retry-After` for a while.

use std::collections::{BTreeMap, HashSet};

use axum::http::StatusCode;
use drip_core::time::{HOUR, MINUTE, Millis, wall_clock_millis};
use drip_store::{AuditEntry, RedisStore, Store};
use drip_tests::pubsub_emulator::Pubsub;
use drip_tests::redis_server::shared_url;
use drip_tests::stack::{LimiterWiring, TasksStandIn, spawn_limiter, spawn_rescheduling_dispatcher};
use drip_tests::unique;

#[path = "support/partner.rs"]
mod partner;
use partner::{
    Answer, ThrottledStack, at_most_per_second_and_nothing_dead_lettered, delivered_once, forwarded_ids, quota_target,
    stack_before, throttled_stack, throttling_target,
};

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

/// A key's own limit of 5 a second, its overflow delivered to `TARGET`.
const PARKING_RULES: &str = r#"
default_dlq_topic: {p}-dlq
rules:
  - name: {p}-payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant}"
    limits: [ { limit: 5, per: 1s } ]
    delivery_margin: 100ms
    max_delay: 5m
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
    overflow: { url: "TARGET" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflow_target_that_says_wait_pauses_the_budget_and_gets_every_event_once_after_it() {
    let prefix = unique("feedback");
    let ThrottledStack { pubsub, answers, dispatcher, source, .. } = throttled_stack(&prefix, RULES, (2, 2), 2).await;

    // Two endpoints, 2 a second each, 4 a second together: the first ones are forwarded, the rest
    // overflow to the target through the dispatcher.
    let attributes = BTreeMap::from([("event_type".to_owned(), "hook".to_owned())]);
    let mut ids = HashSet::new();
    for i in 0..10 {
        let data = format!(r#"{{"endpoint":{},"n":{i}}}"#, i % 2);
        ids.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await);
    }
    let forwarded = forwarded_ids(&pubsub, &prefix).await;
    let answers = delivered_once(&pubsub, &answers, &prefix, &ids, forwarded).await;
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

/// `POST /v1/feedback` on a limiter over Redis: a budget's pause and adaptive level are stored
/// where every instance reads them, show on the entity endpoint of any key, and hold a new event
/// of another key (delayed past the pause, not dropped); a key's adaptive limit drops alone.
#[tokio::test]
async fn feedback_through_the_api_pauses_and_lowers_a_budget_in_redis() {
    const FEEDBACK_RULES: &str = r#"
default_dlq_topic: {p}-dlq
budgets:
  {p}-partner:
    limits: [ { limit: 100, per: 1s } ]
    adaptive: { margin: 0, decrease: 0.5, min: 0.25 }
rules:
  - name: {p}-alerts
    match: { attributes: { event_type: alert } }
    key: "tenant_{attributes.tenant}"
    limits: [ { limit: 100, per: 1s } ]
    budgets: [{p}-partner]
    feedback: {p}-partner
    max_delay: 5m
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
  - name: {p}-kyc
    match: { attributes: { event_type: kyc } }
    key: "tenant_{attributes.tenant}"
    limits: [ { limit: 10, per: 1h } ]
    adaptive: { margin: 0.1, decrease: 0.8, min: 0.2 }
    max_delay: 5m
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
"#;
    let prefix = unique("api-feedback");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules = FEEDBACK_RULES.replace("{p}", &prefix);
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 1);
    // Nothing dispatches within the test: the pause is 30 s.
    let wiring =
        LimiterWiring::new(shared_url(), pubsub.host.clone(), &tasks, queues, "http://127.0.0.1:9/dispatch".into());
    let limiter = spawn_limiter(&rules, &wiring).await;
    let http = reqwest::Client::new();
    let post = |body: serde_json::Value| http.post(format!("{}/v1/feedback", limiter.url)).json(&body).send();

    let budget = format!("{prefix}-partner");
    let alerts = format!("{prefix}-alerts");
    let answer =
        post(serde_json::json!({ "rule": alerts, "budget": budget, "status": 429, "retryAfter": 30 })).await.unwrap();
    assert_eq!(answer.status(), 200);
    let answer: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(answer["target"].as_str(), Some(format!("budget:{budget}").as_str()));
    assert_eq!(answer["adaptiveLevel"].as_f64(), Some(0.5));

    let report: serde_json::Value = get_json(&http, format!("{}/v1/rules/{alerts}/keys/tenant_any", limiter.url)).await;
    let held = &report["budgets"][0];
    assert!(held["pausedUntil"].as_str().is_some(), "{report}");
    assert_eq!((held["adaptiveLevel"].as_f64(), held["limits"][0]["capacity"].as_u64()), (Some(0.5), Some(50)));

    let before = wall_clock_millis();
    let envelope = drip_tests::push_envelope(
        "a1",
        "projects/p/subscriptions/s",
        "2026-11-30T00:00:00Z",
        &[("event_type", "alert"), ("tenant", "other")],
        b"{}",
    );
    let pushed = http.post(format!("{}/push", limiter.url)).body(envelope).send().await.unwrap();
    assert_eq!(pushed.status(), 204);
    assert!(pubsub.pull(&format!("{prefix}-ready"), 10).await.is_empty(), "paused: not forwarded");
    // The budget's pause (30 s) is longer than the park horizon: the event parks, and its key's
    // drain wakes where the pause's end comes within the horizon.
    let created = tasks.client.tasks().await.unwrap();
    assert_eq!(created.len(), 1, "parked behind the pause, not dropped");
    assert!(created[0].name.contains("wake-"), "a wake of the key's drain: {created:?}");
    let horizon = drip_core::rules::DEFAULT_PARK_HORIZON;
    assert!(created[0].schedule_time >= before + 30_000 - horizon - 1_000, "{created:?}");

    let kyc = format!("{prefix}-kyc");
    // Feedback reaches only keys Drip has scheduled: tenant_t gets one event first.
    let envelope = drip_tests::push_envelope(
        "k1",
        "projects/p/subscriptions/s",
        "2026-11-30T00:00:00Z",
        &[("event_type", "kyc"), ("tenant", "t")],
        b"{}",
    );
    assert_eq!(http.post(format!("{}/push", limiter.url)).body(envelope).send().await.unwrap().status(), 204);
    let answer: serde_json::Value =
        post(serde_json::json!({ "rule": kyc, "key": "tenant_t", "status": 503 })).await.unwrap().json().await.unwrap();
    assert_eq!((answer["target"].as_str(), answer["adaptiveLevel"].as_f64()), (Some("key"), Some(0.72)));
    let lowered: serde_json::Value = get_json(&http, format!("{}/v1/rules/{kyc}/keys/tenant_t", limiter.url)).await;
    let untouched: serde_json::Value = get_json(&http, format!("{}/v1/rules/{kyc}/keys/tenant_u", limiter.url)).await;
    assert_eq!(lowered["limits"][0]["capacity"].as_u64(), Some(7), "{lowered}");
    assert_eq!(untouched["limits"][0]["capacity"].as_u64(), Some(9), "{untouched}");

    // Each call is in its rule's audit list in Redis, as override changes are.
    let client = redis::Client::open(limiter.redis_url.as_str()).unwrap();
    let store = RedisStore::new(client.get_multiplexed_async_connection().await.unwrap(), limiter.namespace.clone());
    let rules = limiter.state.rules.current();
    let audit = |rule: String| {
        let (store, rule) = (store.clone(), rules.rule_by_id(&rule).expect("the rule").clone());
        async move { store.audit_history(&rule, 10).await.unwrap() }
    };
    let budget_calls = audit(alerts.clone()).await;
    let [AuditEntry::Feedback(on_budget)] = budget_calls.as_slice() else {
        panic!("one budget call: {budget_calls:?}")
    };
    assert_eq!((on_budget.by.as_str(), on_budget.target.as_str()), ("anonymous", format!("budget:{budget}").as_str()));
    assert_eq!((on_budget.status, on_budget.retry_after, on_budget.adaptive_level), (429, Some(30), Some(0.5)));
    assert!(on_budget.paused_after.is_some_and(|until| until >= before + 29_000), "{on_budget:?}");
    let key_calls = audit(kyc.clone()).await;
    let [AuditEntry::Feedback(on_key)] = key_calls.as_slice() else { panic!("one key call: {key_calls:?}") };
    assert_eq!(
        (on_key.key.as_str(), on_key.status, on_key.paused_after, on_key.adaptive_level),
        ("tenant_t", 503, None, Some(0.72))
    );

    // Resume through the API lifts the budget's pause in Redis (budget.lua), and a key's
    // (override.lua): the next event of a new tenant is forwarded at once; both are audited.
    let resume = |path: String| http.delete(format!("{}/v1/rules/{path}/pause?reason=undo", limiter.url)).send();
    let lifted: serde_json::Value = resume(format!("{alerts}/budgets/{budget}")).await.unwrap().json().await.unwrap();
    assert_eq!(
        lifted["change"]["resumed_pause"].as_str().map(|at| drip_core::time::parse_rfc3339(at).unwrap()),
        on_budget.paused_after,
        "{lifted}"
    );
    let report: serde_json::Value = get_json(&http, format!("{}/v1/rules/{alerts}/keys/tenant_any", limiter.url)).await;
    assert!(report["budgets"][0]["pausedUntil"].is_null(), "{report}");
    let envelope = drip_tests::push_envelope(
        "a2",
        "projects/p/subscriptions/s",
        "2026-11-30T00:00:00Z",
        &[("event_type", "alert"), ("tenant", "fresh")],
        b"{}",
    );
    assert_eq!(http.post(format!("{}/push", limiter.url)).body(envelope).send().await.unwrap().status(), 204);
    let ready = pubsub.pull(&format!("{prefix}-ready"), 10).await;
    let fresh = ready.iter().filter(|m| m.attributes.get("tenant").map(String::as_str) == Some("fresh")).count();
    assert_eq!(fresh, 1, "forwarded at once after the resume: {ready:?}");
    let paused = post(serde_json::json!({ "rule": kyc, "key": "tenant_t", "status": 429, "retryAfter": 60 }));
    assert_eq!(paused.await.unwrap().status(), 200);
    let lifted: serde_json::Value = resume(format!("{kyc}/keys/tenant_t")).await.unwrap().json().await.unwrap();
    assert!(lifted["change"]["resumed_pause"].as_str().is_some() && lifted["pausedUntil"].is_null(), "{lifted}");
    let again: serde_json::Value = resume(format!("{kyc}/keys/tenant_t")).await.unwrap().json().await.unwrap();
    assert!(again["change"]["resumed_pause"].is_null(), "nothing left to lift: {again}");
    let calls = audit(kyc).await;
    assert!(matches!(calls.first(), Some(AuditEntry::Resume(r)) if r.reason.as_deref() == Some("undo")), "{calls:?}");
}

async fn get_json(http: &reqwest::Client, url: String) -> serde_json::Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// A claim-checked event the overflow target told to wait gets a new task; its payload in Redis
/// must outlive that task's retries as the limiter's first task's would (a day past the slot), not
/// expire minutes after its new slot.
#[tokio::test]
async fn a_rescheduled_claim_checked_event_keeps_its_payload_past_its_retries() {
    use drip_core::overflow::{
        CLAIM_CHECK_MARGIN, RateLimitMeta, SIGNATURE_HEADER, TaskBody, TaskPayload, TaskSeal, TaskSigner,
    };
    let prefix = unique("claim-reslot");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let (target, answers) = throttling_target((1, 2)).await;
    let rules = RULES.replace("{p}", &prefix).replace("TARGET", &target);
    let namespace = unique("drip");
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 1);
    let dispatcher =
        spawn_rescheduling_dispatcher(&rules, (&shared_url(), &namespace, &pubsub.host), &tasks.endpoint, &queues)
            .await;

    let store = &dispatcher.state.store;
    let rule = format!("{prefix}-hooks");
    let subscription = Some("projects/drip-test/subscriptions/source".to_owned());
    let identity = drip_core::event::MessageRef::new("big", subscription.clone()).identity();
    let of = drip_store::MessageOf { rule: &rule, key: "endpoint_1", message: &identity };
    let reference = store.put_payload(of, br#"{"endpoint":1}"#, 60_000).await.unwrap();
    let slot = wall_clock_millis() - 100;
    let body = TaskBody {
        is_ratelimited: true,
        rate_limit_meta: RateLimitMeta {
            key: "endpoint_1".into(),
            rule: rule.clone(),
            rule_id: None,
            window_type: "RPS".into(),
            limit: 2,
            scheduled_for: slot,
            overflow_topic: format!("{prefix}-overflow"),
            cost: None,
        },
        payload: TaskPayload::ClaimCheck(reference.clone()),
        attributes: BTreeMap::from([("event_type".into(), "hook".into())]),
        message_id: "big".into(),
        subscription,
        publish_time: None,
    };
    let body = serde_json::to_vec(&body).unwrap();
    let name = "projects/drip-test/locations/local/queues/q/tasks/big";
    let seal =
        TaskSigner::new(drip_tests::stack::SIGNING_KEY).sign(&TaskSeal { name, slot, expires: slot + HOUR }, &body);
    let status = reqwest::Client::new()
        .post(format!("{}/dispatch", dispatcher.url))
        .header("X-CloudTasks-QueueName", "q")
        .header("X-CloudTasks-TaskName", name)
        .header("X-CloudTasks-TaskRetryCount", "0")
        .header(SIGNATURE_HEADER, seal)
        .body(body)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::OK, "rescheduled");
    assert_eq!(answers.lock().unwrap().len(), 1, "the target answered 429 once");
    let created = tasks.client.tasks().await.unwrap();
    assert_eq!(created.len(), 1, "a new task for the event");
    let mut redis = drip_tests::redis_server::shared_connection().await;
    let ttl: i64 = redis::cmd("PTTL").arg(&reference).query_async(&mut redis).await.unwrap();
    let needed = created[0].schedule_time - wall_clock_millis() + CLAIM_CHECK_MARGIN - MINUTE;
    assert!(ttl >= needed, "the payload lives {ttl} ms, the new task's retries need {needed}");
}

/// A key whose partner says wait (429, `Retry-After: 3`) parks its backlog instead of booking it
/// behind the pause: the events the dispatcher finds paused and those that arrive behind them wait
/// unbooked in the key's queue, and one wake task drains them where the pause ends, at the full
/// rate, in order. Through the real stack: every event reaches the partner or the topic exactly
/// once, no second window at the partner holds more than the limit, nothing is dead-lettered, and
/// the parked backlog is through within its size ÷ the limit (and 2 s) after the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_key_parks_its_backlog_and_drains_it_at_the_full_rate_after_the_pause() {
    const LIMIT: usize = 5;
    let prefix = unique("parking");
    let ThrottledStack { pubsub, answers, dispatcher, source, .. } =
        throttled_stack(&prefix, PARKING_RULES, (1, 3), 1).await;

    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let mut ids = HashSet::new();
    for i in 0..30 {
        let data = format!(r#"{{"merchant":"m","n":{i}}}"#);
        ids.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await);
    }
    let answers = delivered_once(&pubsub, &answers, &prefix, &ids, HashSet::new()).await;
    at_most_per_second_and_nothing_dead_lettered(&pubsub, &prefix, &answers, LIMIT).await;

    // The refusal paused the key for 3 s; what was due meanwhile parked and drains after it.
    let refused = answers.iter().find(|a| a.2 == 429).expect("the partner refused one").1;
    let pause_ends = refused + 3_000;
    let after: Vec<Millis> = answers.iter().filter(|a| a.2 == 204 && a.1 >= pause_ends - 100).map(|a| a.1).collect();
    let last = *after.iter().max().expect("events after the pause");
    let allowed = (after.len().div_ceil(LIMIT) * 1_000 + 2_000) as Millis;
    assert!(
        last - pause_ends <= allowed,
        "{} events drained in {} ms (at most {allowed})",
        after.len(),
        last - pause_ends
    );
    let metrics = dispatcher.state.metrics.shared.render();
    assert!(metrics.contains("outcome=\"drained\""), "a wake drained the key: {metrics}");
}

/// A key of a rule with classes that its partner paused for two minutes parks each class's events
/// in the class's own queue. Lifting the pause through the API (on one class: a pause is every
/// class's) wakes every class's drain at once, not at its next wake up to 30 s away; each class
/// drains in its own order, live's reserve taking a unit of each window beside the bulk backlog.
/// Through the real stack: nothing reaches the partner before the resume, every event once, no
/// second over the limit, nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_classed_key_parks_each_class_and_a_resume_wakes_every_class_s_drain() {
    let rules = PARKING_RULES.replace(
        "    delivery_margin: 100ms\n",
        "    classes: { from: \"{attributes.priority}\", default: bulk, reserve: { live: 0.2 } }\n    park_horizon: 1s\n    delivery_margin: 100ms\n",
    );
    assert_ne!(rules, PARKING_RULES);
    const LIMIT: usize = 5;
    let prefix = unique("classed-parking");
    let ThrottledStack { pubsub, answers, source, _limiter: limiter, .. } =
        throttled_stack(&prefix, &rules, (0, 1), 1).await;
    let (http, rule) = (reqwest::Client::new(), format!("{prefix}-payouts"));
    let publish = |class: &'static str, n: usize| {
        let attributes =
            BTreeMap::from([("event_type".to_owned(), "payout".to_owned()), ("priority".to_owned(), class.to_owned())]);
        let (pubsub, source) = (&pubsub, &source);
        async move { pubsub.publish(source, format!(r#"{{"merchant":"m","n":{n}}}"#).as_bytes(), &attributes).await }
    };
    // Feedback reaches keys Drip has scheduled: one bulk payout goes first (forwarded at once). The
    // emulator's first push to a new subscription can take seconds on a loaded machine: up to 60
    // (a CI run on a machine running twice as slow as usual waited out 30 once).
    let first = publish("bulk", 0).await;
    let forwarded = pubsub.pull_until(&format!("{prefix}-ready"), 1, std::time::Duration::from_secs(60)).await;
    assert_eq!(forwarded.len(), 1, "{forwarded:?}");
    let paused = http
        .post(format!("{}/v1/feedback", limiter.url))
        .json(&serde_json::json!({ "rule": rule, "key": "merchant_m#bulk", "status": 429, "retryAfter": 120 }))
        .send()
        .await
        .unwrap();
    assert_eq!(paused.status(), 200);
    let paused_at = wall_clock_millis();
    let mut ids = HashSet::from([first]);
    for n in 1..=20 {
        ids.insert(publish("bulk", n).await);
    }
    let live: HashSet<String> =
        futures_util::future::join_all((21..24).map(|n| publish("live", n))).await.into_iter().collect();
    ids.extend(live.iter().cloned());
    // Each class parks in its own queue.
    let parked = |class: &'static str| {
        let (state, rule) = (&limiter.state, state_rule(&limiter.state, &rule));
        async move { state.store.parked_bodies(&rule, &format!("merchant_m#{class}"), 100).await.unwrap().len() }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while (parked("bulk").await, parked("live").await) != (20, 3) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!((parked("bulk").await, parked("live").await), (20, 3), "each class's queue");
    assert!(answers.lock().unwrap().is_empty(), "nothing reached the partner while paused");

    let resumed = wall_clock_millis();
    let lifted =
        http.delete(format!("{}/v1/rules/{rule}/keys/merchant_m%23live/pause", limiter.url)).send().await.unwrap();
    assert_eq!(lifted.status(), 200, "{:?}", lifted.text().await);
    let answers = delivered_once(&pubsub, &answers, &prefix, &ids, forwarded_ids_of(&forwarded)).await;
    at_most_per_second_and_nothing_dead_lettered(&pubsub, &prefix, &answers, LIMIT).await;
    let last =
        |of: &dyn Fn(&String) -> bool| answers.iter().filter(|a| a.2 == 204 && of(&a.0)).map(|a| a.1).max().unwrap();
    let (last_live, last_bulk) = (last(&|id| live.contains(id)), last(&|id| !live.contains(id)));
    // 20 bulk at 4 or 5 a second after the resume, and live's 3 from its reserve meanwhile: bulk's
    // drain woke with live's. Its own wake was armed MAX_WAKE_GAP after its first park (the pause
    // lasts longer), so it was through before that wake could come, however slowly a loaded
    // machine parked it.
    let own_wake = paused_at + drip_core::schedule::MAX_WAKE_GAP;
    assert!(
        last_bulk < own_wake,
        "bulk's backlog drained {} ms after the resume, {} ms after its own wake",
        last_bulk - resumed,
        last_bulk - own_wake
    );
    assert!(last_live < last_bulk, "live overtook the bulk backlog: {answers:?}");
}

/// The rule `name` as the limiter runs it.
fn state_rule(state: &drip_limiter::AppState, name: &str) -> drip_core::rules::Rule {
    state.rules.current().rule(name).expect("the rule").clone()
}

fn forwarded_ids_of(messages: &[drip_tests::pubsub_emulator::Pulled]) -> HashSet<String> {
    messages.iter().map(|m| m.attributes["drip-message-id"].clone()).collect()
}

/// An adaptive budget leased over two partitions whose partner says wait (429, `Retry-After: 3`):
/// the pause and the lowered level reach every partition's pool, the keys' backlogs park, and
/// their drains book them after it through their partitions' leases, asking the home for units as
/// a reservation does. Through the real stack: every event reaches the partner or the topic
/// exactly once, no second at the partner holds more than the budget's count, nothing is
/// dead-lettered, and the wakes drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_budget_that_says_wait_parks_its_keys_and_drains_them_through_its_partitions() {
    // Keys of 4 a second under a budget of 6: a merchant's backlog outlasts what its partition
    // was leased ahead, so the drains must ask the home.
    const BUDGET: usize = 6;
    let rules = RULES
        .replace("limit: 4, per: 1s", "limit: 6, per: 1s")
        .replace("limit: 2, per: 1s", "limit: 4, per: 1s")
        .replace(
            "    adaptive: { margin: 0, decrease: 0.5, min: 0.25 }\n",
            "    adaptive: { margin: 0, decrease: 0.5, min: 0.25, step: 0.01 }\n    leases: { partitions: 2 }\n",
        )
        .replace(
            "    feedback: {p}-partner\n",
            "    feedback: {p}-partner\n    park_horizon: 1s\n    delivery_margin: 100ms\n",
        );
    assert!(rules.contains("leases") && rules.contains("park_horizon") && rules.contains("limit: 6"), "{rules}");
    let prefix = unique("leased-parking");
    let ThrottledStack { pubsub, answers, dispatcher, source, _limiter: limiter, .. } =
        throttled_stack(&prefix, &rules, (1, 3), 1).await;

    let attributes = BTreeMap::from([("event_type".to_owned(), "hook".to_owned())]);
    let mut ids = HashSet::new();
    for i in 0..80 {
        let data = format!(r#"{{"endpoint":{},"n":{i}}}"#, i % 4);
        ids.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await);
    }
    let forwarded = forwarded_ids(&pubsub, &prefix).await;
    let answers = delivered_once(&pubsub, &answers, &prefix, &ids, forwarded).await;
    at_most_per_second_and_nothing_dead_lettered(&pubsub, &prefix, &answers, BUDGET).await;
    let refused = answers.iter().find(|a| a.2 == 429).expect("the partner refused one").1;
    for (id, at, _) in answers.iter().filter(|a| a.2 == 204) {
        let inside = *at > refused + 300 && *at < refused + 2_900;
        assert!(!inside, "{id} delivered at {at}, inside the pause from {refused}: {answers:?}");
    }
    let metrics = dispatcher.state.metrics.shared.render();
    assert!(metrics.contains("outcome=\"drained\""), "a wake drained a parked key: {metrics}");
    assert!(metrics.contains("drip_budget_leases_total"), "the drains asked the home for units: {metrics}");
    // The 429 halved the home's level, and the store handed it to both pools (step 0.01 a window:
    // it is still well below the ceiling).
    let rule = state_rule(&limiter.state, &format!("{prefix}-hooks"));
    let budget = &rule.budgets[0];
    let client = redis::Client::open(limiter.redis_url.as_str()).unwrap();
    let store = RedisStore::new(client.get_multiplexed_async_connection().await.unwrap(), limiter.namespace.clone());
    let home = store.budget_state(budget).await.unwrap().adaptive.expect("the home's level");
    assert!(home.level < 700_000, "{home:?}");
    for partition in 0..2 {
        let pool = store.pool_state(budget, partition).await.unwrap();
        assert_eq!(pool.adaptive, Some(home), "partition {partition} took the home's level");
    }
}

/// A partner that serves 5 calls a second, says so on every answer (`RateLimit-Policy` and
/// `RateLimit`) and refuses past it, behind a rule that says 20 and learns from headers: once the
/// first answer taught Drip the partner's policy, a burst reaches the partner at no more than 5 a
/// second with no refusal; `drip inspect` names where the limit came from; every event is
/// delivered exactly once and nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partner_that_says_its_limits_is_followed_and_never_refuses_once_learned() {
    const LEARNING_RULES: &str = r#"
default_dlq_topic: {p}-dlq
rules:
  - name: {p}-payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant}"
    limits: [ { limit: 20, per: 1s } ]
    learn: headers
    delivery_margin: 100ms
    max_delay: 5m
    inline_wait: 0s
    forward: { url: "TARGET" }
    overflow_topic: {p}-overflow
    overflow: { url: "TARGET" }
"#;
    const PARTNER: usize = 5;
    let prefix = unique("learning");
    let ThrottledStack { pubsub, answers, dispatcher, source, _limiter: limiter, .. } =
        stack_before(&prefix, LEARNING_RULES, quota_target(PARTNER).await, 1).await;
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);

    // One event teaches the policy; the burst that follows is paced by it.
    let mut ids = HashSet::new();
    ids.insert(pubsub.publish(&source, br#"{"merchant":"m","n":0}"#, &attributes).await);
    delivered_once(&pubsub, &answers, &prefix, &ids, HashSet::new()).await;
    let taught = answers.lock().unwrap().len();
    for i in 1..=30 {
        let data = format!(r#"{{"merchant":"m","n":{i}}}"#);
        ids.insert(pubsub.publish(&source, data.as_bytes(), &attributes).await);
    }
    let all = delivered_once(&pubsub, &answers, &prefix, &ids, HashSet::new()).await;
    let after: Vec<&Answer> = all[taught..].iter().collect();
    assert!(after.iter().all(|a| a.2 == 204), "no refusal once the policy is learned: {after:?}");
    let mut windows: BTreeMap<Millis, usize> = BTreeMap::new();
    for (_, at, _) in &after {
        *windows.entry(at.div_euclid(1_000)).or_default() += 1;
    }
    assert!(windows.values().all(|&n| n <= PARTNER), "at most {PARTNER} a second at the partner: {windows:?}");
    let dead_letters = pubsub.pull(&format!("{prefix}-dlq"), 100).await;
    assert!(dead_letters.is_empty(), "nothing dead-lettered: {dead_letters:?}");

    // Where the limit came from, as inspect and the audit list say it.
    let http = reqwest::Client::new();
    let report = get_json(&http, format!("{}/v1/rules/{prefix}-payouts/keys/merchant_m", limiter.url)).await;
    let set = report["overrides"][0]["set"].as_str().unwrap_or_default();
    assert!(set.starts_with("learned from the partner's headers at "), "{report}");
    let count = report["overrides"][0]["count"].as_u64().unwrap_or(0);
    assert!((1..=PARTNER as u64).contains(&count), "the partner's 5, or less for a window it had less left: {report}");
    let metrics = limiter.state.metrics.shared.render();
    let changes = format!("drip_learned_limit_changes_total{{target=\"rule:{prefix}-payouts\"}}");
    assert!(metrics.contains(&changes), "{metrics}");
    drop(dispatcher);
}
