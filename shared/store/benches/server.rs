//! Redis-side figures for `./run bench` (docs/capacity.md: "Benchmarks"), printed, never asserted, all in one
//! run on one private Redis (DRIP_BENCH_REDIS_URL, which it FLUSHALLs; `./run bench` starts one), so
//! ratios compare:
//!
//! - server µs per call from `INFO commandstats` (calls pipelined, so the client's speed does not
//!   count): INCR, the seed-001 token bucket, and reserve.lua in each configuration;
//! - Redis bytes per in-flight message and per entity (`used_memory`);
//! - reservations per second on one shard with 1 to 256 clients, a call each and group-committed;
//! - µs per call against backlog depth, as a table and an SVG chart (DRIP_BENCH_OUT);
//! - µs per call of a new key against a shared budget whose calendar is full far ahead;
//! - with DRIP_BENCH_CLUSTER_URLS (a private 3-master cluster; `./run bench` starts one): a budgeted
//!   rule's reservations per second on one master against leased over the cluster, the Redis calls
//!   per event, and the capacity a leased budget strands with uniform and skewed keys; and a
//!   partner's contract of 300 a second and 2,000 a minute overrun, leased over the cluster, with
//!   its failed calls, stranded units and extra delay against one exact calendar
//!   (DRIP_BENCH_CLUSTER_ONLY runs the cluster tables alone).
//!
//! DRIP_BENCH_SCALE (default 1.0) scales every count; CI runs it small so it cannot rot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use drip_core::budgets::Leases;
use drip_core::budgets::{Adaptive, Budget};
use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::ReserveRequest;
use drip_core::time::{DAY, MINUTE, Millis, SECOND, wall_clock_millis};
use drip_store::args::ReservePaths;
use drip_store::{Batching, RedisStore, SlotRequest, Store};
use plotters::prelude::*;
use redis::aio::MultiplexedConnection;

#[path = "server/cluster.rs"]
mod cluster;
use cluster::cpu_usec;
#[path = "server/contract.rs"]
mod contract;

const TOKEN_BUCKET: &str = include_str!("../../../lua/bench/token_bucket.lua");
const ENTITIES: usize = 1_000;
const PIPELINE: usize = 500;

fn scale() -> f64 {
    std::env::var("DRIP_BENCH_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0)
}

fn scaled(n: usize) -> usize {
    ((n as f64 * scale()) as usize).max(10)
}

type Configuration = (&'static str, Vec<Limit>, Vec<Arc<Budget>>);

fn configurations() -> Vec<Configuration> {
    let fixed = |limit, per| Limit::new(limit, per, Window::Fixed(Placement::Start)).unwrap();
    // A shared gateway ceiling with a fair share and an adaptive level, as seed 003's SMS gateway.
    let gateway = Arc::new(Budget {
        name: "bench-gateway".into(),
        limits: vec![Limit::new(1_000_000, SECOND, Window::Fixed(Placement::Spread)).unwrap()],
        max_share: Some(200_000),
        adaptive: Some(Adaptive { margin: 100_000, decrease: 900_000, min: 200_000, step: 100_000, latency: None }),
        floors: Vec::new(),
        per_key: false,
        fair: None,
        leases: None,
        tag: "bench-gateway".into(),
    });
    let classes = Arc::new(Budget {
        name: "bench-classes".into(),
        limits: vec![fixed(100, MINUTE)],
        max_share: None,
        adaptive: None,
        floors: vec![("live".into(), 50_000)],
        per_key: true,
        fair: None,
        leases: None,
        tag: String::new(),
    });
    vec![
        ("1 fixed limit (100/min)", vec![fixed(100, MINUTE)], vec![]),
        ("gcra 10/s burst 100", vec![Limit::new(10, SECOND, Window::Gcra { burst: 100 }).unwrap()], vec![]),
        ("10/s + 100/min + 10,000/day", vec![fixed(10, SECOND), fixed(100, MINUTE), fixed(10_000, DAY)], vec![]),
        ("sliding 100/min", vec![Limit::new(100, MINUTE, Window::Sliding).unwrap()], vec![]),
        ("1 fixed + a shared budget (fair share, adaptive)", vec![fixed(100, MINUTE)], vec![gateway]),
        // The key's class `bulk` of a rule with classes: the limit is the key's calendar.
        ("1 fixed with classes (bulk beside a live reserve)", vec![], vec![classes]),
    ]
}

/// The entity of `key` under a configuration: `<key>#bulk` when its first budget is a classes
/// calendar, else the key.
fn entity(key: String, budgets: &[Arc<Budget>]) -> String {
    if budgets.first().is_some_and(|b| b.per_key) { format!("{key}#bulk") } else { key }
}

/// Events per call in the batched rows (as group commit sends them).
const BATCH: usize = 16;

/// How a row's events share their calls: one a call, BATCH of BATCH keys, or BATCH of one key (a
/// merchant's burst, its state read and written once).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Alone,
    Keys,
    Burst,
}

impl Shape {
    fn per_call(self) -> usize {
        if self == Shape::Alone { 1 } else { BATCH }
    }

    /// Call `i` of a row of `rule`'s events in this shape, its messages named `<prefix>-<n>`.
    fn call(
        self,
        store: &RedisStore<MultiplexedConnection>,
        (rule, prefix): (&str, &str),
        config: (&[Limit], &[Arc<Budget>]),
        published: Millis,
        i: usize,
    ) -> redis::Cmd {
        let n = self.per_call();
        let keys: Vec<String> = (0..n)
            .map(|j| {
                let k = if self == Shape::Burst { i } else { i * n + j };
                entity(format!("merchant_{}", k % ENTITIES), config.1)
            })
            .collect();
        let ids: Vec<String> = (0..n).map(|j| format!("{prefix}-{}", i * n + j)).collect();
        let requests: Vec<SlotRequest> =
            keys.iter().zip(&ids).map(|(key, id)| request(rule, key, id, config, published)).collect();
        store.reserve_batch_call(&requests).cmd()
    }
}

/// Each command's `(calls, server µs)`, by its name in `INFO commandstats`.
type CommandStats = BTreeMap<String, (u64, u64)>;

/// Each command's calls and server µs since the last RESETSTAT. A script's line counts its whole
/// call, the commands it calls included, and those have lines of their own.
async fn commandstats(connection: &mut MultiplexedConnection) -> CommandStats {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(connection).await.expect("INFO");
    let field = |line: &str, name: &str| {
        line.split([':', ','])
            .find_map(|part| part.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    info.lines()
        .filter_map(|line| {
            let command = line.strip_prefix("cmdstat_")?.split(':').next()?;
            Some((command.to_owned(), (field(line, "calls"), field(line, "usec"))))
        })
        .collect()
}

/// `(calls, usec)` of one command in `INFO commandstats`.
async fn commandstat(connection: &mut MultiplexedConnection, command: &str) -> (u64, u64) {
    commandstats(connection).await.get(command).copied().unwrap_or_default()
}

/// Runs `calls` commands in pipelines; returns server µs per call and wall calls per second.
async fn measure(
    connection: &mut MultiplexedConnection,
    command: &str,
    calls: usize,
    build: impl Fn(usize) -> redis::Cmd,
) -> (f64, f64) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(connection).await.expect("RESETSTAT");
    let started = Instant::now();
    for chunk in (0..calls).collect::<Vec<_>>().chunks(PIPELINE) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.add_command(build(i)).ignore();
        }
        let _: () = pipe.query_async(connection).await.expect("pipeline");
    }
    let elapsed = started.elapsed();
    let (n, usec) = commandstat(connection, command).await;
    (usec as f64 / n.max(1) as f64, calls as f64 / elapsed.as_secs_f64())
}

fn request<'a>(
    rule: &'a str,
    key: &'a str,
    id: &'a str,
    (limits, budgets): (&'a [Limit], &'a [Arc<Budget>]),
    published: Millis,
) -> SlotRequest<'a> {
    let event = ReserveRequest {
        max_delay: 30 * DAY,
        lease: 15 * SECOND,
        published: Some(published),
        budgets,
        ..ReserveRequest::new(id, limits, 0)
    };
    let classed = budgets.first().is_some_and(|b| b.per_key);
    let event = ReserveRequest { class: drip_core::rules::Classes::split(key).filter(|_| classed), ..event };
    let tag = budgets.first().filter(|b| !b.per_key).map(|b| b.tag.as_str());
    SlotRequest { tag, ..SlotRequest::new(rule, key, event) }
}

async fn load(connection: &mut MultiplexedConnection, script: &str) -> String {
    redis::cmd("SCRIPT").arg("LOAD").arg(script).query_async(connection).await.expect("SCRIPT LOAD")
}

/// Loads `reserve.lua`'s function library, as the store does on its first call.
async fn load_reserve(connection: &mut MultiplexedConnection) {
    let library = drip_store::reserve_library();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library)
        .query_async(connection)
        .await
        .expect("FUNCTION LOAD");
}

/// Script calls since the last RESETSTAT: `FCALL`s of reserve.lua and `EVALSHA`s of the others
/// (lease.lua, dispatch.lua), with their server µs.
async fn script_calls(connection: &mut MultiplexedConnection) -> (u64, u64) {
    let stats = commandstats(connection).await;
    SCRIPT_COMMANDS
        .iter()
        .filter_map(|command| stats.get(*command))
        .fold((0, 0), |(n, u), &(calls, usec)| (n + calls, u + usec))
}

fn token_bucket_call(sha: &str, key: &str, now_seconds: i64) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key).arg(100).arg(100.0 / 60.0).arg(now_seconds).arg(1);
    cmd
}

struct Row {
    name: String,
    usec: f64,
    per_second: f64,
}

async fn script_table(connection: &mut MultiplexedConnection, store: &RedisStore<MultiplexedConnection>) -> Vec<Row> {
    let calls = scaled(50_000);
    let mut rows = Vec::new();
    let (usec, per_second) =
        measure(connection, "incr", calls, |i| redis::cmd("INCR").arg(format!("bench:incr:{}", i % ENTITIES)).clone())
            .await;
    rows.push(Row { name: "INCR (the floor)".into(), usec, per_second });
    let sha = load(connection, TOKEN_BUCKET).await;
    let started = wall_clock_millis() / 1_000;
    let (usec, per_second) = measure(connection, "evalsha", calls, |i| {
        token_bucket_call(&sha, &format!("bench:tb:{{{}}}", i % ENTITIES), started + (i / ENTITIES) as i64)
    })
    .await;
    rows.push(Row { name: "a classic Lua token bucket (HMGET, refill, HMSET, EXPIRE)".into(), usec, per_second });
    load_reserve(connection).await;
    // The shapes without a budget take the lean path; each is measured on the general path too,
    // right after, as the same events (`ReservePaths::General`), so that the two compare.
    let general = store.clone().with_reserve_paths(ReservePaths::General);
    let paths_of = |budgets: &[Arc<Budget>]| -> Vec<(&str, &RedisStore<MultiplexedConnection>)> {
        if budgets.is_empty() { vec![("", store), (", the general path", &general)] } else { vec![("", store)] }
    };
    for (n, (name, limits, budgets)) in configurations().into_iter().enumerate() {
        for (path, store) in paths_of(&budgets) {
            let rule = format!("bench{n}{path}");
            let published = wall_clock_millis();
            let (usec, per_second) = measure(connection, "fcall", calls, |i| {
                let (key, id) = (entity(format!("merchant_{}", i % ENTITIES), &budgets), format!("{i}"));
                store.reserve_call(&request(&rule, &key, &id, (&limits, &budgets), published)).cmd()
            })
            .await;
            rows.push(Row { name: format!("reserve.lua, {name}{path}"), usec, per_second });
        }
    }
    // Each configuration again, BATCH events per call (as group commit sends them), of BATCH keys
    // and of one key: µs per event. The one-key rows take the first four (no budget).
    for (shape, label, prefix, take) in
        [(Shape::Keys, format!("{BATCH} keys"), "batch", usize::MAX), (Shape::Burst, "one key".to_owned(), "hot", 4)]
    {
        for (n, (name, limits, budgets)) in configurations().into_iter().enumerate().take(take) {
            for (path, store) in paths_of(&budgets) {
                let rule = format!("bench-{prefix}{n}{path}");
                let published = wall_clock_millis();
                let config = (&limits[..], &budgets[..]);
                let (usec, per_second) = measure(connection, "fcall", calls / BATCH, |i| {
                    shape.call(store, (&rule, prefix), config, published, i)
                })
                .await;
                rows.push(Row {
                    name: format!("reserve.lua, {name}, {BATCH} events of {label} per call (per event){path}"),
                    usec: usec / BATCH as f64,
                    per_second: per_second * BATCH as f64,
                });
            }
        }
    }
    rows
}

/// Configuration `which`'s events, `scaled(200_000)` of them, in the shape DRIP_BENCH_PROFILE_SHAPE
/// names (`alone`, `keys`: 16 of 16 keys per call, `burst`: 16 of one key), for a profiler.
async fn profile(connection: &mut MultiplexedConnection, store: &RedisStore<MultiplexedConnection>, which: usize) {
    load_reserve(connection).await;
    let (name, limits, budgets) = configurations().swap_remove(which);
    let named = std::env::var("DRIP_BENCH_PROFILE_SHAPE").unwrap_or_else(|_| "alone".into());
    let shape = match named.as_str() {
        "keys" => Shape::Keys,
        "burst" => Shape::Burst,
        _ => Shape::Alone,
    };
    let published = wall_clock_millis();
    let calls = scaled(200_000) / shape.per_call();
    let (usec, _) = measure(connection, "fcall", calls, |i| {
        shape.call(store, ("profile", "profile"), (&limits, &budgets), published, i)
    })
    .await;
    println!("{name}, {named}: {:.2} server µs per event", usec / shape.per_call() as f64);
}

/// `CL.THROTTLE` of redis-cell, when the server loaded the module (`./run bench` builds it).
async fn redis_cell(connection: &mut MultiplexedConnection) -> Option<(f64, f64)> {
    let modules: redis::Value = redis::cmd("MODULE").arg("LIST").query_async(connection).await.ok()?;
    if !format!("{modules:?}").contains("redis-cell") {
        return None;
    }
    let calls = scaled(50_000);
    Some(
        measure(connection, "cl.throttle", calls, |i| {
            redis::cmd("CL.THROTTLE")
                .arg(format!("bench:cell:{}", i % ENTITIES))
                .arg(100)
                .arg(100)
                .arg(60)
                .arg(1)
                .clone()
        })
        .await,
    )
}

async fn used_memory(connection: &mut MultiplexedConnection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(connection).await.expect("INFO");
    info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Bytes per in-flight message and per entity: `ENTITIES` entities with one message each, then
/// `messages` more on them.
async fn memory(connection: &mut MultiplexedConnection, store: &RedisStore<MultiplexedConnection>) -> (f64, f64) {
    let limits = [Limit::new(1_000_000, MINUTE, Window::Fixed(Placement::Start)).unwrap()];
    let messages = scaled(100_000);
    let published = wall_clock_millis();
    let _: () = redis::cmd("FLUSHALL").query_async(connection).await.expect("FLUSHALL");
    load_reserve(connection).await;
    let before = used_memory(connection).await;
    let run = async |connection: &mut MultiplexedConnection, range: std::ops::Range<usize>| {
        for chunk in range.collect::<Vec<_>>().chunks(PIPELINE) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                let (key, id) =
                    (format!("merchant_{}", i % ENTITIES), format!("{}", 1_000_000_000_000_000u64 + i as u64));
                pipe.add_command(store.reserve_call(&request("memory", &key, &id, (&limits, &[]), published)).cmd())
                    .ignore();
            }
            let _: () = pipe.query_async(connection).await.expect("pipeline");
        }
    };
    run(connection, 0..ENTITIES).await;
    let with_entities = used_memory(connection).await;
    run(connection, ENTITIES..ENTITIES + messages).await;
    let with_messages = used_memory(connection).await;
    let per_message = (with_messages - with_entities) as f64 / messages as f64;
    let per_entity = (with_entities - before) as f64 / ENTITIES as f64 - per_message;
    // What an idle entity keeps (its answers expire): the state hash, beside the same hash without
    // the two bookkeeping fields this version added ('exp', 'ab'), as the previous layout kept it.
    let state = store.keys(&request("memory", "merchant_0", "-", (&limits, &[]), published)).state;
    let fields: Vec<(String, String)> =
        redis::cmd("HGETALL").arg(&state).query_async(connection).await.expect("HGETALL");
    let mut previous = redis::cmd("HSET");
    previous.arg("bench:previous-layout");
    for (field, value) in fields.iter().filter(|(f, _)| f != "exp" && f != "ab") {
        previous.arg(field).arg(value);
    }
    let _: () = previous.query_async(connection).await.expect("HSET");
    let usage = async |connection: &mut MultiplexedConnection, key: &str| -> i64 {
        redis::cmd("MEMORY").arg("USAGE").arg(key).query_async(connection).await.unwrap_or(0)
    };
    let (now_bytes, before_bytes) = (usage(connection, &state).await, usage(connection, "bench:previous-layout").await);
    println!("state of an idle entity (1 fixed limit): {now_bytes} bytes; {before_bytes} without 'exp' and 'ab'");
    (per_message, per_entity)
}

/// Reservations a second through the store, a call each and group-committed, with the server's µs
/// an event in each run: one shard's bound where the client is not (here the bench, its clients
/// and Redis share the machine's cores); `DRIP_BENCH_THROUGHPUT_ONLY=1` runs this table alone.
async fn throughput_table(connection: &mut MultiplexedConnection, store: &RedisStore<MultiplexedConnection>) {
    let batched = store.clone().with_batching(Batching::new(64, false));
    println!(
        "\n| clients (one multiplexed connection) | keys | reservations/s, a call each | with group commit (≤ 64 per call) | ratio | server µs an event, a call each / group-committed | one shard's bound (10⁶ ÷ server µs), group-committed |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (clients, keys) in [(1, ENTITIES), (8, ENTITIES), (32, ENTITIES), (256, ENTITIES), (32, 1), (256, 1)] {
        server_usec(connection).await;
        let (alone, events) = throughput(store, clients, keys).await;
        let alone_usec = server_usec(connection).await / events as f64;
        let (together, events) = throughput(&batched, clients, keys).await;
        let together_usec = server_usec(connection).await / events as f64;
        println!(
            "| {clients} | {keys} | {alone:.0} | {together:.0} | {:.2}× | {alone_usec:.2} / {together_usec:.2} | {:.0} |",
            together / alone,
            1e6 / together_usec
        );
    }
}

/// Reservations per second through `RedisStore::reserve`, as the limiter calls it: `clients` tasks
/// sharing one multiplexed connection, each awaiting its reservation before the next, over `keys`
/// keys (with batching, those that arrive while a call is in flight share the next); and how many
/// were made.
async fn throughput(store: &RedisStore<MultiplexedConnection>, clients: usize, keys: usize) -> (f64, usize) {
    let limits = [Limit::new(1_000_000_000, MINUTE, Window::Fixed(Placement::Start)).unwrap()];
    let events = scaled(60_000) / clients * clients;
    let published = wall_clock_millis();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, limits) = (store.clone(), limits);
        tasks.push(tokio::spawn(async move {
            for i in 0..events / clients {
                let (key, id) = (format!("merchant_{}", (c * 7_919 + i) % keys), format!("t{keys}-{c}-{i}"));
                store.reserve(&request("throughput", &key, &id, (&limits, &[]), published)).await.expect("reserve");
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    (events as f64 / started.elapsed().as_secs_f64(), events)
}

/// Server µs per call on one hot key after `depth` reservations queued ahead (100 per minute:
/// the backlog reaches depth/100 minutes), for reserve.lua and the token bucket.
async fn backlog(
    connection: &mut MultiplexedConnection,
    store: &RedisStore<MultiplexedConnection>,
) -> Vec<(usize, f64, f64)> {
    let limits = configurations().remove(0).1;
    let sha = load(connection, TOKEN_BUCKET).await;
    load_reserve(connection).await;
    let probe = scaled(5_000);
    let mut rows = Vec::new();
    let mut depth_so_far = 0;
    let published = wall_clock_millis();
    for depth in [0, 1_000, 10_000, 100_000].map(scaled).map(|d| if d == 10 { 0 } else { d }) {
        let fill = depth - depth_so_far.min(depth);
        let (offset, now_s) = (depth_so_far, wall_clock_millis() / 1_000);
        measure(connection, "fcall", fill, |i| {
            store.reserve_call(&request("hot", "hot", &format!("fill{}", offset + i), (&limits, &[]), published)).cmd()
        })
        .await;
        depth_so_far = depth;
        let (drip, _) = measure(connection, "fcall", probe, |i| {
            store.reserve_call(&request("hot", "hot", &format!("probe{depth}-{i}"), (&limits, &[]), published)).cmd()
        })
        .await;
        depth_so_far += probe;
        let (bucket, _) =
            measure(connection, "evalsha", probe, |i| token_bucket_call(&sha, "bench:tb:{hot}", now_s + i as i64))
                .await;
        rows.push((depth, drip, bucket));
    }
    rows
}

/// Server µs per call of new keys against a budget (2 per second) whose calendar is full `ahead`
/// windows from now. The calendar is written 1,000 windows at a time, each followed by a tenant's
/// search that walks them (as the tenants that filled them would have), then `probe` new keys
/// reserve.
async fn full_calendar(
    connection: &mut MultiplexedConnection,
    store: &RedisStore<MultiplexedConnection>,
) -> Vec<(i64, f64)> {
    let limits = [Limit::new(1_000, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let probe = scaled(200);
    let mut rows = Vec::new();
    for ahead in [3_600, 36_000, 360_000].map(|n| scaled(n) as i64) {
        let budget = Arc::new(Budget::named(
            format!("bench-calendar-{ahead}"),
            format!("bench-calendar-{ahead}"),
            vec![Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()],
        ));
        let key = drip_store::budget_key("bench", &budget);
        let budgets = [budget];
        let start = wall_clock_millis().div_euclid(SECOND) * SECOND;
        let mut filled = 0;
        while filled < ahead {
            let windows: Vec<(String, u64)> = (filled..(filled + 1_000).min(ahead))
                .map(|w| (drip_store::field::budget_window(SECOND, start + w * SECOND), 2))
                .collect();
            let _: () = redis::AsyncCommands::hset_multiple(connection, &key, &windows).await.expect("HSET");
            filled += 1_000;
            let id = format!("fill{filled}");
            let mut filler = request("calendar", &id, "m", (&limits, &budgets), start);
            filler.event.max_delay = 400 * 3_600 * SECOND;
            store.reserve(&filler).await.expect("reserve");
        }
        let (usec, _) = measure(connection, "fcall", probe, |i| {
            let id = format!("new{i}");
            let mut call = request("calendar", &id, "m", (&limits, &budgets), start);
            call.event.max_delay = 400 * 3_600 * SECOND;
            store.reserve_call(&call).cmd()
        })
        .await;
        rows.push((ahead, usec));
    }
    rows
}

fn chart(path: &str, rows: &[(usize, f64, f64)]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = rows.iter().map(|r| r.1.max(r.2)).fold(1.0, f64::max) * 1.3;
    let right = rows.iter().map(|r| r.0).max().unwrap_or(1).max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption("server µs per call against backlog depth (one hot key)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..right * 1.05, 0.0..top)?;
    chart.configure_mesh().x_desc("reservations queued ahead").y_desc("µs per call").draw()?;
    for (label, color, pick) in [("reserve.lua (fixed 100/min)", BLUE, 1usize), ("classic Lua token bucket", RED, 2)] {
        let points: Vec<(f64, f64)> = rows.iter().map(|r| (r.0 as f64, if pick == 1 { r.1 } else { r.2 })).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, color.filled())))?;
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw()?;
    root.present()?;
    Ok(())
}

/// A first-come budget and a fair one under the same load, side by side (docs/capacity.md: "A fair
/// budget under a deep backlog"), in passes of one each, a fresh Redis for each pass, then the
/// passes' median ratios: the two runs of a pass are seconds apart, and this machine's speed
/// swings more than that between passes (`DRIP_BENCH_FAIR_PASSES`, 3 by default).
/// `DRIP_BENCH_FAIR_ONLY=1` runs this table alone.
async fn fair_table(connection: &mut MultiplexedConnection, store: &RedisStore<MultiplexedConnection>) {
    let batched = store.clone().with_batching(Batching::new(64, false));
    // A quarter of the load a second: the backlog spans four windows at every scale, so most of
    // it lies past the fair budget's near horizon and parks.
    let (count, events) = ((budgeted_events(32) / 4) as u64, budgeted_events(32) as f64);
    let passes: usize = std::env::var("DRIP_BENCH_FAIR_PASSES").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    println!(
        "\n| a budget of {count}/s, 32 clients, {events} events over {ENTITIES} keys, {}-byte bodies | reservations/s | script calls to drain | Redis CPU µs an event | vs first come: reservations/s, one Redis's bound |\n|---|---|---|---|---|",
        fair_body_size()
    );
    let (mut per_second, mut bound, mut handed) = (Vec::new(), Vec::new(), Vec::new());
    let mut last: [(CommandStats, f64); 3] = Default::default();
    for _ in 0..passes {
        let _: () = redis::cmd("FLUSHALL").query_async(connection).await.expect("FLUSHALL");
        server_usec(connection).await;
        let cpu = cpu_usec(connection).await;
        let first_come =
            budgeted_throughput(&batched, &gateway_of("fcfs-bench", None, count), 32, (false, false)).await;
        let first_cpu = (cpu_usec(connection).await - cpu) / events;
        let first_stats = reset_commandstats(connection).await;
        let first_usec = sent_usec(&first_stats) / events;
        println!(
            "| first come, first served ({first_usec:.1} server µs an event) | {first_come:.0} | | {first_cpu:.1} | 1.00×, 1.00× |"
        );
        let cpu = cpu_usec(connection).await;
        let fair = fair_throughput((&batched, connection), count, 32, false).await;
        let fair_cpu = (cpu_usec(connection).await - cpu) / events;
        per_second.push(fair.per_second / first_come);
        bound.push(first_cpu / fair_cpu);
        println!(
            "| `fair: true`: park past the near horizon ({:.1} server µs an event; {:.0} % of the time), drain in round robin ({:.1} µs a parked event; {} parked) | {:.0} | {} | {fair_cpu:.1} | {:.2}×, {:.2}× |",
            fair.reserve_usec,
            100.0 * fair.parking,
            fair.unpark_usec,
            fair.parked,
            fair.per_second,
            fair.calls,
            fair.per_second / first_come,
            first_cpu / fair_cpu
        );
        last = [(first_stats, events), (fair.parking_stats, events), (fair.draining_stats, fair.parked as f64)];
        // The same, each event's answer completed once its task is made (as the limiter and the
        // dispatcher do), and each parked event's body read and its hand-over recorded (the
        // dispatcher's drain): the Redis work a fair budget adds beyond its reservations.
        let _: () = redis::cmd("FLUSHALL").query_async(connection).await.expect("FLUSHALL");
        let first_come = budgeted_throughput(&batched, &gateway_of("fcfs-bench", None, count), 32, (false, true)).await;
        let fair = fair_throughput((&batched, connection), count, 32, true).await;
        handed.push(fair.per_second / first_come);
        println!(
            "| each event's answer completed too, and each parked one's body read and hand-over recorded: first come, then `fair: true` | {first_come:.0}, {:.0} | {} | | {:.2}× |",
            fair.per_second,
            fair.calls,
            fair.per_second / first_come
        );
    }
    println!(
        "| `fair: true`, the median of {passes} passes | | | | {:.2}×, {:.2}×; with completions and hand-overs {:.2}× |",
        median(&mut per_second),
        median(&mut bound),
        median(&mut handed)
    );
    phase_commands(&last);
}

/// The Redis commands the scripts called in the last pass's first come, parking and draining
/// (each phase's stats with what it counts per: its events, or its parked events), and the
/// callers' own (a parked body kept after its call): calls per event and server µs per call of
/// each, then the scripts' own µs (their Lua and the call itself: the script calls' µs less their
/// commands') and the whole.
fn phase_commands(phases: &[(CommandStats, f64); 3]) {
    // The bench's own commands and the store's loading of its functions (`config|resetstat` names
    // a subcommand) are not the scripts', nor are the callers' (listed, marked).
    let bench_own = |command: &str| {
        let command = command.split('|').next().unwrap_or_default();
        SCRIPT_COMMANDS.contains(&command) || ["info", "config", "flushall", "function"].contains(&command)
    };
    let scripts_called = |command: &str| !bench_own(command) && !CALLER_COMMANDS.contains(&command);
    let commands: std::collections::BTreeSet<&String> =
        phases.iter().flat_map(|(stats, _)| stats.keys()).filter(|c| !bench_own(c)).collect();
    println!(
        "\n| the last pass's Redis commands, calls × server µs a call | first come, an event | parking, an event | draining, a parked event |\n|---|---|---|---|"
    );
    for command in commands {
        let cells: Vec<String> = phases
            .iter()
            .map(|(stats, per)| match stats.get(command) {
                Some(&(calls, usec)) if calls > 0 => {
                    format!("{:.2} × {:.2}", calls as f64 / per, usec as f64 / calls as f64)
                }
                _ => String::new(),
            })
            .collect();
        let caller = if scripts_called(command) { "" } else { " (the caller's)" };
        println!("| `{}`{caller} | {} |", command.to_uppercase(), cells.join(" | "));
    }
    let scripts: Vec<f64> = phases.iter().map(|(stats, per)| sent_usec(stats) / per).collect();
    let own: Vec<String> = phases
        .iter()
        .zip(&scripts)
        .map(|((stats, per), all)| {
            let called: f64 = stats.iter().filter(|(c, _)| scripts_called(c)).map(|(_, &(_, usec))| usec as f64).sum();
            let caller: f64 = CALLER_COMMANDS.iter().filter_map(|c| stats.get(*c)).map(|&(_, usec)| usec as f64).sum();
            format!("{:.1}", all - (called + caller) / per)
        })
        .collect();
    println!("| the scripts' own work (their Lua, the call itself), µs | {} |", own.join(" | "));
    let all: Vec<String> = scripts.iter().map(|usec| format!("{usec:.1}")).collect();
    println!("| the scripts and the callers' commands in all, µs | {} |", all.join(" | "));
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A budget of 5,000 a second (a partner's contract), leased over `partitions` or not.
fn gateway(name: &str, partitions: Option<u32>) -> Arc<Budget> {
    gateway_of(name, partitions, GATEWAY)
}

/// A budget of `count` a second, leased over `partitions` or not.
fn gateway_of(name: &str, partitions: Option<u32>, count: u64) -> Arc<Budget> {
    Arc::new(Budget {
        name: name.into(),
        limits: vec![Limit::new(count, SECOND, Window::Fixed(Placement::Start)).unwrap()],
        max_share: None,
        adaptive: None,
        floors: Vec::new(),
        per_key: false,
        fair: None,
        leases: partitions.map(|p| Leases { partitions: p, chunk: Leases::default_chunk(p) }),
        tag: name.into(),
    })
}

const GATEWAY: u64 = 5_000;

/// Reservations per second of a rule drawing from `budget` through group commit (a lane per hash
/// tag), `clients` callers over `ENTITIES` keys (`skewed`: four events in five from a tenth of them;
/// `complete`: each answer completed after its reservation, as once its task is made).
async fn budgeted_throughput<C>(
    store: &RedisStore<C>,
    budget: &Arc<Budget>,
    clients: usize,
    (skewed, complete): (bool, bool),
) -> f64
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let limits = [Limit::new(1_000_000_000, MINUTE, Window::Fixed(Placement::Start)).unwrap()];
    let events = budgeted_events(clients);
    let published = wall_clock_millis();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, budgets, rule) = (store.clone(), [budget.clone()], format!("{}-rule", budget.name));
        tasks.push(tokio::spawn(async move {
            for i in 0..events / clients {
                let n = c * 7_919 + i;
                let key = if skewed && n % 5 != 0 { n % (ENTITIES / 10) } else { n % ENTITIES };
                let (key, id) = (format!("user_{key}"), format!("{}-{c}-{i}", budgets[0].name));
                let request = request(&rule, &key, &id, (&limits, &budgets), published);
                let event = ReserveRequest { max_delay: DAY, ..request.event };
                let request = SlotRequest { event, ..request };
                let reserved = store.reserve(&request).await.expect("reserve");
                if complete {
                    store.complete(&request, &reserved).await.expect("complete");
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    events as f64 / started.elapsed().as_secs_f64()
}

/// The same load through a fair budget of the same count, group commit on: `clients` callers
/// each own their keys (so each key's queue is in its caller's order); an event whose slot lies
/// past the near horizon parks and its key joins the ring, then drains at a simulated clock that
/// moves one near horizon at a time hand the ring's keys their heads in round robin, up to 128
/// unparks per script call (the dispatcher's plan): reservations per second, parking and draining
/// together, and the script calls the drains made. With `hand_over`, as the limiter and the
/// dispatcher also do: each answer is completed once its event is booked, and a drain reads its
/// planned heads' bodies first and records each booked head's hand-over.
async fn fair_throughput<C>(
    (store, connection): (&RedisStore<C>, &mut MultiplexedConnection),
    count: u64,
    clients: usize,
    hand_over: bool,
) -> FairFigures
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    use drip_core::fair::{Fair, Round};
    use drip_core::schedule::{Status, Unpark};
    let budget = Arc::new(Budget { fair: Some(Fair::default()), ..(*gateway_of("fair-bench", None, count)).clone() });
    let near = budget.near().expect("fair");
    let limits = [Limit::new(1_000_000_000, MINUTE, Window::Fixed(Placement::Start)).unwrap()];
    let events = budgeted_events(clients);
    let (t0, rule) = (wall_clock_millis().div_euclid(SECOND) * SECOND, "fair-bench-rule".to_owned());
    let keys_each = ENTITIES / clients;
    // Each event's task body, as the limiter builds it to keep should the event park.
    let body: Arc<[u8]> = vec![b'x'; fair_body_size()].into();
    server_usec(connection).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, budgets, rule, body) = (store.clone(), [budget.clone()], rule.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut parked: Vec<(usize, usize)> = Vec::new();
            for i in 0..events / clients {
                let key = format!("user_{}", (i % keys_each) * clients + c);
                let id = format!("fair-{c}-{i}");
                let request = request(&rule, &key, &id, (&limits, &budgets), t0);
                let event = ReserveRequest { max_delay: DAY, park: Some(2 * SECOND), ..request.event };
                // As the limiter parks: the body kept, the key joined to the ring and its drain
                // armed unless it was, all in the call; a body too large for that kept after.
                let request = SlotRequest { event, ..request }.at(t0).keeping_if_parked(&body);
                let reserved = store.reserve(&request).await.expect("reserve");
                if reserved.reservation.status == Status::Parked {
                    if !reserved.body_kept(&request) {
                        store.park_body(&request, &body, DAY).await.expect("park_body");
                    }
                    parked.push((c, i));
                } else if hand_over {
                    store.complete(&request, &reserved).await.expect("complete");
                }
            }
            parked
        }));
    }
    // Each key's parked events, in its caller's order.
    let mut queues: std::collections::BTreeMap<String, std::collections::VecDeque<String>> = Default::default();
    for task in tasks {
        for (c, i) in task.await.expect("client") {
            queues
                .entry(format!("user_{}", (i % keys_each) * clients + c))
                .or_default()
                .push_back(format!("fair-{c}-{i}"));
        }
    }
    let parking = started.elapsed().as_secs_f64();
    let parked: usize = queues.values().map(|q| q.len()).sum();
    let parking_stats = reset_commandstats(connection).await;
    let (mut now, mut calls, budgets) = (t0, 0, [budget.clone()]);
    let the_rule = bench_rule(&rule, &limits, &budgets);
    while queues.values().any(|q| !q.is_empty()) {
        let keys: Vec<String> = queues.iter().filter(|(_, q)| !q.is_empty()).map(|(k, _)| k.clone()).collect();
        let mut round = Round::new(vec![1; keys.len()], 0);
        loop {
            let mut plan: Vec<(usize, String)> = Vec::new();
            let mut planned = vec![0; keys.len()];
            while plan.len() < 128 {
                let Some(m) = round.visit() else { break };
                match queues[&keys[m]].get(planned[m]) {
                    Some(id) if round.affords(m, 1) => {
                        round.spend(m, 1);
                        planned[m] += 1;
                        plan.push((m, id.clone()));
                    }
                    Some(_) => {}
                    None => round.retire(m),
                }
            }
            if plan.is_empty() {
                break;
            }
            // Each planned key's bodies, its heads' in order (a drained head's hand-over names its
            // queue entry by the body the entry keeps).
            let mut bodies: Vec<std::collections::VecDeque<Option<drip_store::ParkedBody>>> =
                vec![Default::default(); keys.len()];
            if hand_over {
                let read: Vec<usize> = (0..keys.len()).filter(|&m| planned[m] > 0).collect();
                let reads = read.iter().map(|&m| store.parked_bodies(&the_rule, &keys[m], planned[m]));
                let read_bodies = futures_util::future::try_join_all(reads).await.expect("parked_bodies");
                for (m, read) in read.into_iter().zip(read_bodies) {
                    assert!(read.iter().all(Option::is_some), "every planned head has its body");
                    bodies[m] = read.into();
                }
            }
            let requests: Vec<SlotRequest> = plan
                .iter()
                .map(|(m, id)| {
                    let request = request(&rule, &keys[*m], id, (&limits, &budgets), t0);
                    let event = ReserveRequest { max_delay: DAY, ..request.event };
                    SlotRequest { event, unpark: Some(now + near), ..request }.at(now)
                })
                .collect();
            calls += 1;
            let unparks = store.unpark_all(&requests).await.expect("unpark_all");
            let mut handing = Vec::new();
            for (((m, _), request), (unpark, at)) in plan.iter().zip(&requests).zip(&unparks) {
                match unpark {
                    Unpark::Decided(reservation) => {
                        _ = queues.get_mut(&keys[*m]).expect("a key").pop_front();
                        if hand_over {
                            let reserved = drip_store::Reserved { reservation: *reservation, now: *at, armed: false };
                            let body = bodies[*m].pop_front().flatten().expect("read above");
                            handing.push(async move {
                                store.complete(request, &reserved).await?;
                                store.handed_over(&body.handed_over(*request)).await
                            });
                        }
                    }
                    _ => round.retire(*m),
                }
            }
            futures_util::future::try_join_all(handing).await.expect("hand-over");
            if drip_core::schedule::full_through_deadline(unparks.iter().map(|(unpark, _)| unpark)) {
                break;
            }
        }
        now += near;
    }
    let total = started.elapsed().as_secs_f64();
    let draining_stats = reset_commandstats(connection).await;
    FairFigures {
        per_second: events as f64 / total,
        calls,
        parking: parking / total,
        reserve_usec: sent_usec(&parking_stats) / events as f64,
        unpark_usec: sent_usec(&draining_stats) / parked.max(1) as f64,
        parked,
        parking_stats,
        draining_stats,
    }
}

/// The size of the fair table's task bodies: `DRIP_BENCH_FAIR_BODY` bytes, 300 unless set.
fn fair_body_size() -> usize {
    std::env::var("DRIP_BENCH_FAIR_BODY").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

/// The bench's fair rule as the store's per-key operations take it (`parked_bodies`): its id,
/// `limits` and `budgets`, no classes.
fn bench_rule(id: &str, limits: &[Limit], budgets: &[Arc<Budget>]) -> drip_core::rules::Rule {
    let text = "default_dlq_topic: dlq\nrules:\n  - name: bench\n    key: \"{attributes.k}\"\n    \
        limits: [ { limit: 10, per: 1s } ]\n    max_delay: 1h\n    forward: { topic: ready }\n    overflow_topic: overflow\n";
    let rules = drip_core::rules::RuleSet::parse("bench.yaml", text).expect("the bench's rule");
    let mut rule = rules.rule("bench").expect("bench").clone();
    (rule.id, rule.name, rule.limits, rule.budgets) = (id.to_owned(), id.to_owned(), limits.to_vec(), budgets.to_vec());
    rule
}

/// What [`fair_throughput`] measured: reservations a second, the drains' script calls, the share
/// of the time spent parking, the server µs per event while parking (its reservation, and its
/// body when it parks, in the call or after it) and per parked event while draining, and each
/// phase's commands.
struct FairFigures {
    per_second: f64,
    calls: u64,
    parking: f64,
    reserve_usec: f64,
    unpark_usec: f64,
    parked: usize,
    parking_stats: CommandStats,
    draining_stats: CommandStats,
}

/// Server µs of what the bench's callers sent since the last RESETSTAT (script calls, each counting
/// the commands it calls, and `CALLER_COMMANDS`), reset again.
async fn server_usec(connection: &mut MultiplexedConnection) -> f64 {
    sent_usec(&reset_commandstats(connection).await)
}

/// [`commandstats`], reset again.
async fn reset_commandstats(connection: &mut MultiplexedConnection) -> CommandStats {
    let stats = commandstats(connection).await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(connection).await.expect("RESETSTAT");
    stats
}

/// The server µs of what the bench's callers sent among `stats`: the script calls (`FCALL`s and
/// `EVALSHA`s) and `CALLER_COMMANDS`.
fn sent_usec(stats: &CommandStats) -> f64 {
    SCRIPT_COMMANDS
        .iter()
        .chain(&CALLER_COMMANDS)
        .filter_map(|command| stats.get(*command))
        .map(|&(_, usec)| usec as f64)
        .sum()
}

const SCRIPT_COMMANDS: [&str; 2] = ["fcall", "evalsha"];

/// What the bench's callers send besides script calls where its server µs are read: the body of a
/// parked event that its call did not carry (`Store::park_body`), which no script sends.
const CALLER_COMMANDS: [&str; 1] = ["psetex"];

fn budgeted_events(clients: usize) -> usize {
    scaled(60_000) / clients * clients
}

#[tokio::main]
async fn main() {
    // It flushes the server it measures: only ever a private one (./run bench starts it).
    let Ok(url) = std::env::var("DRIP_BENCH_REDIS_URL") else {
        eprintln!("set DRIP_BENCH_REDIS_URL to a private Redis this bench may FLUSHALL (./run bench does)");
        std::process::exit(2);
    };
    let client = redis::Client::open(url.as_str()).expect("DRIP_BENCH_REDIS_URL");
    // Pipelines of 500 script calls may take longer than the client's default response timeout.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut connection =
        client.get_multiplexed_async_connection_with_config(&config).await.expect("connecting to Redis");
    let store = RedisStore::new(connection.clone(), "bench");
    let version: String = redis::cmd("INFO").arg("server").query_async(&mut connection).await.expect("INFO");
    let version = version.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").to_owned();
    println!("Redis {version} at {url}, scale {}\n", scale());

    // A profile's workload: one configuration's lone events (or 16 of 16 keys, or 16 of one key,
    // per DRIP_BENCH_PROFILE_SHAPE), over and over, while `perf record` samples the server.
    if let Ok(which) = std::env::var("DRIP_BENCH_PROFILE") {
        profile(&mut connection, &store, which.parse().expect("a configuration's number")).await;
        return;
    }
    if std::env::var_os("DRIP_BENCH_FAIR_ONLY").is_some() {
        fair_table(&mut connection, &store).await;
        return;
    }
    if let (Some(_), Ok(urls)) = (std::env::var_os("DRIP_BENCH_CLUSTER_ONLY"), std::env::var("DRIP_BENCH_CLUSTER_URLS"))
    {
        if std::env::var_os("DRIP_BENCH_CONTRACT_WINDOWS").is_none() {
            cluster::cluster_table(&urls, &mut connection, &store).await;
        }
        contract::contract_table(&urls, &mut connection, &store).await;
        return;
    }
    if std::env::var_os("DRIP_BENCH_THROUGHPUT_ONLY").is_some() {
        throughput_table(&mut connection, &store).await;
        return;
    }
    let rows = script_table(&mut connection, &store).await;
    let bucket = rows[1].usec;
    println!("| script | server µs/call | vs the token bucket | calls/s (pipelined) |");
    println!("|---|---|---|---|");
    for row in &rows {
        let ratio = if row.name.starts_with("INCR") { String::new() } else { format!("{:.2}×", row.usec / bucket) };
        println!("| {} | {:.2} | {ratio} | {:.0} |", row.name, row.usec, row.per_second);
    }
    if std::env::var_os("DRIP_BENCH_SCRIPTS_ONLY").is_some() {
        return;
    }
    match redis_cell(&mut connection).await {
        Some((usec, per_second)) => println!(
            "| redis-cell `CL.THROTTLE` (a C-speed module; admission only, no schedule) | {usec:.2} | {:.2}× | {per_second:.0} |",
            usec / bucket
        ),
        None => println!("| redis-cell `CL.THROTTLE` | — | | skipped: the module could not be built or loaded here |"),
    }

    let (per_message, per_entity) = memory(&mut connection, &store).await;
    println!(
        "\nRedis memory: {per_message:.1} bytes per in-flight message, {per_entity:.0} bytes per entity (1 fixed limit)"
    );

    throughput_table(&mut connection, &store).await;

    let depths = backlog(&mut connection, &store).await;
    println!("\n| backlog ahead (one hot key) | reserve.lua µs/call | token bucket µs/call |\n|---|---|---|");
    for (depth, drip, bucket) in &depths {
        println!("| {depth} | {drip:.2} | {bucket:.2} |");
    }
    println!("\n| full 1 s windows ahead in a shared budget | reserve.lua µs/call for a new key |\n|---|---|");
    for (ahead, usec) in full_calendar(&mut connection, &store).await {
        println!("| {ahead} | {usec:.2} |");
    }
    fair_table(&mut connection, &store).await;
    if let Ok(urls) = std::env::var("DRIP_BENCH_CLUSTER_URLS") {
        if std::env::var_os("DRIP_BENCH_CONTRACT_WINDOWS").is_none() {
            cluster::cluster_table(&urls, &mut connection, &store).await;
        }
        contract::contract_table(&urls, &mut connection, &store).await;
    }
    // `cargo bench` runs in the crate's directory: the default is the workspace's target/.
    let out = std::env::var("DRIP_BENCH_OUT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/bench").into());
    std::fs::create_dir_all(&out).expect("the output directory");
    let path = format!("{out}/backlog.svg");
    match chart(&path, &depths) {
        Ok(()) => println!("\nchart: {path}"),
        Err(error) => println!("\nchart not written: {error}"),
    }
    let _: () = redis::cmd("FLUSHALL").query_async(&mut connection).await.expect("FLUSHALL");
}
