//! The contract table: a partner's 300 a second and 2,000 a minute overrun, leased over the
//! cluster's masters against one master unleased (`contract_table`), with its failed calls, stranded
//! units and extra delay against one exact calendar.

use super::cluster::{NodesCost, cluster_store, cpu_usec, on_nodes, one_budget_per_master, pools_booked};
use super::*;

/// A partner's contract of 300 a second and 2,000 a minute over 600 keys (3 rules × 200 keys), a
/// load of 12,000 events (scaled) that exceeds it: on one master unleased against leased over the
/// cluster's 3 masters, group-committed (≤ 64), 256 clients. Besides the CPU, what leasing costs
/// against one exact calendar: calls that failed, units stranded in full windows of each limit,
/// and how much later the leased slots lie than an exact calendar's (the i-th slot of each, sorted).
pub(super) async fn contract_table(
    urls: &str,
    connection: &mut MultiplexedConnection,
    store: &RedisStore<MultiplexedConnection>,
) {
    let namespace = format!("bench-contract-{}", wall_clock_millis());
    let (cluster, mut nodes) = cluster_store(urls, namespace, 64).await;
    let one = store.clone().with_batching(Batching::new(64, true));
    let events = scaled(12_000) / 256 * 256;
    println!(
        "\n| a 300/s + 2,000/min budget, 600 keys, {events} events, 256 clients, group commit ≤ 64 | reservations/s | CPU µs per event, busiest master (all) | one master's ÷ busiest | script calls per event | failed calls | stranded per full window (1 s / 1 min) | extra delay vs one exact calendar, p50 / p99 / max |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // A budget the private server kept from an earlier run would put this one's slots behind it.
    let _: () = redis::cmd("FLUSHALL").query_async(connection).await.expect("FLUSHALL");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(connection).await.expect("RESETSTAT");
    let before = cpu_usec(connection).await;
    let base = contract_run(&one, &contract_budget("contract-one", None), events, 256).await;
    let base_usec = (cpu_usec(connection).await - before) / events as f64;
    let (base_calls, _) = script_calls(connection).await;
    let exact = exact_slots(base.published, events);
    println!(
        "| one master, unleased | {:.0} | {base_usec:.2} | 1.00× | {:.3} | {} | — | {} |",
        base.per_second,
        base_calls as f64 / events as f64,
        base.failed,
        delays_against(&base.slots, &exact)
    );
    let budget = contract_budget("contract-leased", Some(3));
    let (leased, NodesCost { busiest, all, calls }) =
        on_nodes(&mut nodes, events as f64, contract_run(&cluster, &budget, events, 256)).await;
    let exact = exact_slots(leased.published, events);
    if std::env::var_os("DRIP_BENCH_CONTRACT_WINDOWS").is_some() {
        contract_windows(&cluster, &budget).await;
    }
    let strands = [SECOND, MINUTE].map(|per| contract_stranded(&cluster, &budget, per));
    let [second, minute] = strands;
    let (second, minute) = (second.await, minute.await);
    println!(
        "| 3-master cluster, leased over 3 | {:.0} | {busiest:.2} ({all:.2}) | {:.2}× | {calls:.3} | {} | {:.2} % over {} / {:.2} % over {} | {} |",
        leased.per_second,
        base_usec / busiest,
        leased.failed,
        second.0 * 100.0,
        second.1,
        minute.0 * 100.0,
        minute.1,
        delays_against(&leased.slots, &exact)
    );
    // A third of the contract and of the load on each master's own budget, at once: nothing
    // leased or shared, so what this machine shows when all three masters work (the ceiling for
    // the leased row here; see the cluster table's row of the same name).
    let third = |n: usize| {
        let fixed = |count, per| Limit::new(count, per, Window::Fixed(Placement::Start)).unwrap();
        let name = format!("contract-apart-{n}");
        Arc::new(Budget {
            limits: vec![fixed(100, SECOND), fixed(667, MINUTE)],
            ..(*gateway_of(&name, None, 100)).clone()
        })
    };
    let budgets = one_budget_per_master(&mut nodes, third).await;
    let runs = async {
        let started = Instant::now();
        let runs =
            budgets.iter().map(|budget| contract_run(&cluster, budget, events / budgets.len(), 256 / budgets.len()));
        let failed: usize = futures_util::future::join_all(runs).await.iter().map(|run| run.failed).sum();
        (failed, events as f64 / started.elapsed().as_secs_f64())
    };
    let ((failed, per_second), NodesCost { busiest, all, calls }) = on_nodes(&mut nodes, events as f64, runs).await;
    println!(
        "| 3-master cluster, a third of the contract and of the load on each master's own budget (the ceiling here) | {per_second:.0} | {busiest:.2} ({all:.2}) | {:.2}× | {calls:.3} | {failed} | — | — |",
        base_usec / busiest,
    );
}

/// Window by window (`DRIP_BENCH_CONTRACT_WINDOWS`): each partition's booked / leased (less what
/// it gave back) of every 1 s window of the last two minutes booked, and of each minute.
async fn contract_windows<C>(store: &RedisStore<C>, budget: &Budget)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut pools = Vec::new();
    for partition in 0..budget.leases.map_or(0, |l| l.partitions) {
        pools.push(store.pool_state(budget, partition).await.expect("pool"));
    }
    let last = pools.iter().flat_map(|p| p.windows.keys()).filter(|(per, _)| *per == MINUTE).map(|&(_, w)| w).max();
    let Some(last) = last else { return };
    for minute in [last - MINUTE, last] {
        let row = |per: Millis, window: Millis| {
            let cells: Vec<String> = pools
                .iter()
                .map(|p| format!("{}/{}", p.windows.get(&(per, window)).unwrap_or(&0), p.pool_holds(per, window)))
                .collect();
            format!("{:>6} {:>6} | {}", per, (window - minute) / SECOND, cells.join("  "))
        };
        println!("minute {minute}: {}", row(MINUTE, minute));
        for second in 0..60 {
            let window = minute + second * SECOND;
            if pools.iter().any(|p| p.windows.contains_key(&(SECOND, window)) || p.pool_holds(SECOND, window) > 0) {
                println!("{}", row(SECOND, window));
            }
        }
    }
}

fn contract_budget(name: &str, partitions: Option<u32>) -> Arc<Budget> {
    let fixed = |count, per| Limit::new(count, per, Window::Fixed(Placement::Start)).unwrap();
    Arc::new(Budget {
        limits: vec![fixed(300, SECOND), fixed(2_000, MINUTE)],
        ..(*gateway_of(name, partitions, 300)).clone()
    })
}

struct ContractRun {
    per_second: f64,
    failed: usize,
    published: Millis,
    slots: Vec<Millis>,
}

async fn contract_run<C>(store: &RedisStore<C>, budget: &Arc<Budget>, events: usize, clients: usize) -> ContractRun
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let limits = [Limit::new(1_000_000_000, MINUTE, Window::Fixed(Placement::Start)).unwrap()];
    let published = wall_clock_millis();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, budgets) = (store.clone(), [budget.clone()]);
        tasks.push(tokio::spawn(async move {
            let (mut slots, mut failed) = (Vec::new(), 0);
            for i in 0..events / clients {
                let n = c * 7_919 + i;
                let rule = format!("{}-rule-{}", budgets[0].name, n % 3);
                let (key, id) = (format!("user_{}", n % 200), format!("{}-{c}-{i}", budgets[0].name));
                let request = request(&rule, &key, &id, (&limits, &budgets), published);
                let event = ReserveRequest { max_delay: DAY, ..request.event };
                match store.reserve(&SlotRequest { event, ..request }).await {
                    Ok(reserved) => slots.push(reserved.reservation.slot),
                    Err(_) => failed += 1,
                }
            }
            (slots, failed)
        }));
    }
    let (mut slots, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (s, f) = task.await.expect("client");
        slots.extend(s);
        failed += f;
    }
    slots.sort_unstable();
    ContractRun { per_second: events as f64 / started.elapsed().as_secs_f64(), failed, published, slots }
}

/// The slots one exact calendar of 300 a second and 2,000 a minute gives `events` events that all
/// arrive at `now`, in order.
fn exact_slots(now: Millis, events: usize) -> Vec<Millis> {
    let mut slots = Vec::with_capacity(events);
    let (mut second, mut minute) = (now.div_euclid(SECOND) * SECOND, now.div_euclid(MINUTE) * MINUTE);
    let (mut in_second, mut in_minute) = (0, 0);
    while slots.len() < events {
        if in_minute == 2_000 {
            minute += MINUTE;
            second = minute;
            (in_second, in_minute) = (0, 0);
        } else if in_second == 300 {
            second += SECOND;
            in_second = 0;
            if second >= minute + MINUTE {
                minute += MINUTE;
                in_minute = 0;
            }
        } else {
            slots.push(second.max(now));
            in_second += 1;
            in_minute += 1;
        }
    }
    slots
}

/// How much later each sorted slot lies than the same place in `exact`: p50 / p99 / max.
fn delays_against(slots: &[Millis], exact: &[Millis]) -> String {
    let mut extra: Vec<Millis> = slots.iter().zip(exact).map(|(s, e)| (s - e).max(0)).collect();
    extra.sort_unstable();
    let at = |q: f64| extra.get(((extra.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0);
    format!("{} / {} / {} ms", at(0.5), at(0.99), at(1.0))
}

/// A leased budget's stranded units in the windows of the limit of period `per` that an exact
/// calendar would have filled: all but the last its partitions booked, and of the 1 s windows
/// only those whose minute had room left (the others stay empty under one calendar too). Returns
/// the share of their count left unbooked, and how many windows that counts.
async fn contract_stranded<C>(store: &RedisStore<C>, budget: &Budget, per: Millis) -> (f64, usize)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let count = |per: Millis| budget.limits.iter().find(|l| l.per() == per).map_or(0, |l| l.limit());
    let used = pools_booked(store, budget).await;
    let booked = |per: Millis, window: Millis| used.get(&(per, window)).copied().unwrap_or(0);
    let windows: Vec<Millis> = used.keys().filter(|(p, _)| *p == per).map(|&(_, w)| w).collect();
    let counted: Vec<Millis> = windows[..windows.len().saturating_sub(1)]
        .iter()
        .copied()
        .filter(|&w| per == MINUTE || booked(MINUTE, w.div_euclid(MINUTE) * MINUTE) < count(MINUTE))
        .collect();
    let left: u64 = counted.iter().map(|&w| count(per).saturating_sub(booked(per, w))).sum();
    (left as f64 / (count(per) * counted.len().max(1) as u64) as f64, counted.len())
}
