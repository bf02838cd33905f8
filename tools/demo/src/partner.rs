//! The latency scenario (`./run demo --scenario latency`): a partner with a hidden capacity whose
//! latency climbs past it and which answers 429 past 1.5× it, fed a steady stream above that
//! capacity by two rules side by side in one run, AIMD alone and latency-driven, each with a lane
//! of the partner to itself. Drip forwards to topics; the demo is the consumer that calls the
//! partner (concurrently, as a fleet of consumers would) and reports its answers and latencies.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drip_core::rules::Forward;
use drip_core::time::{Millis, wall_clock_millis};
use pubsub_emulator_client::EmulatorClient;

use crate::*;

/// Calls a second the partner serves at its base latency.
pub(crate) const CAPACITY: usize = 10;
const BASE_MS: u64 = 40;
/// Its latency at 1.5× capacity, past which it answers 429.
const SATURATED_MS: u64 = 400;
/// The stream: this many events a second per lane, for this long.
const RATE: usize = 16;
const STREAM_SECS: i64 = 40;
/// Throughput is compared once settled: from this many seconds after the stream starts to its end.
const SETTLED_FROM_SECS: i64 = 10;
const LANES: [&str; 2] = ["aimd", "latency"];

/// One lane of the partner: what it accepted and refused.
#[derive(Default)]
struct Lane {
    /// Accepted calls of the last second (its load).
    recent: VecDeque<Millis>,
    accepted: Vec<(Millis, String, u64)>,
    refused: Vec<Millis>,
}

impl Lane {
    /// A call at `now`: refused (None) past 1.5× capacity, else accepted after the latency its
    /// load gives it (ms).
    fn call(&mut self, now: Millis, id: String) -> Option<u64> {
        while self.recent.front().is_some_and(|&at| at <= now - 1_000) {
            self.recent.pop_front();
        }
        let load = self.recent.len() + 1;
        if 2 * load > 3 * CAPACITY {
            self.refused.push(now);
            return None;
        }
        let over = load.saturating_sub(CAPACITY) as u64;
        let latency = BASE_MS + (SATURATED_MS - BASE_MS) * 2 * over / CAPACITY as u64;
        self.recent.push_back(now);
        self.accepted.push((now, id, latency));
        Some(latency)
    }
}

type Lanes = Arc<Mutex<HashMap<&'static str, Lane>>>;

/// What one lane's partner saw.
struct Figures {
    refused: usize,
    /// Calls accepted per second once settled.
    settled: f64,
    /// Its answers' p99 latency (ms).
    p99: u64,
    lost: usize,
    duplicates: usize,
}

/// The consumer of one lane: pulls what Drip forwarded (at once or from overflow, at its slot),
/// calls the partner for each message concurrently, and reports each answer to the limiter as a
/// consumer that calls the partner itself does: a 429 (`status`), and for the latency-driven
/// rule each call's latency (`latencyMs`). A refused event is published again to the source topic:
/// its retry goes through Drip, at the rate in force, like every other event.
async fn consume(lane: &'static str, lanes: Lanes, pubsub: EmulatorClient, limiter: String, until: Millis) {
    let rule = format!("payouts-{lane}");
    let http = reqwest::Client::new();
    let feedback = format!("{}/v1/feedback", limiter.trim_end_matches('/'));
    while wall_clock_millis() < until {
        let mut pulled = Vec::new();
        for subscription in [format!("payouts-{lane}-ready"), format!("payouts-{lane}-overflow")] {
            pulled.extend(pubsub.pull(&subscription, 200).await.unwrap_or_default());
        }
        for message in pulled {
            let id = message.attributes.get("payout").cloned().unwrap_or_default();
            let (lanes, http, feedback, rule) = (lanes.clone(), http.clone(), feedback.clone(), rule.clone());
            let pubsub = pubsub.clone();
            tokio::spawn(async move {
                let started = wall_clock_millis();
                let latency =
                    lanes.lock().unwrap_or_else(|e| e.into_inner()).entry(lane).or_default().call(started, id.clone());
                let body = match latency {
                    Some(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        let took = (wall_clock_millis() - started) as f64;
                        (lane == "latency")
                            .then(|| serde_json::json!({ "rule": rule, "key": "merchant_m001", "latencyMs": took }))
                    }
                    None => {
                        let (data, attributes) = lane_payout(id.parse().unwrap_or_default(), lane);
                        let _ = pubsub.publish(SOURCE, &data, &attributes).await;
                        Some(serde_json::json!({ "rule": rule, "key": "merchant_m001", "status": 429 }))
                    }
                };
                if let Some(body) = body {
                    let _ = http.post(&feedback).json(&body).send().await;
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes `rate` payouts a second to each of `lanes` (attribute `variant`) for `secs` seconds,
/// in four batches a second; returns when it started and each lane's payouts.
pub(crate) async fn stream_lanes(
    pubsub: &EmulatorClient,
    lanes: &[&'static str],
    (rate, secs): (usize, i64),
) -> anyhow::Result<(Millis, HashMap<&'static str, HashSet<String>>)> {
    let started = wall_clock_millis();
    let mut published: HashMap<&'static str, HashSet<String>> = HashMap::new();
    let (mut i, tick) = (0, Duration::from_millis(250));
    let mut next = tokio::time::Instant::now();
    while wall_clock_millis() - started < secs * 1_000 {
        let mut batch = Vec::new();
        for lane in lanes {
            for _ in 0..rate / 4 {
                batch.push(lane_payout(i, lane));
                i += 1;
            }
        }
        pubsub.publish_batch(SOURCE, &batch).await?;
        for (_, attributes) in &batch {
            let lane = lanes.iter().find(|l| **l == attributes["variant"]).copied().unwrap_or(lanes[0]);
            published.entry(lane).or_default().insert(attributes["payout"].clone());
        }
        next += tick;
        tokio::time::sleep_until(next).await;
    }
    Ok((started, published))
}

/// The `i`th payout of a lane, its number in attribute `payout` (the same in a retry published
/// again: the partner counts payouts, not messages).
pub(crate) fn lane_payout(i: usize, lane: &str) -> (Vec<u8>, BTreeMap<String, String>) {
    let (data, mut attributes) = payout(i, "m001");
    attributes.insert("variant".into(), lane.into());
    attributes.insert("payout".into(), i.to_string());
    (data, attributes)
}

/// Runs the scenario; prints each lane's 429s and settled throughput side by side. True when
/// every event reached the partner once.
pub(crate) async fn latency_scenario(args: &Args) -> anyhow::Result<bool> {
    let (rules, pubsub) = set_up_lanes(args).await?;
    let lanes: Lanes = Arc::default();
    let until = wall_clock_millis() + STREAM_SECS * 1_000 + args.timeout_secs as Millis * 1_000;
    for lane in LANES {
        let client = EmulatorClient::new(&args.pubsub_emulator, &args.project);
        tokio::spawn(consume(lane, lanes.clone(), client, args.limiter.clone(), until));
    }
    println!(
        "a partner serving {CAPACITY} calls/s at {BASE_MS} ms, slower past that ({SATURATED_MS} ms at {}), 429 past {}; \
         {RATE} events/s to each lane for {STREAM_SECS} s",
        CAPACITY * 3 / 2,
        CAPACITY * 3 / 2
    );
    let (started, published) = stream_lanes(&pubsub, &LANES, (RATE, STREAM_SECS)).await?;
    let deadline = started + STREAM_SECS * 1_000 + args.timeout_secs as Millis * 1_000;
    let mut dead = Vec::new();
    let dead_letters = loop {
        let delivered: usize = LANES.iter().map(|lane| delivered(&lanes, lane).len()).sum();
        pull_dead_letters(&pubsub, &rules, &mut dead).await?;
        let total: usize = published.values().map(HashSet::len).sum();
        println!(
            "  +{:>3} s  delivered {delivered} of {total}, dead-lettered {}",
            (wall_clock_millis() - started) / 1_000,
            dead.len()
        );
        if delivered + dead.len() >= total || wall_clock_millis() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let lanes = lanes.lock().unwrap_or_else(|e| e.into_inner());
    let mut ok = dead_letters.is_empty();
    let mut rows = BTreeMap::new();
    for lane in LANES {
        let empty = Lane::default();
        let held = lanes.get(lane).unwrap_or(&empty);
        let ids: Vec<&String> = held.accepted.iter().map(|(_, id, _)| id).collect();
        let unique: HashSet<&String> = ids.iter().copied().collect();
        let sent = &published[lane];
        let lost = sent.iter().filter(|id| !unique.contains(id)).count();
        let duplicates = ids.len() - unique.len();
        ok &= lost == 0 && duplicates == 0;
        let (from, to) = (started + SETTLED_FROM_SECS * 1_000, started + STREAM_SECS * 1_000);
        let settled = held.accepted.iter().filter(|(at, ..)| (from..to).contains(at)).count() as f64
            / (STREAM_SECS - SETTLED_FROM_SECS) as f64;
        let mut latencies: Vec<u64> = held.accepted.iter().map(|(.., ms)| *ms).collect();
        latencies.sort_unstable();
        let p99 = latencies.get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1))).copied();
        rows.insert(lane, Figures { refused: held.refused.len(), settled, p99: p99.unwrap_or(0), lost, duplicates });
    }
    println!("\n{:<24}{:>12}{:>12}", "", "AIMD alone", "latency");
    let row = |name: &str, f: &dyn Fn(&Figures) -> String| {
        println!("{name:<24}{:>12}{:>12}", f(&rows["aimd"]), f(&rows["latency"]));
    };
    row("429s received", &|r| r.refused.to_string());
    row("delivered/s, settled", &|r| format!("{:.1}", r.settled));
    row("  of the capacity", &|r| format!("{:.0} %", 100.0 * r.settled / CAPACITY as f64));
    row("partner p99 latency", &|r| format!("{} ms", r.p99));
    row("lost / duplicated", &|r| format!("{} / {}", r.lost, r.duplicates));
    let (aimd, latency) = (rows["aimd"].refused, rows["latency"].refused);
    let fewer = if aimd == 0 { 0.0 } else { 100.0 * (aimd as f64 - latency as f64) / aimd as f64 };
    println!(
        "\n429s: {fewer:.0} % fewer with latency (target ≥ 80 %); settled throughput with latency: {:.0} % of the capacity (target ≥ 95 %)",
        100.0 * rows["latency"].settled / CAPACITY as f64
    );
    if !dead_letters.is_empty() {
        println!("FAILED: {} events were dead-lettered", dead_letters.len());
    }
    println!("result: {}", if ok { "OK (every event reached the partner once)" } else { "FAILED" });
    Ok(ok)
}

/// The rules file of a scenario with rules side by side, each rule's topics with a pull
/// subscription of the same name, and the source topic whose push subscription feeds the limiter.
pub(crate) async fn set_up_lanes(args: &Args) -> anyhow::Result<(drip_core::rules::RuleSet, EmulatorClient)> {
    let rules = drip_core::rules::RuleSet::load(&args.rules).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let pubsub = EmulatorClient::new(&args.pubsub_emulator, &args.project);
    for rule in &rules.rules {
        // A rule that forwards to a URL (the headers scenario) has no forward topic.
        let forward = match &rule.forward {
            Forward::Topic(forward) => Some(forward),
            Forward::Url(_) => None,
        };
        for topic in forward.into_iter().chain([&rule.overflow_topic, &rule.dlq_topic]) {
            pubsub.topic_with_subscription(topic).await.ok();
        }
    }
    pubsub.create_topic(SOURCE).await?;
    pubsub.create_subscription(SOURCE, SOURCE, Some(&format!("{}/push", args.limiter.trim_end_matches('/')))).await?;
    Ok((rules, pubsub))
}

fn delivered(lanes: &Lanes, lane: &str) -> HashSet<String> {
    let lanes = lanes.lock().unwrap_or_else(|e| e.into_inner());
    lanes.get(lane).map(|l| l.accepted.iter().map(|(_, id, _)| id.clone()).collect()).unwrap_or_default()
}

/// Adds what the rules' dead-letter topics hold now to `dead` (pulling acks them).
pub(crate) async fn pull_dead_letters(
    pubsub: &EmulatorClient,
    rules: &drip_core::rules::RuleSet,
    dead: &mut Vec<String>,
) -> anyhow::Result<()> {
    let topics: HashSet<String> = rules.rules.iter().map(|r| r.dlq_topic.to_string()).collect();
    for topic in topics {
        dead.extend(pubsub.pull(&topic, 1_000).await?.into_iter().map(|m| m.message_id));
    }
    Ok(())
}

/// Serves a partner on `address`: `POST /partner/<lane>`, each call answered by `answer` with its
/// lane and the event's attributes (Drip's `X-Drip-Attributes`).
pub(crate) async fn serve_partner<F, R>(address: &str, answer: F) -> anyhow::Result<()>
where
    F: Fn(String, BTreeMap<String, String>) -> R + Clone + Send + Sync + 'static,
    R: axum::response::IntoResponse + 'static,
{
    use anyhow::Context;
    let app = axum::Router::new().route(
        "/partner/{lane}",
        axum::routing::post(
            move |axum::extract::Path(lane): axum::extract::Path<String>, headers: axum::http::HeaderMap| {
                let answer = answer.clone();
                async move {
                    let attributes = headers.get("x-drip-attributes").and_then(|v| v.to_str().ok()).unwrap_or("{}");
                    answer(lane, serde_json::from_str(attributes).unwrap_or_default())
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(())
}
