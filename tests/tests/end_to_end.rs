//! The whole drip through the real local stack: a source topic pushing to the limiter (real HTTP
//! from Google's emulator), Redis, the Cloud Tasks stand-in calling the dispatcher at each slot,
//! and the forward and overflow topics read back with pull subscriptions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use cloud_tasks_emulator::{Fault, Faults};
use drip_core::time::{Millis, SECOND, parse_rfc3339};
use drip_tests::pubsub_emulator::{Pubsub, Pulled};
use drip_tests::redis_server::{RedisCluster, shared_url};
use drip_tests::stack::{
    FlakyProxy, LimiterUnderTest, LimiterWiring, TasksStandIn, spawn_dispatcher, spawn_dispatcher_on_cluster,
    spawn_limiter,
};
use drip_tests::unique;

const RULES: &str = r#"
default_dlq_topic: {p}-dlq
rules:
  - name: {p}-burst
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant}"
    limits: [{ limit: 5, per: 1s }]
    delivery_margin: 100ms
    max_delay: 5m
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
  - name: {p}-paced
    match: { attributes: { event_type: paced } }
    key: "merchant_{data.merchant}"
    limits: [{ limit: 1, per: 1s, window: gcra }]
    max_delay: 5m
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
  - name: {p}-daily
    match: { attributes: { event_type: report } }
    key: "tenant_{data.tenant}"
    limits: [{ limit: 1, per: 1d }]
    max_delay: 1s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
"#;

struct Stack {
    prefix: String,
    pubsub: Pubsub,
    tasks: TasksStandIn,
    limiter: LimiterUnderTest,
    proxy: Option<FlakyProxy>,
}

/// Everything wired; `dispatcher_failures` > 0 puts a proxy failing that many calls in front of
/// the dispatcher.
async fn stack(dispatcher_failures: usize) -> Stack {
    let prefix = unique("e2e");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules = RULES.replace("{p}", &prefix);
    let namespace = unique("drip");
    let dispatcher = spawn_dispatcher(&rules, &shared_url(), &namespace, &pubsub.host, None).await;
    let dispatch_url = format!("{}/dispatch", dispatcher.url);
    let proxy = if dispatcher_failures > 0 {
        Some(FlakyProxy::start(dispatch_url.clone(), dispatcher_failures).await)
    } else {
        None
    };
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 2);
    let target = proxy.as_ref().map_or(dispatch_url, |p| p.url.clone());
    let mut wiring = LimiterWiring::new(shared_url(), pubsub.host.clone(), &tasks, queues, target);
    wiring.namespace = namespace;
    let limiter = spawn_limiter(&rules, &wiring).await;
    let source = format!("{prefix}-source");
    pubsub.create_topic(&source).await;
    pubsub.create_subscription(&source, &source, Some(&format!("{}/push", limiter.url))).await;
    Stack { prefix, pubsub, tasks, limiter, proxy }
}

impl Stack {
    async fn publish(&self, event_type: &str, data: String) -> String {
        let attributes = BTreeMap::from([("event_type".to_owned(), event_type.to_owned())]);
        self.pubsub.publish(&format!("{}-source", self.prefix), data.as_bytes(), &attributes).await
    }

    /// Forwarded and overflow messages, until `ids` all arrived (at least once) or `timeout`.
    async fn delivered(&self, ids: &HashSet<String>, timeout: Duration) -> Vec<(Pulled, &'static str)> {
        let deadline = std::time::Instant::now() + timeout;
        let mut all = Vec::new();
        let mut seen = HashSet::new();
        while !ids.is_subset(&seen) && std::time::Instant::now() < deadline {
            for (topic, route) in [("ready", "forward"), ("overflow", "overflow")] {
                for message in self.pubsub.pull(&format!("{}-{topic}", self.prefix), 1_000).await {
                    seen.insert(message.attributes["drip-message-id"].clone());
                    all.push((message, route));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        all
    }
}

fn percentile(sorted: &[Millis], p: f64) -> Millis {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_several_keys_drains_at_the_limit_and_nothing_is_lost() {
    let s = stack(0).await;
    let mut ids = HashSet::new();
    for i in 0..60 {
        ids.insert(s.publish("payout", format!(r#"{{"merchant":{},"n":{i}}}"#, i % 3)).await);
    }
    let delivered = s.delivered(&ids, Duration::from_secs(40)).await;
    let unique_ids: HashSet<&String> = delivered.iter().map(|(m, _)| &m.attributes["drip-message-id"]).collect();
    assert_eq!(unique_ids.len(), 60, "every message arrived (duplicates allowed, identified by id)");

    let mut first_delivery: HashMap<&String, &(Pulled, &str)> = HashMap::new();
    for entry in &delivered {
        first_delivery.entry(&entry.0.attributes["drip-message-id"]).or_insert(entry);
    }
    let mut per_window: BTreeMap<(String, Millis), usize> = BTreeMap::new();
    // Where the downstream sees them: the topics' publish times.
    let mut observed: BTreeMap<(String, Millis), usize> = BTreeMap::new();
    let mut lateness = Vec::new();
    let mut routes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut slots = Vec::new();
    for (message, route) in first_delivery.values() {
        let slot = parse_rfc3339(&message.attributes["drip-scheduled-for"]).unwrap();
        slots.push(slot);
        let key = message.data.clone();
        let merchant: serde_json::Value = if *route == "overflow" {
            serde_json::from_slice::<serde_json::Value>(&key).unwrap()["originalPayload"]["merchant"].clone()
        } else {
            serde_json::from_slice::<serde_json::Value>(&key).unwrap()["merchant"].clone()
        };
        *per_window.entry((merchant.to_string(), slot / SECOND)).or_default() += 1;
        let published = parse_rfc3339(&message.publish_time).unwrap();
        *observed.entry((merchant.to_string(), published / SECOND)).or_default() += 1;
        *routes.entry(route).or_default() += 1;
        let published = parse_rfc3339(&message.publish_time).unwrap();
        if *route == "overflow" {
            assert!(published >= slot, "published at {published}, before its slot {slot}");
            lateness.push(published - slot);
        }
    }
    let fullest = per_window.values().max().copied().unwrap_or(0);
    assert!(fullest <= 5, "a one-second window of one merchant got {fullest}: {per_window:?}");
    let fullest_observed = observed.values().max().copied().unwrap_or(0);
    assert!(fullest_observed <= 5, "the topics saw {fullest_observed} in one second of one merchant: {observed:?}");
    // How many go at once depends on when the pushes arrive: a merchant's first event waits for the
    // next window when it arrives in the last 100 ms (the delivery margin) of one. No slot, at once
    // or later, lies in that margin.
    assert_eq!(routes.values().sum::<usize>(), 60, "{routes:?}");
    assert!(slots.iter().all(|slot| slot % SECOND < 900), "a slot in a window's last 100 ms: {slots:?}");
    lateness.sort_unstable();
    eprintln!(
        "burst of 60 over 3 merchants at 5/s: {routes:?}; dispatch lateness p50 {} ms, p99 {} ms, max {} ms",
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        lateness.last().copied().unwrap_or(0)
    );
}

#[tokio::test]
async fn an_event_beyond_max_delay_reaches_the_dead_letter_topic() {
    let s = stack(0).await;
    let first = s.publish("report", r#"{"tenant":1}"#.into()).await;
    let second = s.publish("report", r#"{"tenant":1}"#.into()).await;
    // The emulator pushes two at a time, so either may reserve the day's one slot first.
    let forwarded = s.pubsub.pull_until(&format!("{}-ready", s.prefix), 1, Duration::from_secs(10)).await;
    let dead = s.pubsub.pull_until(&format!("{}-dlq", s.prefix), 1, Duration::from_secs(10)).await;
    assert_eq!((forwarded.len(), dead.len()), (1, 1));
    let mut ids = [forwarded[0].attributes["drip-message-id"].clone(), dead[0].attributes["drip-message-id"].clone()];
    ids.sort();
    let mut expected = [first, second];
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(dead[0].attributes["drip-reason"], "max_delay_exceeded");
}

/// Two events of one merchant at once under one a second (GCRA, not window-aligned): one goes now,
/// the other a second later, through a task. Returns the ids published and the id forwarded.
async fn two_paced_events(s: &Stack) -> (Vec<String>, String) {
    let ids = vec![
        s.publish("paced", r#"{"merchant":7,"n":0}"#.into()).await,
        s.publish("paced", r#"{"merchant":7,"n":1}"#.into()).await,
    ];
    let forwarded = s.pubsub.pull_until(&format!("{}-ready", s.prefix), 1, Duration::from_secs(10)).await;
    assert_eq!(forwarded.len(), 1);
    (ids, forwarded[0].attributes["drip-message-id"].clone())
}

#[tokio::test]
async fn a_limiter_that_fails_once_is_redelivered_without_a_double_reservation() {
    let s = stack(0).await;
    s.tasks.client.set_faults(Faults { create_task: Fault::Error }).await.unwrap();
    let (ids, forwarded) = two_paced_events(&s).await;
    let metrics_url = format!("{}/metrics", s.limiter.url);
    let failed = |metrics: &str| {
        metrics.contains(r#"drip_dependency_call_seconds_count{dependency="cloud_tasks",result="error"}"#)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !failed(&reqwest::get(&metrics_url).await.unwrap().text().await.unwrap()) {
        assert!(std::time::Instant::now() < deadline, "the limiter never hit the fault");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.tasks.client.set_faults(Faults::default()).await.unwrap();
    let overflow = s.pubsub.pull_until(&format!("{}-overflow", s.prefix), 1, Duration::from_secs(15)).await;
    assert_eq!(overflow.len(), 1);
    let delayed = overflow[0].attributes["drip-message-id"].clone();
    assert!(ids.contains(&delayed) && delayed != forwarded, "{ids:?}: forwarded {forwarded}, delayed {delayed}");
    assert_eq!(s.tasks.client.tasks().await.unwrap().len(), 1, "one task for the redelivered message");
    let connection = redis::Client::open(shared_url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let store = drip_store::RedisStore::new(connection, s.limiter.namespace.clone());
    let rules = s.limiter.state.rules.current();
    let rule = rules.rule(&format!("{}-paced", s.prefix)).unwrap();
    let state = store.entity_state(drip_store::RuleRef::of(rule), "merchant_7", &rule.limits).await.unwrap();
    let last = state.last_slot.expect("a reservation was made");
    let tat = match &state.limits[&drip_core::schedule::state_id(&rule.limits[0])] {
        &drip_core::schedule::LimitState::Gcra { tat, .. } => tat,
        other => panic!("a gcra rule keeps gcra state, not {other:?}"),
    };
    assert_eq!(tat, last + SECOND, "two reservations, one second apart: the redeliveries reserved nothing more");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(s.pubsub.pull(&format!("{}-ready", s.prefix), 10).await.is_empty());
    assert!(s.pubsub.pull(&format!("{}-overflow", s.prefix), 10).await.is_empty());
}

#[tokio::test]
async fn a_dispatcher_that_fails_once_is_retried_and_publishes_once() {
    let s = stack(1).await;
    let (ids, forwarded) = two_paced_events(&s).await;
    let overflow = s.pubsub.pull_until(&format!("{}-overflow", s.prefix), 1, Duration::from_secs(15)).await;
    assert_eq!(overflow.len(), 1);
    let delayed = &overflow[0].attributes["drip-message-id"];
    assert!(ids.contains(delayed) && *delayed != forwarded);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(s.pubsub.pull(&format!("{}-overflow", s.prefix), 10).await.is_empty(), "no extra overflow message");
    let attempts = s.tasks.client.attempts().await.unwrap();
    let statuses: Vec<Option<u16>> = attempts.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [Some(500), Some(200)], "one failure, one retry");
    assert_eq!(*s.proxy.as_ref().unwrap().seen.lock().unwrap(), 2);
}

/// A budget of 10 a second leased over 3 partitions of a 3-master cluster, 80 SMS of 40 users
/// through the whole stack (limiter and dispatcher on the cluster): every message arrives, and no
/// second holds more than 10 of them, at the slots or at the topics' publish times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_budget_holds_at_the_topics_on_a_cluster() {
    let cluster = RedisCluster::start();
    let redis_url = cluster.urls()[0].clone();
    let prefix = unique("e2e-leased");
    let pubsub = Pubsub::shared();
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules = format!(
        r#"
default_dlq_topic: {prefix}-dlq
budgets:
  {prefix}-carrier:
    limits: [ {{ limit: 10, per: 1s }} ]
    leases: {{ partitions: 3 }}
rules:
  - name: {prefix}-sms
    match: {{ attributes: {{ event_type: sms }} }}
    key: "user_{{data.user}}"
    limits: [ {{ limit: 5, per: 1s }} ]
    budgets: [{prefix}-carrier]
    delivery_margin: 100ms
    max_delay: 5m
    inline_wait: 0s
    forward: {{ topic: {prefix}-ready }}
    overflow_topic: {prefix}-overflow
"#
    );
    let namespace = unique("drip");
    let dispatcher = spawn_dispatcher_on_cluster(&rules, (&redis_url, &namespace, &pubsub.host)).await;
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 2);
    let mut wiring = LimiterWiring::new(
        redis_url.clone(),
        pubsub.host.clone(),
        &tasks,
        queues,
        format!("{}/dispatch", dispatcher.url),
    );
    wiring.namespace = namespace;
    wiring.redis_cluster = true;
    let limiter = spawn_limiter(&rules, &wiring).await;
    let source = format!("{prefix}-source");
    pubsub.create_topic(&source).await;
    pubsub.create_subscription(&source, &source, Some(&format!("{}/push", limiter.url))).await;
    let s = Stack { prefix, pubsub, tasks, limiter, proxy: None };
    let mut ids = HashSet::new();
    for i in 0..80 {
        ids.insert(s.publish("sms", format!(r#"{{"user":{},"n":{i}}}"#, i % 40)).await);
    }
    let delivered = s.delivered(&ids, Duration::from_secs(60)).await;
    let mut first: HashMap<&String, &Pulled> = HashMap::new();
    for (message, _) in &delivered {
        first.entry(&message.attributes["drip-message-id"]).or_insert(message);
    }
    assert_eq!(first.len(), 80, "every message arrived");
    let (mut at_slots, mut at_topics): (BTreeMap<Millis, usize>, BTreeMap<Millis, usize>) = Default::default();
    for message in first.values() {
        let slot = parse_rfc3339(&message.attributes["drip-scheduled-for"]).unwrap();
        *at_slots.entry(slot / SECOND).or_default() += 1;
        *at_topics.entry(parse_rfc3339(&message.publish_time).unwrap() / SECOND).or_default() += 1;
    }
    let (slots, topics) = (at_slots.values().max().copied(), at_topics.values().max().copied());
    assert!(slots <= Some(10), "a second of the budget's slots holds {slots:?}: {at_slots:?}");
    assert!(topics <= Some(10), "the topics saw {topics:?} in one second: {at_topics:?}");
    assert!(at_slots.len() >= 8, "80 at 10 a second take at least 8 seconds: {at_slots:?}");
    for node in &cluster.nodes {
        assert!(node.cli(&["DBSIZE"]).is_some_and(|n| n.trim() != "0"), "a master without keys");
    }
}
