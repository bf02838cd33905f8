//! The fault cases that need the limiter as Cloud Run runs it, a process of its own (the rest of the
//! fault matrix is `tests/tests/faults.rs`): killed with SIGKILL in the middle of a burst that a
//! real push subscription of the emulator delivers, and its peak memory on a hostile body.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use base64::Engine;
use drip_tests::pubsub_emulator::Pubsub;
use drip_tests::redis_server::{free_port, shared_url};
use drip_tests::stack::{SIGNING_KEY, TasksStandIn, spawn_dispatcher};
use drip_tests::unique;

const RULES: &str = r#"
default_dlq_topic: {p}-dlq
rules:
  - name: {p}-burst
    match: { attributes: { event_type: burst } }
    key: "merchant_{data.merchant}"
    limits: [{ limit: 10, per: 1s }]
    max_delay: 10m
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
"#;

struct Limiter {
    child: Child,
    port: u16,
    /// Its log (text lines), read when a test fails to say what became of a message.
    log: std::path::PathBuf,
}

impl Limiter {
    fn spawn(env: &[(String, String)], port: u16) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_drip-limiter"));
        command.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("DRIP_LOG_FORMAT", "text");
        command.envs(env.iter().cloned()).env("PORT", port.to_string());
        let log = std::env::temp_dir().join(format!("{}.log", unique("limiter")));
        let file = std::fs::File::create(&log).expect("the limiter's log file");
        let stderr = file.try_clone().expect("the limiter's log file");
        let child = command.stdout(file).stderr(stderr).spawn().expect("the limiter binary");
        let limiter = Self { child, port, log };
        limiter.wait_ready();
        limiter
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while drip_tests::get_ok(self.port, "/readyz").is_none() {
            assert!(Instant::now() < deadline, "the limiter never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Peak resident memory so far (VmHWM), in kB.
    fn peak_rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// What the limiters' logs say of each of `ids`, for a failure message.
fn log_lines_of(limiters: &[&Limiter], ids: &[&String]) -> String {
    let mut lines = Vec::new();
    for limiter in limiters {
        let log = std::fs::read_to_string(&limiter.log).unwrap_or_default();
        lines.push(format!("-- {}", limiter.log.display()));
        lines.extend(log.lines().filter(|l| ids.iter().any(|id| l.contains(id.as_str()))).map(str::to_owned));
    }
    lines.join("\n")
}

struct Stack {
    prefix: String,
    pubsub: Pubsub,
    env: Vec<(String, String)>,
    _tasks: TasksStandIn,
    _dispatcher: drip_tests::stack::DispatcherUnderTest,
}

async fn stack() -> Stack {
    let pubsub = Pubsub::shared();
    let prefix = unique("proc");
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let rules_yaml = RULES.replace("{p}", &prefix);
    let rules = std::env::temp_dir().join(format!("{}.yaml", unique("rules")));
    std::fs::write(&rules, &rules_yaml).unwrap();
    let namespace = unique("drip");
    let dispatcher = spawn_dispatcher(&rules_yaml, &shared_url(), &namespace, &pubsub.host, None).await;
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 2);
    let env = [
        ("REDIS_URL", shared_url()),
        ("DRIP_REDIS_NAMESPACE", namespace),
        ("GOOGLE_CLOUD_PROJECT", drip_tests::pubsub_emulator::PROJECT.to_owned()),
        ("DRIP_RULES", rules.display().to_string()),
        ("PUBSUB_EMULATOR_HOST", pubsub.host.clone()),
        ("CLOUD_TASKS_ENDPOINT", tasks.endpoint.clone()),
        ("DRIP_TASKS_QUEUES", queues.join(",")),
        ("DRIP_DISPATCHER_URL", format!("{}/dispatch", dispatcher.url)),
        ("DRIP_TASK_SIGNING_KEY", SIGNING_KEY.to_owned()),
        ("DRIP_AUTH", "off".to_owned()),
        // Short timeouts keep the lease short, so redeliveries of what the killed process held
        // are taken over within seconds.
        ("DRIP_TASKS_TIMEOUT_MS", "2000".to_owned()),
        ("DRIP_PUBLISH_TIMEOUT_MS", "2000".to_owned()),
        ("DRIP_FORWARD_TIMEOUT_MS", "2000".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Stack { prefix, pubsub, env, _tasks: tasks, _dispatcher: dispatcher }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_killed_in_the_middle_of_a_burst_loses_nothing() {
    let s = stack().await;
    let port = free_port();
    let mut limiter = Limiter::spawn(&s.env, port);
    let source = format!("{}-source", s.prefix);
    s.pubsub.create_topic(&source).await;
    // The emulator redelivers every push that failed (while the killed process's leases hold,
    // each is answered 503) about every second until it succeeds.
    s.pubsub.create_subscription(&source, &source, Some(&format!("http://127.0.0.1:{port}/push"))).await;
    // Killed while the emulator is still pushing: halfway through publishing the burst.
    let events = 600;
    let publish = async |range: std::ops::Range<usize>| {
        let mut ids = Vec::new();
        for i in range {
            let attributes = BTreeMap::from([("event_type".to_owned(), "burst".to_owned())]);
            let data = format!(r#"{{"merchant":{},"n":{i}}}"#, i % 4);
            ids.push(s.pubsub.publish(&source, data.as_bytes(), &attributes).await);
        }
        ids
    };
    let mut published = publish(0..events / 2).await;
    limiter.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = Limiter::spawn(&s.env, port);
    published.extend(publish(events / 2..events).await);
    let mut came_out: HashMap<String, usize> = HashMap::new();
    // Delayed events (batch tasks among them) are published by the dispatcher under its claims.
    let mut delayed: HashMap<String, usize> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(150);
    while came_out.len() < events && Instant::now() < deadline {
        for topic in ["ready", "overflow", "dlq"] {
            for message in s.pubsub.pull(&format!("{}-{topic}", s.prefix), 1_000).await {
                assert_ne!(topic, "dlq", "dead-lettered: {:?}", message.attributes);
                *came_out.entry(message.attributes["drip-message-id"].clone()).or_default() += 1;
                if topic == "overflow" {
                    *delayed.entry(message.attributes["drip-message-id"].clone()).or_default() += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let missing: Vec<&String> = published.iter().filter(|id| !came_out.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "every message came out after the SIGKILL; missing {missing:?}, of which the limiters logged:\n{}",
        log_lines_of(&[&limiter, &restarted], &missing)
    );
    let doubled = came_out.values().filter(|n| **n > 1).count();
    // A kill between an action and its completion mark can double that one message (the lease then
    // expires and the redelivery acts): consumers deduplicate by drip-message-id.
    println!(
        "SIGKILL mid-burst: {events} of {events} came out; {doubled} came out twice (killed between act and mark)"
    );
    assert!(doubled <= 4, "only what was in flight at the kill may come out twice: {doubled}");
    let delayed_twice: Vec<_> = delayed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(delayed_twice.is_empty(), "a delayed event's task ran twice, its claim kept it once: {delayed_twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_of_millions_of_elements_costs_little_memory() {
    let s = stack().await;
    let limiter = Limiter::spawn(&s.env, free_port());
    let before = limiter.peak_rss_kb();
    let data = format!(r#"{{"items":[{}],"merchant":7}}"#, vec!["[0]"; 2_000_000].join(","));
    let envelope = serde_json::json!({
        "message": {
            "data": base64::engine::general_purpose::STANDARD.encode(&data),
            "attributes": {"event_type": "burst"},
            "messageId": "huge",
        },
        "subscription": "projects/drip-test/subscriptions/source",
    });
    let status = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/push", limiter.port))
        .body(serde_json::to_vec(&envelope).unwrap())
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, reqwest::StatusCode::NO_CONTENT);
    let forwarded = s.pubsub.pull_until(&format!("{}-ready", s.prefix), 1, Duration::from_secs(10)).await;
    assert_eq!(forwarded[0].attributes["drip-key"], "merchant_7");
    let after = limiter.peak_rss_kb();
    println!(
        "limiter peak RSS: {} MB before, {} MB after a {} MB body of 2,000,000 JSON arrays ({} MB as a push)",
        before / 1024,
        after / 1024,
        data.len() / 1_000_000,
        envelope.to_string().len() / 1_000_000
    );
}
