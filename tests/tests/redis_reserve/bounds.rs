//! What reserve.lua costs and holds: the worked example, every key expiring, work and state that
//! do not grow with the backlog, atomic under concurrent clients, and unchanged on a cluster.

use super::*;

/// 500 events at 12:00:01 under 100 per minute: 100 now, then 100 at the start of each next minute.
fn seed_scenario() -> Scenario {
    let events = (0..500)
        .map(|i| Arrival {
            entity: 8421,
            id: format!("pay_{i}"),
            cost: 1,
            now: T0 + SECOND,
            published: T0,
            redelivery: false,
            reslot: None,
            floor: None,
            class: 0,
            unclassed: false,
        })
        .collect();
    let limits = vec![Limit::new(100, MINUTE, Window::Fixed(Placement::Start)).unwrap()];
    Scenario {
        limits,
        max_delay: 120 * MINUTE,
        events,
        overrides: Vec::new(),
        edit: None,
        pauses: Vec::new(),
        shared: Default::default(),
    }
}

fn assert_seed_schedule(answers: &[Reservation]) {
    let mut per_slot: BTreeMap<Millis, usize> = BTreeMap::new();
    for answer in answers {
        assert_eq!(answer.status, Status::Reserved);
        *per_slot.entry(answer.slot).or_default() += 1;
    }
    let expected: BTreeMap<Millis, usize> =
        [T0 + SECOND, T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE, T0 + 4 * MINUTE]
            .into_iter()
            .map(|t| (t, 100))
            .collect();
    assert_eq!(per_slot, expected);
}

#[tokio::test]
async fn the_seed_example_through_redis() {
    let store = RedisStore::new(shared_connection().await, "drip");
    assert_seed_schedule(&run(&store, &unique("seed"), &seed_scenario(), &[]).await);
}

#[tokio::test]
async fn every_key_an_entity_writes_expires() {
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let rule = unique("ttl");
    let limits = [
        Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap(),
        Limit::new(3, 10 * SECOND, Window::Sliding).unwrap(),
        Limit::new(5, MINUTE, Window::Gcra { burst: 2 }).unwrap(),
    ];
    let mut entity_prefix = String::new();
    for i in 0..6 {
        let id = format!("m{i}");
        let request = SlotRequest::new(&rule, "k", ReserveRequest::new(&id, &limits, 0));
        store.reserve(&request).await.unwrap();
        entity_prefix = store.keys(&request).state.trim_end_matches("state").to_owned();
    }
    // Every key under the entity's prefix, not only those the store names: one it forgot would show.
    let keys: Vec<String> = connection.keys(format!("{entity_prefix}*")).await.unwrap();
    let answers: Vec<&String> = keys.iter().filter(|k| k.contains(":a:")).collect();
    assert_eq!(keys.len(), 2 + answers.len(), "state, sliding set and the answers' minute hashes: {keys:?}");
    let mut answered = 0;
    for key in &answers {
        answered += connection.hlen::<_, usize>(key).await.unwrap();
    }
    assert_eq!(answered, 6, "six answers, one field each");
    for key in keys {
        let ttl: i64 = connection.pttl(&key).await.unwrap();
        let bound = if key.contains(":a:") {
            drip_store::ANSWER_BUCKET + MINUTE + drip_store::ANSWER_MARGIN
        } else {
            MINUTE + 2 * (MINUTE + drip_store::STATE_MARGIN)
        };
        assert!(ttl > 0 && ttl <= bound, "{key} has PTTL {ttl}, expected 0 < ttl <= {bound}");
    }
}

/// Per-event work and per-key state must not grow with the backlog (docs/design.md: "Scheduling semantics"): the commands the
/// script runs and the fields it keeps are the same at a backlog of 10 and of 2,000.
#[tokio::test]
async fn work_and_state_do_not_grow_with_the_backlog() {
    let server = RedisServer::start(&[]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let store = RedisStore::new(connection.clone(), "drip");
    let limits = [
        Limit::new(1, SECOND, Window::Fixed(Placement::Start)).unwrap(),
        Limit::new(3, 5 * SECOND, Window::Sliding).unwrap(),
        Limit::new(2, SECOND, Window::Gcra { burst: 1 }).unwrap(),
    ];
    let max_delay = 30 * 24 * 60 * MINUTE;
    let mut commands_at = HashMap::new();
    let mut sizes_at = HashMap::new();
    for i in 0..2_000u32 {
        let id = format!("m{i}");
        let request =
            SlotRequest::new("r", "hot", ReserveRequest { max_delay, ..ReserveRequest::new(&id, &limits, T0) }).at(T0);
        // Commands are counted over 200 events at a backlog of 10 and of 1,800: the state's expiry
        // is refreshed only every so often, so single events may differ.
        if i == 10 || i == 1_800 {
            let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut connection).await.unwrap();
        }
        let reserved = store.reserve(&request).await.unwrap().reservation;
        let expected = T0 + (i64::from(i) / 3 * 5 + i64::from(i) % 3) * SECOND;
        assert_eq!(reserved.slot, expected, "three a second, then wait for the 5 s sliding window");
        if i == 209 || i == 1_999 {
            let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
            commands_at.insert(i, script_commands(&stats));
            let keys = store.keys(&request);
            let fields: usize = connection.hlen(&keys.state).await.unwrap();
            let sliding: usize = connection.zcard(&keys.sliding[0]).await.unwrap();
            sizes_at.insert(i, (fields, sliding));
        }
    }
    let (mut early, mut late) = (commands_at[&209].clone(), commands_at[&1_999].clone());
    assert!(!early.is_empty(), "commandstats should show the script's commands");
    let (early_expiries, late_expiries) = (early.remove("pexpire").unwrap_or(0), late.remove("pexpire").unwrap_or(0));
    assert_eq!(early, late);
    assert!(early_expiries.abs_diff(late_expiries) <= 1, "{early_expiries} vs {late_expiries} PEXPIREs");
    assert_eq!(sizes_at[&209], sizes_at[&1_999]);
    assert!(sizes_at[&1_999].1 <= 3, "sliding keeps at most `limit` entries: {:?}", sizes_at[&1_999]);
}

/// A shared budget whose calendar is full far ahead: the first search walks it once and records
/// the run of full windows; a new key's search after it does the same Redis work whether 1,000 or
/// 360,000 windows are full (and, at 360,000, takes milliseconds where the walk took seconds).
#[tokio::test]
async fn a_budget_full_far_ahead_costs_a_new_key_the_same_work_however_far() {
    let server = RedisServer::start(&[]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let store = RedisStore::new(connection.clone(), "drip");
    let limits = [Limit::new(1_000, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let mut work = Vec::new();
    for full in [1_000i64, 360_000] {
        let budget = Arc::new(Budget::named(
            format!("gateway{full}"),
            format!("gateway{full}"),
            vec![Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()],
        ));
        let key = drip_store::budget_key("drip", &budget);
        let budgets = [budget];
        let reserve = async |entity: String| {
            let event = ReserveRequest {
                max_delay: 5 * 24 * 60 * MINUTE,
                budgets: &budgets,
                ..ReserveRequest::new("m", &limits, T0)
            };
            let request =
                SlotRequest { tag: Some(budgets[0].tag.as_str()), ..SlotRequest::new("r", &entity, event).at(T0) };
            store.reserve(&request).await.unwrap().reservation
        };
        // The calendar fills 1,000 windows at a time (written here, as many tenants' events would
        // leave it), and after each a tenant's search walks the new ones and records them.
        let (mut filled, mut walk) = (0, std::time::Duration::ZERO);
        while filled < full {
            let windows: Vec<(String, u64)> = (filled..filled + 1_000)
                .map(|w| (drip_store::field::budget_window(SECOND, T0 + w * SECOND), 2))
                .collect();
            let _: () = connection.hset_multiple(&key, &windows).await.unwrap();
            filled += 1_000;
            let started = std::time::Instant::now();
            assert_eq!(reserve(format!("fill{filled}")).await.slot, T0 + filled * SECOND, "the first window with room");
            walk = walk.max(started.elapsed());
        }
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut connection).await.unwrap();
        let started = std::time::Instant::now();
        let next = reserve("new".into()).await;
        let jump = started.elapsed();
        assert_eq!((next.slot, next.status), (T0 + full * SECOND, Status::Reserved), "beside the last filler");
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
        eprintln!(
            "{full} full windows ahead: a search walking 1,000 new ones took at most {walk:?}, a new key's {jump:?}"
        );
        work.push(script_commands(&stats));
    }
    assert!(work[0].get("hget").is_some_and(|&calls| calls <= 2), "{:?}", work[0]);
    assert_eq!(work[0], work[1], "the same commands with 1,000 and 360,000 full windows ahead");
}

/// Many clients on separate connections reserve for a few hot keys at once, with redeliveries
/// racing their originals: no window is over its limit and each message id is reserved once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_never_overbook_and_reserve_each_message_once() {
    const CLIENTS: usize = 16;
    const PER_CLIENT: usize = 120;
    let rule = Arc::new(unique("concurrency"));
    let limits = Arc::new(vec![
        Limit::new(20, SECOND, Window::Fixed(Placement::Start)).unwrap(),
        Limit::new(60, 5 * SECOND, Window::Sliding).unwrap(),
    ]);
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (rule, limits) = (rule.clone(), limits.clone());
        tasks.push(tokio::spawn(async move {
            let store = RedisStore::new(shared_connection().await, "drip");
            let mut answers = Vec::new();
            for i in 0..PER_CLIENT {
                // Every third message is the next client's own: a redelivery racing the original.
                let owner = if i % 3 == 0 { (client + 1) % CLIENTS } else { client };
                let id = format!("c{owner}-{i}");
                let key = format!("merchant_{}", (owner + i) % 3);
                let request = SlotRequest::new(
                    &rule,
                    &key,
                    ReserveRequest { max_delay: 60 * MINUTE, ..ReserveRequest::new(&id, &limits, 0) },
                );
                answers.push((key.clone(), id.clone(), store.reserve(&request).await.expect("reserve").reservation));
            }
            answers
        }));
    }
    let mut by_id: HashMap<String, (String, Vec<Reservation>)> = HashMap::new();
    for task in tasks {
        for (key, id, answer) in task.await.unwrap() {
            by_id.entry(id).or_insert_with(|| (key, Vec::new())).1.push(answer);
        }
    }
    assert_eq!(by_id.len(), CLIENTS * PER_CLIENT, "every message id was sent");
    let mut ledgers: BTreeMap<String, Vec<(Millis, u64)>> = BTreeMap::new();
    for (id, (key, answers)) in &by_id {
        let fresh = answers.iter().filter(|a| !a.replayed()).count();
        assert_eq!(fresh, 1, "{id} was reserved {fresh} times: {answers:?}");
        assert!(answers.iter().all(|a| a.slot == answers[0].slot && a.status == Status::Reserved), "{id}: {answers:?}");
        ledgers.entry(key.clone()).or_default().push((answers[0].slot, 1));
    }
    let store = RedisStore::new(shared_connection().await, "drip");
    for (key, ledger) in &ledgers {
        check_limits(&limits, ledger).unwrap_or_else(|e| panic!("{key}: {e}"));
        let state = store.entity_state(RuleRef::plain(&rule), key, &limits).await.unwrap();
        let Some(&LimitState::Fixed { window, used }) = state.limits.get(&state_id(&limits[0])) else {
            panic!("{key}: no fixed-window state in {state:?}")
        };
        let usage = fixed_window_usage(ledger, SECOND);
        assert_eq!(used, usage[&window], "{key}: Redis counts what was handed out");
        assert_eq!(state.last_slot, ledger.iter().map(|&(s, _)| s).max());
    }
}

/// The same script on a local 3-master cluster: no CROSSSLOT error, and the answers of a single node.
#[tokio::test]
async fn reserve_lua_runs_unchanged_on_redis_cluster() {
    let cluster = RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let on_cluster = RedisStore::new(client.get_async_connection().await.unwrap(), "drip");
    let on_node = RedisStore::new(shared_connection().await, "drip");
    let mut scenarios = vec![seed_scenario()];
    let mut runner = TestRunner::deterministic();
    let strategy = scenario(Kinds::All, 60);
    for _ in 0..8 {
        let mut generated = strategy.new_tree(&mut runner).unwrap().current();
        for (i, event) in generated.events.iter_mut().enumerate() {
            event.entity += 10 * (i % 4); // more entities, so more hash slots
        }
        scenarios.push(generated);
    }
    for scenario in &scenarios {
        let rule = unique("cluster");
        let cluster_answers = run(&on_cluster, &rule, scenario, &[]).await;
        assert_eq!(cluster_answers, run(&on_node, &format!("{rule}-node"), scenario, &[]).await);
        check_schedule(scenario, &cluster_answers).unwrap();
    }
    assert_seed_schedule(&run(&on_cluster, &unique("cluster-seed"), &seed_scenario(), &[]).await);
    // Rules that draw from a budget: every entity lives on the budget's slot, so one script call
    // still touches one slot (no CROSSSLOT), and the cluster answers as one node does.
    let budgeted = scenario_with_budgets(60);
    for _ in 0..6 {
        let rule = unique("cluster-budget");
        let mut generated = budgeted.new_tree(&mut runner).unwrap().current();
        for (i, event) in generated.events.iter_mut().enumerate() {
            event.entity += 10 * (i % 4);
        }
        let generated = with_own_budgets(generated, &rule);
        let cluster_answers = run(&on_cluster, &rule, &generated, &[]).await;
        assert_eq!(cluster_answers, run(&on_node, &rule, &generated, &[]).await);
        check_budget_bounds(&generated, &cluster_answers).unwrap();
    }
    let masters_with_keys =
        cluster.nodes.iter().filter(|node| node.cli(&["DBSIZE"]).is_some_and(|n| n.trim() != "0")).count();
    assert!(masters_with_keys >= 2, "entities should land on more than one master");
}
