//! Leased budgets past one shard on real Redis: every window exact across a 3-master cluster,
//! every event of an overrun answered, what strands counted, and an adaptive level that binds
//! every partition from the signal on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use drip_core::budgets::{Adaptive, Budget, Leases, PPM};
use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::{ReserveRequest, Status};
use drip_core::time::{MINUTE, Millis, SECOND};
use drip_store::{RedisStore, Reserved, SlotRequest, Store};
use drip_tests::redis_server::{RedisCluster, shared_connection};
use drip_tests::scenario::T0;
use drip_tests::unique;

/// A burst of 3,000 events of 600 keys over one budget of 200 a second leased over 3 partitions,
/// reserved by 24 concurrent callers through group commit on a 3-master cluster: every event
/// reserved, no budget window over 200 (counted from the slots), each home leasing at most the
/// window's count and exactly what the pools hold, each pool booking within its leases, the
/// partitions on three different masters, and stranded capacity per full window within the bound
/// (at most a quarter of them: it depends on how the callers interleave). The same burst on an
/// unleased budget drains in as many windows, plus what stranding costs.
#[tokio::test]
async fn a_leased_budget_keeps_every_window_exact_across_a_cluster() {
    use drip_core::budgets::Leases;
    let cluster = RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let connection = client.get_async_connection().await.unwrap();
    let leased = Arc::new(LeasedUnits::default());
    let store = Arc::new(
        RedisStore::new(connection, "drip")
            .with_lease_observer(leased.clone())
            .with_batching(drip_store::Batching::new(16, true)),
    );
    let rule = unique("leased");
    let limit = Limit::new(200, SECOND, Window::Fixed(Placement::Start)).unwrap();
    let leases = Leases { partitions: 3, chunk: Leases::default_chunk(3) };
    let budget = Arc::new(Budget {
        leases: Some(leases),
        ..Budget::named(format!("{rule}-gateway"), format!("{rule}-gateway"), vec![limit])
    });
    let unleased =
        Arc::new(Budget { name: format!("{rule}-one"), tag: format!("{rule}-one"), leases: None, ..(*budget).clone() });
    let own = [Limit::new(50, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let (events, keys, callers) = (3_000usize, 600usize, 24usize);
    let burst = |budget: Arc<Budget>, rule: String| {
        let store = store.clone();
        async move {
            let answers = leased_burst(store, budget, &rule, (events, keys, callers), (&own, MINUTE)).await;
            let slots: Vec<(String, Millis, Millis)> = answers
                .into_iter()
                .map(|(key, reserved)| {
                    let reserved = reserved.expect("reserve");
                    assert_eq!(reserved.reservation.status, Status::Reserved, "{key}: {reserved:?}");
                    (key, reserved.reservation.slot, reserved.now)
                })
                .collect();
            slots
        }
    };
    let slots = burst(budget.clone(), rule.clone()).await;
    assert_eq!(slots.len(), events, "every event answered once");
    let start = slots.iter().map(|&(_, _, now)| now).min().unwrap();
    let mut per_window: BTreeMap<Millis, u64> = BTreeMap::new();
    for (_, slot, _) in &slots {
        *per_window.entry(slot - slot % SECOND).or_default() += 1;
    }
    let busiest = per_window.values().max().copied().unwrap_or(0);
    assert!(busiest <= 200, "a window holds {busiest} of 200: {per_window:?}");
    // What the home leased, and what each pool holds and booked of the windows it still keeps (a
    // pool drops the windows before now's when it books).
    let home = store.budget_state(&budget).await.unwrap();
    let mut pools = Vec::new();
    for partition in 0..3 {
        pools.push(store.pool_state(&budget, partition).await.unwrap());
    }
    for (&window, &booked) in &per_window {
        // The home drops the windows before now's when it leases.
        let Some(&leased) = home.windows.get(&(SECOND, window)) else { continue };
        assert!(leased <= 200, "window {window}: the home leased {leased} of 200");
        assert!(leased >= booked, "window {window}: {booked} booked on {leased} leased");
        let mut held = 0;
        for (partition, pool) in pools.iter().enumerate() {
            let Some(&pool_leased) = pool.leased.get(&(SECOND, window)) else { continue };
            let granted = home.granted.get(&(SECOND, window, partition as u32)).copied().unwrap_or(0);
            let used = pool.windows.get(&(SECOND, window)).copied().unwrap_or(0);
            assert_eq!(pool_leased, granted, "window {window}, partition {partition}: credited what was leased");
            assert!(used <= pool_leased, "window {window}, partition {partition}: booked {used} of {pool_leased}");
            held += used;
        }
        assert!(held <= booked, "window {window}: the pools booked {held}, the slots say {booked}");
    }
    // The observer heard of every unit leased: at least every one booked.
    let (grants, units) = (leased.grants.load(Ordering::Relaxed), leased.units.load(Ordering::Relaxed));
    assert!(grants > 0 && units >= events as u64, "{grants} leases of {units} units for {events} events");
    // Keys on every master: the partitions spread.
    for node in &cluster.nodes {
        assert!(node.cli(&["DBSIZE"]).is_some_and(|n| n.trim() != "0"), "a master without keys");
    }
    // Stranded capacity over the full windows (all but the first and the last) against the
    // burst's length: at most 5 % of them.
    let full: Vec<Millis> = per_window.keys().copied().collect();
    let full = &full[1..full.len() - 1];
    let stranded: u64 = full.iter().map(|w| 200 - per_window[w]).sum();
    let one = burst(unleased, format!("{rule}-one")).await;
    let windows = |slots: &[(String, Millis, Millis)]| {
        let last = slots.iter().map(|s| s.1).max().unwrap();
        (last - last % SECOND - (start - start % SECOND)) / SECOND + 1
    };
    eprintln!(
        "leased: {} windows, {stranded} units stranded in {} full windows; unleased: {} windows",
        windows(&slots),
        full.len(),
        windows(&one)
    );
    // What strands depends on how the callers interleave (docs/capacity.md measures it); a lease
    // per caller instead of per partition strands half of each window.
    assert!(stranded * 4 <= full.len() as u64 * 200, "stranded {stranded} of {}", full.len() * 200);
}

/// A burst that overruns a budget of 300 a second and 2,000 a minute leased over 3 partitions on a
/// 3-master cluster, by 256 concurrent callers through group commit over 600 keys: every event gets its slot however far
/// it walks (no call gives up for leases, which a loop bounded in rounds did under this load), and
/// no window of either limit holds more than its count.
#[tokio::test]
async fn a_leased_budget_of_two_limits_answers_every_event_of_an_overrun() {
    use drip_core::budgets::Leases;
    let (_cluster, store) = cluster_store(64).await;
    let rule = unique("overrun");
    let fixed = |count, per| Limit::new(count, per, Window::Fixed(Placement::Start)).unwrap();
    let budget = Arc::new(Budget {
        limits: vec![fixed(300, SECOND), fixed(2_000, MINUTE)],
        leases: Some(Leases { partitions: 3, chunk: Leases::default_chunk(3) }),
        ..Budget::named(format!("{rule}-contract"), format!("{rule}-contract"), Vec::new())
    });
    let own = [fixed(1_000_000, MINUTE)];
    let answers = leased_burst(store, budget, &rule, (12_000, 600, 256), (&own, 3_600_000)).await;
    let mut per_window: BTreeMap<(Millis, Millis), u64> = BTreeMap::new();
    for (key, reserved) in answers {
        let reservation = reserved.expect("every call answers").reservation;
        assert_eq!(reservation.status, Status::Reserved, "{key}: {reservation:?}");
        for per in [SECOND, MINUTE] {
            *per_window.entry((per, reservation.slot - reservation.slot % per)).or_default() += 1;
        }
    }
    for (&(per, window), &n) in &per_window {
        assert!(n <= if per == SECOND { 300 } else { 2_000 }, "window {window} of {per} ms holds {n}");
    }
    let minutes = per_window.keys().filter(|(per, _)| *per == MINUTE).count();
    assert!(minutes >= 6, "12,000 events over 2,000 a minute take at least six minutes: {minutes}");
}

/// `events` events of `keys` keys of `rule`, each drawing from `budget` with its own `limits` and
/// `max_delay`, reserved by `callers` concurrent callers at the server's clock: each key's answers.
async fn leased_burst<C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static>(
    store: Arc<RedisStore<C>>,
    budget: Arc<Budget>,
    rule: &str,
    (events, keys, callers): (usize, usize, usize),
    (limits, max_delay): (&[Limit], Millis),
) -> Vec<(String, Result<Reserved, drip_store::StoreError>)> {
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let (store, budget, rule, limits) = (store.clone(), budget.clone(), rule.to_owned(), limits.to_vec());
        tasks.push(tokio::spawn(async move {
            let budgets = [budget];
            let mut answers = Vec::new();
            for i in (caller..events).step_by(callers) {
                let (key, id) = (format!("user{}", i % keys), format!("m{i}"));
                let event = ReserveRequest { max_delay, budgets: &budgets, ..ReserveRequest::new(&id, &limits, 0) };
                let request = SlotRequest { tag: Some(&budgets[0].tag), ..SlotRequest::new(&rule, &key, event) };
                let reserved = store.reserve(&request).await;
                answers.push((key, reserved));
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    answers
}

/// Counts what a store's lease observer hears (the services count it as `drip_budget_leases`).
#[derive(Default)]
struct LeasedUnits {
    grants: AtomicU64,
    units: AtomicU64,
    returned: AtomicU64,
}

impl drip_store::LeaseObserver for LeasedUnits {
    fn leased(&self, _: &str, units: u64) {
        self.grants.fetch_add(1, Ordering::Relaxed);
        self.units.fetch_add(units, Ordering::Relaxed);
    }

    fn returned(&self, _: &str, units: u64) {
        self.returned.fetch_add(units, Ordering::Relaxed);
    }
}

/// A partition that leased a whole window and booked one unit of it strands the rest, and what
/// it was leased ahead and did not book: its pool counts it once the window has passed
/// (docs/rules.md, "A budget past one shard"), and the other partition, finding the window leased
/// out, takes the next.
#[tokio::test]
async fn a_pool_counts_what_it_stranded_once_the_window_passed() {
    use drip_core::budgets::Leases;
    let store = RedisStore::new(shared_connection().await, "drip");
    let rule = unique("stranded");
    let leases = Leases { partitions: 2, chunk: PPM };
    let limit = Limit::new(10, SECOND, Window::Fixed(Placement::Start)).unwrap();
    let budget = Arc::new(Budget {
        leases: Some(leases),
        ..Budget::named(format!("{rule}-b"), format!("{rule}-b"), vec![limit])
    });
    let budgets = [budget.clone()];
    let key_in = |p: u32| (0..).map(|i| format!("k{i}")).find(|k| leases.partition_of(k) == p).unwrap();
    let (p0, p1) = (key_in(0), key_in(1));
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let reserve = async |key: &str, id: &str, now: Millis| {
        let event = ReserveRequest { max_delay: MINUTE, budgets: &budgets, ..ReserveRequest::new(id, &limits, now) };
        let request = SlotRequest { tag: Some(&budget.tag), ..SlotRequest::new(&rule, key, event) }.at(now);
        store.reserve(&request).await.expect("reserve").reservation.slot
    };
    // It asks for a whole window (its chunk): all of the first, and its half of the term's next.
    assert_eq!(reserve(&p0, "m0", T0).await, T0, "p0 leases the whole window and books a unit");
    assert_eq!(reserve(&p1, "m1", T0).await, T0 + SECOND, "p1 finds it leased out: the next window");
    // Two windows later p0 books again, dropping the window it held 10 of and booked 1, and the
    // next, whose 5 it was leased ahead and did not book.
    assert_eq!(reserve(&p0, "m2", T0 + 2 * SECOND).await, T0 + 2 * SECOND);
    let pool = store.pool_state(&budget, 0).await.unwrap();
    assert_eq!(pool.stranded.get(&SECOND), Some(&14), "{pool:?}");
}

/// A caller whose pool's lease another caller is asking for waits for it rather than sending its
/// event to find the pool empty and stop there: while one caller's lease is on its way (slowed
/// here), no other reservation call goes to Redis; after it, the second event books from what the
/// first one's lease brought, with no lease of its own.
#[tokio::test]
async fn a_caller_waits_for_the_lease_another_is_asking_for_instead_of_stopping_at_the_empty_pool() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let lease_started = Arc::new(tokio::sync::Notify::new());
    let connection =
        SlowLeases { inner: shared_connection().await, log: log.clone(), lease_started: lease_started.clone() };
    let store = Arc::new(RedisStore::new(connection, "drip"));
    let rule = unique("gate");
    let limit = Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap();
    let budget = Arc::new(Budget {
        leases: Some(Leases { partitions: 2, chunk: PPM / 10 }),
        ..Budget::named(format!("{rule}-b"), format!("{rule}-b"), vec![limit])
    });
    let reserve = |id: &'static str| {
        let (store, budget, rule) = (store.clone(), budget.clone(), rule.clone());
        tokio::spawn(async move {
            let budgets = [budget.clone()];
            let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
            let event = ReserveRequest { max_delay: MINUTE, budgets: &budgets, ..ReserveRequest::new(id, &limits, T0) };
            let request = SlotRequest { tag: Some(&budget.tag), ..SlotRequest::new(&rule, "k", event) }.at(T0);
            store.reserve(&request).await.expect("reserve").reservation
        })
    };
    let first = reserve("m1");
    lease_started.notified().await;
    let second = reserve("m2");
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((first.status, first.slot), (Status::Reserved, T0), "{first:?}");
    assert_eq!((second.status, second.slot), (Status::Reserved, T0), "{second:?}");
    // (A first call of a library Redis does not hold yet fails and is sent again once loaded.)
    let log = log.lock().unwrap().clone();
    let leased: Vec<usize> = (0..log.len()).filter(|&i| log[i] == "leased").collect();
    assert_eq!(leased.len(), 1, "one lease, the first caller's: {log:?}");
    assert_eq!(log[leased[0] - 1], "lease", "nothing sent while the lease was on its way: {log:?}");
    assert_eq!(log[leased[0] + 1..], ["reserve", "reserve"], "{log:?}");
}

/// A real connection that logs its reservation and lease script calls in order and slows each
/// lease call down by 300 ms, telling `lease_started` when one starts.
#[derive(Clone)]
struct SlowLeases<C> {
    inner: C,
    log: Arc<std::sync::Mutex<Vec<&'static str>>>,
    lease_started: Arc<tokio::sync::Notify>,
}

impl<C: redis::aio::ConnectionLike + Send> redis::aio::ConnectionLike for SlowLeases<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        let packed = cmd.get_packed_command();
        let fcall = packed.windows(5).take(16).any(|w| w == b"FCALL");
        let has = |name: &[u8]| fcall && packed.windows(name.len()).any(|w| w == name);
        let log = |entry| self.log.lock().unwrap().push(entry);
        if has(b"drip_lease") {
            log("lease");
            self.lease_started.notify_one();
            return Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                let reply = self.inner.req_packed_command(cmd).await;
                self.log.lock().unwrap().push(if reply.is_ok() { "leased" } else { "failed" });
                reply
            });
        }
        if has(b"drip_reserve") {
            log("reserve");
        }
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// An adaptive budget of 200 a second leased over 3 partitions on a 3-master cluster: a burst
/// books ahead, a 429 halves the level, and a second burst (another rule's keys, the same budget)
/// books only where a window holds less than the lowered count, 100: the signal reached every
/// pool on its master and took back what it had leased and not booked. Without that, the pools'
/// leases of the windows ahead, granted at 200, would let the second burst fill them to 200.
#[tokio::test]
async fn a_lowered_level_binds_every_partition_of_a_leased_budget_from_the_signal_on() {
    let (_cluster, store) = cluster_store(16).await;
    let rule = unique("adaptive-leased");
    // A step of one ppm a quiet window: the level stays at half for the whole test.
    let adaptive = Adaptive { margin: 0, decrease: 500_000, min: 100_000, step: 1, latency: None };
    let budget = Arc::new(Budget {
        adaptive: Some(adaptive),
        leases: Some(Leases { partitions: 3, chunk: Leases::default_chunk(3) }),
        ..Budget::named(
            format!("{rule}-gateway"),
            format!("{rule}-gateway"),
            vec![Limit::new(200, SECOND, Window::Fixed(Placement::Start)).unwrap()],
        )
    });
    let own = [Limit::new(50, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let per_window = |answers: Vec<(String, Result<Reserved, drip_store::StoreError>)>| {
        let mut windows: BTreeMap<Millis, u64> = BTreeMap::new();
        for (key, reserved) in answers {
            let reservation = reserved.expect("reserve").reservation;
            assert_eq!(reservation.status, Status::Reserved, "{key}: {reservation:?}");
            *windows.entry(reservation.slot - reservation.slot % SECOND).or_default() += 1;
        }
        windows
    };
    let before = per_window(leased_burst(store.clone(), budget.clone(), &rule, (600, 300, 12), (&own, MINUTE)).await);
    assert_eq!(store.signal_budget(&budget).await.unwrap(), Some(500_000));
    let after_rule = format!("{rule}-after");
    let after =
        per_window(leased_burst(store.clone(), budget.clone(), &after_rule, (600, 300, 12), (&own, MINUTE)).await);
    for (&window, &n) in &after {
        let total = n + before.get(&window).copied().unwrap_or(0);
        assert!(total <= 100, "window {window} holds {total} after the signal: before {before:?}, after {after:?}");
    }
    for (window, n) in &before {
        assert!(*n <= 200, "window {window} holds {n} of 200");
    }
    assert!(after.len() >= 6, "600 events at 100 a second take six windows at least: {after:?}");
}

/// A local 3-master Redis Cluster (stopped when dropped) and a store on it, group-committing up
/// to `batch` events a call.
async fn cluster_store(batch: usize) -> (RedisCluster, Arc<RedisStore<redis::cluster_async::ClusterConnection>>) {
    let cluster = RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let connection = client.get_async_connection().await.unwrap();
    let store = RedisStore::new(connection, "drip").with_batching(drip_store::Batching::new(batch, true));
    (cluster, Arc::new(store))
}
