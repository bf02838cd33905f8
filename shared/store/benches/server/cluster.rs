//! The cluster tables: a budgeted rule on one master against leased over a private 3-master
//! cluster's masters (`cluster_table`), and the helpers the contract table shares: each node's
//! CPU and script calls, and what a leased budget's partitions booked and stranded.

use super::*;

/// Each node's `(script calls, server µs)` since its last RESETSTAT, reset again.
async fn script_calls_by_node(nodes: &mut [MultiplexedConnection]) -> Vec<(u64, u64)> {
    let mut stats = Vec::new();
    for node in nodes {
        stats.push(script_calls(node).await);
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(node).await.expect("RESETSTAT");
    }
    stats
}

/// A server's CPU time so far (`INFO cpu`: its user and system seconds), in µs. Unlike a command's
/// µs in `commandstats` (wall time), it does not grow while the process waits for a core: with
/// three masters on two cores, that wait is most of a command's wall time.
pub(super) async fn cpu_usec(node: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(node).await.expect("INFO cpu");
    let field = |name: &str| {
        info.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))).and_then(|v| v.trim().parse::<f64>().ok())
    };
    (field("used_cpu_user").unwrap_or(0.0) + field("used_cpu_sys").unwrap_or(0.0)) * 1e6
}

async fn cpu_by_node(nodes: &mut [MultiplexedConnection]) -> Vec<f64> {
    let mut cpu = Vec::new();
    for node in nodes {
        cpu.push(cpu_usec(node).await);
    }
    cpu
}

/// What a run cost the nodes, over its `events`: the busiest node's CPU µs per event, all
/// nodes' together, and script calls per event.
pub(super) struct NodesCost {
    pub(super) busiest: f64,
    pub(super) all: f64,
    pub(super) calls: f64,
}

/// `run`'s output and what it cost the nodes (their calls counted from a reset just before it).
pub(super) async fn on_nodes<T>(
    nodes: &mut [MultiplexedConnection],
    events: f64,
    run: impl std::future::Future<Output = T>,
) -> (T, NodesCost) {
    script_calls_by_node(nodes).await;
    let before = cpu_by_node(nodes).await;
    let output = run.await;
    let calls: u64 = script_calls_by_node(nodes).await.iter().map(|&(calls, _)| calls).sum();
    let used: Vec<f64> = cpu_by_node(nodes).await.iter().zip(&before).map(|(a, b)| (a - b) / events).collect();
    let busiest = used.iter().copied().fold(0.0, f64::max);
    (output, NodesCost { busiest, all: used.iter().sum(), calls: calls as f64 / events })
}

/// A leased budget's stranded units over its full windows (all but the first and the last its
/// partitions booked in: windows leased ahead past the last booking strand nothing anybody
/// wanted), as a share of those windows' count.
async fn stranded<C>(store: &RedisStore<C>, budget: &Budget) -> (f64, usize)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let home = store.budget_state(budget).await.expect("home");
    let used: std::collections::BTreeMap<Millis, u64> =
        pools_booked(store, budget).await.into_iter().map(|((_, window), n)| (window, n)).collect();
    let booked = |w: &Millis| used.get(w).is_some_and(|&n| n > 0);
    let windows: Vec<Millis> = home.windows.keys().map(|&(_, w)| w).filter(booked).collect();
    let (first, last) = (windows.first().copied().unwrap_or(0), windows.last().copied().unwrap_or(0));
    let windows: Vec<Millis> = home.windows.keys().map(|&(_, w)| w).filter(|w| (first..=last).contains(w)).collect();
    let full = windows.get(1..windows.len().saturating_sub(1)).unwrap_or_default();
    let left: u64 = full.iter().map(|w| GATEWAY - used.get(w).copied().unwrap_or(0)).sum();
    (left as f64 / (GATEWAY * full.len().max(1) as u64) as f64, full.len())
}

/// What a leased budget's partitions booked in all, by (per, window).
pub(super) async fn pools_booked<C>(
    store: &RedisStore<C>,
    budget: &Budget,
) -> std::collections::BTreeMap<(Millis, Millis), u64>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut used = std::collections::BTreeMap::new();
    for partition in 0..budget.leases.map_or(0, |l| l.partitions) {
        for (&window, &n) in &store.pool_state(budget, partition).await.expect("pool").windows {
            *used.entry(window).or_default() += n;
        }
    }
    used
}

/// The cluster rows: a budgeted rule on one master against leased over the cluster's masters, a
/// call each and group-committed. Measured rates share this machine's cores among every master
/// and the clients; the busiest master's server time per event is what bounds a cluster whose
/// masters each have their own.
pub(super) async fn cluster_table(
    urls: &str,
    connection: &mut MultiplexedConnection,
    store: &RedisStore<MultiplexedConnection>,
) {
    for max_batch in [1, 64] {
        cluster_rows(urls, max_batch, connection, store).await;
    }
    println!(
        "(cores: {}; the masters, the bench and its clients share them)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}

/// A store on the cluster at `urls` (comma-separated) under `namespace`, group-committing up to
/// `max_batch` events a call, and a connection to each of its nodes (for their CPU and calls).
pub(super) async fn cluster_store(
    urls: &str,
    namespace: String,
    max_batch: usize,
) -> (RedisStore<redis::cluster_async::ClusterConnection>, Vec<MultiplexedConnection>) {
    let urls: Vec<&str> = urls.split(',').collect();
    let client = redis::cluster::ClusterClient::new(urls.clone()).expect("DRIP_BENCH_CLUSTER_URLS");
    let cluster = RedisStore::new(client.get_async_connection().await.expect("the cluster"), namespace)
        .with_batching(Batching::new(max_batch, true));
    let mut nodes = Vec::new();
    for url in &urls {
        let node = redis::Client::open(*url).expect("a node");
        nodes.push(node.get_multiplexed_async_connection().await.expect("a node"));
    }
    (cluster, nodes)
}

/// One table of [`cluster_table`], each call carrying up to `max_batch` events.
async fn cluster_rows(
    urls: &str,
    max_batch: usize,
    connection: &mut MultiplexedConnection,
    store: &RedisStore<MultiplexedConnection>,
) {
    // The cluster is not flushed between runs: each run's keys are its own.
    let namespace = format!("bench-cluster-{}-{max_batch}", wall_clock_millis());
    let (cluster, mut nodes) = cluster_store(urls, namespace, max_batch).await;
    let one = store.clone().with_batching(Batching::new(max_batch, true));
    let clients = 256;
    let events = budgeted_events(clients) as f64;
    let calling = if max_batch == 1 { "a call each".to_owned() } else { format!("group commit ≤ {max_batch}") };
    println!(
        "\n| a rule drawing from a {GATEWAY}/s budget, {clients} clients, {calling} | reservations/s | vs one master | busiest master's CPU µs per event (all masters') | vs one master (bound with a core per master) | script calls per event | stranded per full window |"
    );
    println!("|---|---|---|---|---|---|---|");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(connection).await.expect("RESETSTAT");
    let cpu_before = cpu_usec(connection).await;
    let base =
        budgeted_throughput(&one, &gateway(&format!("one-master-{max_batch}"), None), clients, (false, false)).await;
    let (calls, _) = script_calls(connection).await;
    let base_usec = (cpu_usec(connection).await - cpu_before) / events;
    println!(
        "| one master, the budget on one slot | {base:.0} | 1.00× | {base_usec:.2} | 1.00× | {:.3} | — |",
        calls as f64 / events
    );
    let rows = [
        ("the budget on one slot", None, false),
        ("leased over 3, uniform keys", Some(3), false),
        ("leased over 3, skewed keys", Some(3), true),
    ];
    for (name, partitions, skewed) in rows {
        let budget = gateway(&format!("cluster-{}", name.replace([' ', ','], "-")), partitions);
        let (rate, NodesCost { busiest, all, calls }) =
            on_nodes(&mut nodes, events, budgeted_throughput(&cluster, &budget, clients, (skewed, false))).await;
        let stranded = match partitions {
            Some(_) => {
                let (share, windows) = stranded(&cluster, &budget).await;
                format!("{:.2} % over {windows} windows", share * 100.0)
            }
            None => "—".into(),
        };
        println!(
            "| 3-master cluster, {name} | {rate:.0} | {:.2}× | {busiest:.2} (all: {all:.2}) | {:.2}× | {calls:.3} | {stranded} |",
            rate / base,
            base_usec / busiest,
        );
    }
    // The same load as three budgets on one slot each, a slot on each master, at once: no leases,
    // nothing shared between the masters. What this machine lets any split of the load show when
    // every master is busy at once (its masters share two cores, and a command's CPU time grows
    // when they all run): the ceiling for the leased rows' figure here.
    let apart = |n: usize| gateway_of(&format!("cluster-apart-{max_batch}-{n}"), None, GATEWAY / 3);
    let budgets = one_budget_per_master(&mut nodes, apart).await;
    let each = clients / budgets.len();
    let events = (budgets.len() * budgeted_events(each)) as f64;
    let runs = async {
        let started = Instant::now();
        futures_util::future::join_all(
            budgets.iter().map(|budget| budgeted_throughput(&cluster, budget, each, (false, false))),
        )
        .await;
        events / started.elapsed().as_secs_f64()
    };
    let (rate, NodesCost { busiest, all, calls }) = on_nodes(&mut nodes, events, runs).await;
    println!(
        "| 3-master cluster, a third of the load on each master's own budget (the ceiling here) | {rate:.0} | {:.2}× | {busiest:.2} (all: {all:.2}) | {:.2}× | {calls:.3} | — |",
        rate / base,
        base_usec / busiest,
    );
}

/// A budget on one slot of each node, the first of `budget(0)`, `budget(1)`, … whose hash tag
/// falls on it (the node answers a key of the tag itself, not with MOVED).
pub(super) async fn one_budget_per_master(
    nodes: &mut [MultiplexedConnection],
    budget: impl Fn(usize) -> Arc<Budget>,
) -> Vec<Arc<Budget>> {
    let mut budgets: Vec<Option<Arc<Budget>>> = vec![None; nodes.len()];
    let mut n = 0;
    while budgets.iter().any(Option::is_none) {
        let candidate = budget(n);
        for (at, node) in nodes.iter_mut().enumerate() {
            let owned: redis::RedisResult<i64> =
                redis::cmd("EXISTS").arg(format!("{{b:{}}}", candidate.tag)).query_async(node).await;
            if owned.is_ok() && budgets[at].is_none() {
                budgets[at] = Some(candidate.clone());
            }
        }
        n += 1;
    }
    budgets.into_iter().flatten().collect()
}
