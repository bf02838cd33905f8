//! Reservation throughput, printed as figures (not asserted): the reference model in memory, and
//! `reserve.lua` on a real Redis (DRIP_BENCH_REDIS_URL, default redis://127.0.0.1:6379/), one
//! client and many, on one hot key whose backlog grows with every event, and on many keys.
//!
//!   cargo bench -p drip-store

use std::time::{Duration, Instant};

use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::{ReserveRequest, Scheduler};
use drip_core::time::{MINUTE, SECOND};
use drip_store::{RedisStore, SlotRequest, SlotStore};

const T0: i64 = 1_785_758_400_000;

fn limit_sets() -> Vec<(&'static str, Vec<Limit>)> {
    let fixed = |limit, per| Limit { limit, per, window: Window::Fixed(Placement::Start) };
    vec![
        ("fixed 100/min", vec![fixed(100, MINUTE)]),
        (
            "fixed 10/s + 100/min + 10000/day",
            vec![fixed(10, SECOND), fixed(100, MINUTE), fixed(10_000, 24 * 60 * MINUTE)],
        ),
        ("sliding 100/min", vec![Limit { limit: 100, per: MINUTE, window: Window::Sliding }]),
        ("gcra 10/s burst 20", vec![Limit { limit: 10, per: SECOND, window: Window::Gcra { burst: 20 } }]),
    ]
}

fn report(what: &str, events: usize, elapsed: Duration) {
    let per_second = events as f64 / elapsed.as_secs_f64();
    println!(
        "{what:<58} {events:>8} events  {per_second:>12.0} /s  {:>8.2} µs/event",
        elapsed.as_secs_f64() * 1e6 / events as f64
    );
}

fn model() {
    println!("reference model (in memory), one hot key, backlog growing to the event count:");
    for (name, limits) in limit_sets() {
        let mut scheduler = Scheduler::new();
        let events = 200_000;
        let started = Instant::now();
        for i in 0..events {
            let id = i.to_string();
            let request = ReserveRequest {
                message_id: &id,
                cost: 1,
                limits: &limits,
                max_delay: 30 * 24 * 60 * MINUTE,
                now: T0,
                lease: 0,
            };
            std::hint::black_box(scheduler.reserve("bench", "hot", &request));
        }
        report(&format!("  {name}"), events, started.elapsed());
    }
}

async fn redis_bench(url: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let connection = client.get_multiplexed_async_connection().await?;
    let namespace = format!("bench-{}", std::process::id());
    println!("\nreserve.lua on {url}:");
    for (name, limits) in limit_sets() {
        let store = RedisStore::new(connection.clone(), namespace.clone());
        let events = 20_000;
        let started = Instant::now();
        for i in 0..events {
            let id = i.to_string();
            let rule = format!("hot-{name}");
            let request = SlotRequest {
                rule: &rule,
                key: "hot",
                message_id: &id,
                cost: 1,
                limits: &limits,
                max_delay: 30 * 24 * 60 * MINUTE,
                now: Some(T0),
                lease: 0,
                published: None,
            };
            store
                .reserve(&request)
                .await
                .map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "reserve", e.to_string())))?;
        }
        report(&format!("  one client, one hot key, {name}"), events, started.elapsed());
    }
    let limits = limit_sets().remove(1).1;
    for clients in [1usize, 8, 32] {
        let events_per_client = 40_000 / clients;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (store, limits, namespace) =
                (RedisStore::new(connection.clone(), namespace.clone()), limits.clone(), namespace.clone());
            tasks.push(tokio::spawn(async move {
                let _ = namespace;
                for i in 0..events_per_client {
                    let (id, key) = (format!("{c}-{i}"), format!("merchant_{}", (c * 7919 + i) % 1_000));
                    let request = SlotRequest {
                        rule: "many",
                        key: &key,
                        message_id: &id,
                        cost: 1,
                        limits: &limits,
                        max_delay: 30 * 24 * 60 * MINUTE,
                        now: None,
                        lease: 0,
                        published: None,
                    };
                    let _ = store.reserve(&request).await;
                }
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
        report(
            &format!("  {clients:>2} clients, 1000 keys, three fixed limits, server TIME"),
            clients * events_per_client,
            started.elapsed(),
        );
    }
    let mut cleanup = connection.clone();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{namespace}:*")).query_async(&mut cleanup).await?;
    for chunk in keys.chunks(1_000) {
        let _: () = redis::cmd("DEL").arg(chunk).query_async(&mut cleanup).await?;
    }
    Ok(())
}

fn main() {
    model();
    let url = std::env::var("DRIP_BENCH_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    if let Err(error) = runtime.block_on(redis_bench(&url)) {
        println!("\nreserve.lua: skipped, no Redis at {url} ({error})");
    }
}
