//! `lua/reserve.lua` on a real Redis: identical to the reference model, atomic under concurrent
//! clients, bounded state whatever the backlog, and unchanged on a 3-master Redis Cluster.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use drip_core::budgets::{Adaptive, Budget, FairRing, LatencyControl, LatencyReport, PPM};
use drip_core::fair::Member;
use drip_core::ledger::fixed_window_usage;
use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::{
    Attempt, Correction, LimitState, OldSlot, Reservation, ReserveRequest, Status, Unpark, state_id,
};
use drip_core::time::{MINUTE, Millis, SECOND};
use drip_store::args::ReservePaths;
use drip_store::{Clock, MemoryStore, RedisStore, Reserved, RuleRef, SlotRequest, Store};
use drip_tests::redis_server::{RedisCluster, RedisServer, shared_connection};
use drip_tests::scenario::{
    Arrival, Kinds, Scenario, T0, check_budget_bounds, check_class_bounds, check_corrected_bounds,
    check_delivery_bounds, check_edit_bounds, check_limits, check_overridden_bounds, check_pause_bounds,
    check_schedule, corrected_events, plain_rule, rule_with, scenario, scenario_with_an_edit, scenario_with_budgets,
    scenario_with_classes, scenario_with_corrections, scenario_with_fair_budgets, scenario_with_fair_classes,
    scenario_with_fair_leased_budgets, scenario_with_leased_parking, scenario_with_leases, scenario_with_margin,
    scenario_with_overrides, scenario_with_parked_classes, scenario_with_parking, scenario_with_pauses,
};
use drip_tests::unique;
use proptest::arbitrary::any;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use redis::AsyncCommands;

/// Every attempt takes a lease; a third of them complete, a third release (a failed attempt) and a
/// third neither (a crashed one), so the model and the Lua must agree on `busy` as well. `batches`:
/// the events each script call carries (every event alone when empty); the model reserves them one
/// after another, which is what a batch means. Completions and releases follow each call.
async fn run(store: &impl Differential, rule: &str, scenario: &Scenario, batches: &[Range<usize>]) -> Vec<Reservation> {
    run_all(store, rule, scenario, batches).await.answers
}

/// How many drained events left their queue with nothing reserved, with a slot, and how many
/// events parked, over every run of a test (its process's): a parking test sees each happen.
static PARKING_SEEN: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// What a run gave: each event's answer, what each cost correction did, and what each drain of a
/// key's parked messages did (its wake, then each unpark), in order.
#[derive(Debug, PartialEq)]
struct Run {
    answers: Vec<Reservation>,
    corrections: Vec<Correction>,
    drains: Vec<(Option<Millis>, Vec<Unpark>)>,
    /// A fair budget's ring ops, in order: each park's join and wake, each drain's ring, leave
    /// and end.
    rings: Vec<String>,
}

/// The same, with what each of the scenario's cost corrections did, in order.
/// The scenario's entity of an entity key (`entity_<n>`, or a class's `entity_<n>#c<class>`).
fn entity_of(key: &str) -> usize {
    let key = drip_core::rules::Classes::split(key).map_or(key, |(scope, _)| scope);
    key.trim_start_matches("entity_").parse().expect("an entity key")
}

async fn run_all(store: &impl Differential, rule_name: &str, scenario: &Scenario, batches: &[Range<usize>]) -> Run {
    let rule = rule_name;
    let alone: Vec<Range<usize>> = (0..scenario.events.len()).map(|i| i..i + 1).collect();
    let rules: Vec<String> = scenario.events.iter().map(|a| scenario.rule_of(rule, a.entity)).collect();
    let (mut answers, mut corrections, mut drains, mut rings) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let fair = scenario.shared.budgets.first().filter(|b| b.fair.is_some());
    // Each entity's parked events (by index), oldest first, as the answers said: by its key, or a
    // class's entity `<key>#c<class>` (each class parks in its own queue).
    let mut parked: HashMap<String, std::collections::VecDeque<usize>> = HashMap::new();
    for batch in if batches.is_empty() { &alone } else { batches } {
        let (i, arrival) = (batch.start, &scenario.events[batch.start]);
        for &(_, of, actual) in scenario.shared.corrections.iter().filter(|c| c.0 == i) {
            let key = scenario.entity_key(&scenario.events[of]);
            let request = SlotRequest { reslot: None, ..request_of(scenario, &rules[of], &key, of) }.at(arrival.now);
            corrections.push(store.correct_cost(&request, actual).await.expect("correct_cost"));
        }
        store.clock().set(arrival.now);
        for op in scenario.overrides.iter().filter(|op| op.before_event == i) {
            let (rule, limit) = (scenario.rule(&scenario.rule_of(rule, op.entity)), &scenario.limits[op.limit]);
            store.change_override(&rule, &op.key(), limit, op.set, "test".into()).await.expect("override");
        }
        for &(_, entity, until) in scenario.pauses.iter().filter(|p| p.0 == i) {
            let rule = scenario.rule(&scenario.rule_of(rule, entity));
            store.pause(&rule, &calendar_key(scenario, entity), until).await.expect("pause");
        }
        for &(_, entity) in scenario.shared.signals.iter().filter(|s| s.0 == i) {
            match entity {
                Some(entity) => {
                    let rule = scenario.rule(&scenario.rule_of(rule, entity));
                    store.signal(&rule, &calendar_key(scenario, entity)).await.expect("signal");
                }
                None => _ = store.signal_budget(&scenario.shared.budgets[0]).await.expect("signal"),
            }
        }
        for &(_, budget, until) in scenario.shared.budget_pauses.iter().filter(|p| p.0 == i) {
            store.pause_budget(&scenario.shared.budgets[budget], until).await.expect("pause");
        }
        for &(_, entity, ahead) in scenario.shared.drains.iter().filter(|d| d.0 == i) {
            let key = format!("entity_{entity}");
            let rule = scenario.rule(&scenario.rule_of(rule, entity));
            if let Some(budget) = fair {
                let wake = store.arm_wake(&rule, &key, arrival.now + ahead / 2).await.expect("arm_wake");
                // A fair budget's drain hands a ring's heads over in one call, as the dispatcher
                // does: the queues of every key waiting in this key's ring (its partition's, when
                // leased), round robin from this key; what follows a head that stays answers
                // NotHead, and a head that stays holds its pool's units for the heads after it.
                let ring = FairRing::of_key(budget, &key).partition;
                let mut keys: Vec<String> = parked
                    .iter()
                    .filter(|(k, q)| **k != key && !q.is_empty())
                    .map(|(k, _)| k.clone())
                    .filter(|k| FairRing::of_key(budget, k).partition == ring)
                    .collect();
                keys.sort_unstable();
                keys.insert(0, key.clone());
                let depth = keys.iter().map(|k| parked.get(k).map_or(0, |q| q.len())).max().unwrap_or(0);
                let plan: Vec<(&String, usize)> = (0..depth)
                    .flat_map(|d| keys.iter().map(move |k| (k, d)))
                    .filter_map(|(k, d)| Some((k, *parked.get(k)?.get(d)?)))
                    .collect();
                let requests: Vec<SlotRequest> = plan
                    .iter()
                    .map(|&(k, j)| {
                        let request = drain_request_of(scenario, &rules[j], k, j, i);
                        SlotRequest { unpark: Some(arrival.now + ahead), reslot: None, ..request }.at(arrival.now)
                    })
                    .collect();
                let results = store.unpark_all(&requests).await.expect("unpark_all");
                let mut unparked = Vec::new();
                for (&(k, j), (unpark, _)) in plan.iter().zip(results) {
                    unparked.push(unpark);
                    let queue = parked.get_mut(k).expect("planned from a queue");
                    if let (Unpark::Decided(decided), Some(&head)) = (unpark, queue.front()) {
                        assert_eq!(head, j, "a drain books a key's queue in order");
                        answers[head] = decided;
                        PARKING_SEEN[usize::from(decided.status == Status::Reserved)].fetch_add(1, Ordering::Relaxed);
                        queue.pop_front();
                    }
                }
                drains.push((wake, unparked));
                let fair = FairRing::of_key(budget, &key);
                let ring = store.fair_ring(fair).await.expect("fair_ring");
                // Each key it drained leaves, unless messages of it are still parked.
                let mut left = Vec::new();
                for k in &keys {
                    let of = scenario.rule(&scenario.rule_of(rule_name, entity_of(k)));
                    let member = Member { rule: of.id.clone(), key: k.clone() };
                    left.push(store.fair_leave(fair, Some(&of), &member).await.expect("fair_leave"));
                }
                let turned = store.fair_turned(fair, ring.cursor + 1, None).await.expect("fair_turned");
                rings.push(format!("drain {entity}: {ring:?}, left {left:?}, wake {turned:?}"));
                continue;
            }
            // A key's own drain; with classes, each class's (and the key's, for what it parked
            // before the rule had classes), one after another.
            let classes = if scenario.shared.classes.is_some() { 0..3 } else { 0..0 };
            let keys = std::iter::once(key.clone()).chain(classes.map(|c| format!("{key}#c{c}")));
            for key in keys {
                let wake = store.arm_wake(&rule, &key, arrival.now + ahead / 2).await.expect("arm_wake");
                let mut unparked = Vec::new();
                let queue = parked.entry(key.clone()).or_default();
                while let Some(&head) = queue.front() {
                    let request = SlotRequest {
                        unpark: Some(arrival.now + ahead),
                        reslot: None,
                        ..drain_request_of(scenario, &rules[head], &key, head, i)
                    }
                    .at(arrival.now);
                    let (unpark, _) = store.unpark(&request).await.expect("unpark");
                    unparked.push(unpark);
                    let Unpark::Decided(decided) = unpark else { break };
                    // What the event holds now is its drained answer: the checks count its slot.
                    answers[head] = decided;
                    PARKING_SEEN[usize::from(decided.status == Status::Reserved)].fetch_add(1, Ordering::Relaxed);
                    queue.pop_front();
                }
                drains.push((wake, unparked));
            }
        }
        let keys: Vec<String> = scenario.events[batch.clone()].iter().map(|a| scenario.entity_key(a)).collect();
        let requests: Vec<SlotRequest> =
            batch.clone().zip(&keys).map(|(j, key)| request_of(scenario, &rules[j], key, j)).collect();
        let reserved = store.reserve_all(&requests).await;
        let mut parked_now = std::collections::BTreeSet::new();
        for ((j, reserved), request) in batch.clone().zip(&reserved).zip(&requests) {
            let r = reserved.reservation;
            assert_eq!(
                reserved.body_kept(request),
                r.status == Status::Parked && r.attempt == Attempt::Decided && request.parked_body.is_some()
            );
            if r.status == Status::Parked && r.attempt == Attempt::Decided {
                parked_now.insert(keys[j - batch.start].clone());
                parked.entry(keys[j - batch.start].clone()).or_default().push_back(j);
                PARKING_SEEN[2].fetch_add(1, Ordering::Relaxed);
                if let Some(budget) = fair {
                    // It joined the budget's ring, and armed its drain unless it was, in the call.
                    let wake = reserved.armed.then(|| reserved.ring_wake(budget.near().unwrap()));
                    rings.push(format!("park {j}: wake {wake:?}"));
                }
            }
        }
        // Each message parked in its call kept the body the call carried, where the key's drain
        // reads it, behind those parked before it (whose bodies the drains have not taken).
        for key in parked_now {
            let rule = scenario.rule(&scenario.rule_of(rule_name, entity_of(&key)));
            let queue = &parked[&key];
            let bodies = store.parked_bodies(&rule, &key, queue.len()).await.expect("parked_bodies");
            let carried: Vec<Option<Vec<u8>>> =
                queue.iter().map(|&j| parked_body_of(&scenario.events[j]).map(<[u8]>::to_vec)).collect();
            assert_eq!(bodies, carried, "the parked bodies of {key}");
        }
        for (request, reserved) in requests.iter().zip(reserved) {
            match answers.len() % 3 {
                0 => store.complete(request, &reserved).await.expect("complete"),
                1 => store.release(request, &reserved).await.expect("release"),
                _ => {}
            }
            answers.push(reserved.reservation);
        }
    }
    Run { answers, corrections, drains, rings }
}

/// The request of the event at `j` of `scenario`, at its arrival.
fn request_of<'a>(scenario: &'a Scenario, rule: &'a str, key: &'a str, j: usize) -> SlotRequest<'a> {
    const LEASE: Millis = 1_500;
    let arrival = &scenario.events[j];
    let event = ReserveRequest {
        cost: arrival.cost,
        max_delay: scenario.max_delay,
        lease: LEASE,
        park: scenario.shared.park,
        published: Some(arrival.published),
        floor: arrival.floor,
        budgets: match &scenario.shared.budgeted[..] {
            spans if !spans.is_empty() && !spans.iter().any(|events| events.contains(&j)) => &[],
            _ => &scenario.shared.budgets,
        },
        adaptive: scenario.shared.adaptive,
        margin: scenario.shared.margin,
        ..ReserveRequest::new(&arrival.id, scenario.limits_at(j), arrival.now)
    };
    // A rule with classes: the key's calendar holds the rule's limits, the entity none.
    let event = match (&scenario.shared.classes, drip_core::rules::Classes::split(key)) {
        (Some(_), Some(class)) => {
            ReserveRequest { limits: &[], budgets: &scenario.shared.draws, class: Some(class), ..event }
        }
        _ => event,
    };
    SlotRequest {
        reslot: arrival.reslot,
        tag: scenario.shared.budgets.first().map(|b| b.tag.as_str()),
        parked_body: parked_body_of(arrival),
        ..SlotRequest::new(rule, key, event).at(arrival.now)
    }
}

/// The body an event's reservation carries to keep should it park (its id), for two messages in
/// three; the others' callers would keep theirs after (as for a claim-checked body).
fn parked_body_of(arrival: &Arrival) -> Option<&[u8]> {
    (arrival.id.bytes().map(u32::from).sum::<u32>() % 3 != 0).then_some(arrival.id.as_bytes())
}

/// A drain's request for the parked event at `j`, made at the event at `i`: a key that parked
/// before its rule had classes drains as its default class once the rule has them, against its
/// key's calendar (`Classes::of_entity`, as the dispatcher's `SlotRequest::for_rule` does).
fn drain_request_of<'a>(scenario: &'a Scenario, rule: &'a str, key: &'a str, j: usize, i: usize) -> SlotRequest<'a> {
    let request = request_of(scenario, rule, key, j);
    let bare = drip_core::rules::Classes::split(key).is_none();
    match &scenario.shared.classes {
        Some(_) if bare && !scenario.events[i].unclassed => {
            let (limits, budgets, class) = (&[][..], &scenario.shared.draws[..], Some((key, "c0")));
            SlotRequest { event: ReserveRequest { limits, budgets, class, ..request.event }, ..request }
        }
        _ => request,
    }
}

/// Cuts the events into consecutive batches of the given sizes (cycled), each ending before an
/// operation between events (an override, a pause, a signal) and before a new slot, and gives every event of a batch its
/// first event's `now`: one script call has one clock.
fn batched(mut scenario: Scenario, sizes: &[usize]) -> (Scenario, Vec<Range<usize>>) {
    let between = |i: usize| {
        scenario.overrides.iter().any(|op| op.before_event == i)
            || scenario.pauses.iter().any(|p| p.0 == i)
            || scenario.shared.signals.iter().any(|s| s.0 == i)
            || scenario.shared.budget_pauses.iter().any(|p| p.0 == i)
            // A message is given a new slot after its attempt acted on the first one (completed
            // it or not), never in the call that reserved it.
            || scenario.events[i].reslot.is_some()
    };
    let (mut batches, mut start, n) = (Vec::new(), 0, scenario.events.len());
    for &size in sizes.iter().cycle() {
        if start == n {
            break;
        }
        let mut end = start + 1;
        while end < n && end - start < size && !between(end) {
            end += 1;
        }
        batches.push(start..end);
        start = end;
    }
    for batch in &batches {
        let now = scenario.events[batch.start].now;
        for arrival in &mut scenario.events[batch.clone()] {
            arrival.now = now;
        }
    }
    (scenario, batches)
}

/// A store the differential test drives: the Store trait, at the scenario's times.
trait Differential: Store {
    /// Reserves each request in order: one script call for Redis, one after another for the model.
    async fn reserve_all(&self, requests: &[SlotRequest<'_>]) -> Vec<Reserved>;
    fn clock(&self) -> &Clock;
}

fn rule_ref<'a>(rule: &'a str, scenario: &'a Scenario) -> RuleRef<'a> {
    let tag = scenario.shared.budgets.first().map(|b| b.tag.as_str());
    let leases = scenario.shared.budgets.iter().find_map(|b| b.leases);
    RuleRef { id: rule, tag, leases, classed: scenario.shared.classes.is_some() }
}

/// The key an operation on `entity`'s key takes: with classes, one of its classes' entities (any
/// class: an operation on a key of a classed rule is its calendar's).
fn calendar_key(scenario: &Scenario, entity: usize) -> String {
    match scenario.shared.classes {
        Some(_) => format!("entity_{entity}#c0"),
        None => format!("entity_{entity}"),
    }
}

impl Differential for MemoryStore {
    async fn reserve_all(&self, requests: &[SlotRequest<'_>]) -> Vec<Reserved> {
        self.reserve_batch(requests)
    }

    fn clock(&self) -> &Clock {
        MemoryStore::clock(self)
    }
}

impl<C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static> Differential for RedisStore<C> {
    async fn reserve_all(&self, requests: &[SlotRequest<'_>]) -> Vec<Reserved> {
        self.reserve_batch(requests).await.expect("reserve_batch")
    }

    fn clock(&self) -> &Clock {
        RedisStore::clock(self)
    }
}

/// Budgets live apart from rules in Redis: each run gets its own, named after `rule` (and so are
/// the rules its floors name: `Scenario::rule_of`).
fn with_own_budgets(mut scenario: Scenario, rule: &str) -> Scenario {
    let budgets = scenario.shared.budgets.iter().map(|b| {
        let floors = b.floors.iter().map(|(name, floor)| (format!("{rule}-{name}"), *floor)).collect();
        let (name, tag) = (format!("{rule}-{}", b.name), format!("{rule}-{}", b.tag));
        Arc::new(Budget { name, tag, floors, ..(**b).clone() })
    });
    scenario.shared.budgets = budgets.collect();
    if let Some(calendar) = &scenario.shared.classes {
        scenario.shared.draws =
            std::iter::once(calendar.clone()).chain(scenario.shared.budgets.iter().cloned()).collect();
    }
    scenario
}

/// Runs `strategy`'s scenarios through the model and reserve.lua: identical answers and state,
/// then `check` on the answers.
fn differential(
    strategy: impl Strategy<Value = Scenario>,
    cases: u32,
    check: impl Fn(&Scenario, &[Reservation]) -> Result<(), String>,
) {
    differential_in_batches(strategy.prop_map(|s| (s, Vec::new())), cases, check);
}

/// The same, with the Lua reserving the events in batches (`batched`) and the model one by one.
fn differential_in_batches(
    strategy: impl Strategy<Value = (Scenario, Vec<usize>)>,
    cases: u32,
    check: impl Fn(&Scenario, &[Reservation]) -> Result<(), String>,
) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/redis_reserve.proptest-regressions"
        )))),
        ..Config::default()
    };
    // The lean path for the events of its shape (what the store does), and the two paths mixed
    // message by message, each against the model on the same sequences.
    let stores = [redis.clone(), redis.with_reserve_paths(ReservePaths::Mixed)];
    let result = TestRunner::new(config).run(&strategy, |(scenario, sizes)| {
        for redis in &stores {
            compare_with_the_model(&runtime, redis, scenario.clone(), &sizes, &check)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// One scenario through the model and through `redis`: identical answers and state, then `check`.
fn compare_with_the_model(
    runtime: &tokio::runtime::Runtime,
    redis: &RedisStore<redis::aio::MultiplexedConnection>,
    scenario: Scenario,
    sizes: &[usize],
    check: &impl Fn(&Scenario, &[Reservation]) -> Result<(), String>,
) -> Result<(), TestCaseError> {
    let rule = unique("differential");
    let (scenario, batches) = if sizes.is_empty() { (scenario, Vec::new()) } else { batched(scenario, sizes) };
    let scenario = with_own_budgets(scenario, &rule);
    let memory = MemoryStore::new();
    let (model_run, lua_run) = runtime.block_on(async {
        (run_all(&memory, &rule, &scenario, &batches).await, run_all(redis, &rule, &scenario, &batches).await)
    });
    if model_run.corrections != lua_run.corrections {
        let (m, l) = (&model_run.corrections, &lua_run.corrections);
        return Err(TestCaseError::fail(format!("corrections: model {m:?}, lua {l:?}")));
    }
    if model_run.rings != lua_run.rings {
        let (m, l) = (&model_run.rings, &lua_run.rings);
        return Err(TestCaseError::fail(format!("fair rings: model {m:#?}, lua {l:#?}")));
    }
    if model_run.drains != lua_run.drains {
        let (m, l) = (&model_run.drains, &lua_run.drains);
        return Err(TestCaseError::fail(format!("drains: model {m:?}, lua {l:?}")));
    }
    let (model, lua) = (model_run.answers, lua_run.answers);
    for (i, (m, l)) in model.iter().zip(&lua).enumerate() {
        if m != l {
            return Err(TestCaseError::fail(format!("event {i} {:?}: model {m:?}, lua {l:?}", scenario.events[i])));
        }
    }
    // The state each left behind, read back from Redis into the model's type.
    let entities: std::collections::BTreeSet<(usize, String)> = scenario
        .events
        .iter()
        .map(|a| (a.entity, scenario.entity_key(a)))
        .chain(scenario.overrides.iter().map(|o| (o.entity, o.key())))
        .chain(scenario.pauses.iter().map(|p| (p.1, format!("entity_{}", p.1))))
        .collect();
    for (entity, key) in &entities {
        // A class's entity holds none of the rule's limits: its key's calendar does (a key's
        // own state, from before the rule had classes, does).
        let class = scenario.shared.classes.is_some() && key.contains('#');
        let limits = if class { Vec::new() } else { scenario.all_limits() };
        let rule = scenario.rule_of(&rule, *entity);
        let in_redis =
            runtime.block_on(redis.entity_state(rule_ref(&rule, &scenario), key, &limits)).expect("entity_state");
        let in_model = memory.entity_state(&rule, key).unwrap_or_default();
        if in_model != in_redis {
            return Err(TestCaseError::fail(format!("{key}: model state {in_model:?}, lua state {in_redis:?}")));
        }
    }
    // Each budget's calendar from the last event's window on (Redis drops older windows).
    let last_now = scenario.events.last().map_or(0, |a| a.now);
    let current = |state: drip_core::schedule::BudgetState| drip_core::schedule::BudgetState {
        windows: state.windows.into_iter().filter(|((per, w), _)| *w >= last_now.div_euclid(*per) * per).collect(),
        floor_used: state
            .floor_used
            .into_iter()
            .filter(|((per, w, _), _)| *w >= last_now.div_euclid(*per) * per)
            .collect(),
        leased: state.leased.into_iter().filter(|((per, w), _)| *w >= last_now.div_euclid(*per) * per).collect(),
        // Redis counts what a pool stranded as it drops passed windows; the model keeps them.
        stranded: BTreeMap::new(),
        granted: state.granted.into_iter().filter(|((per, w, _), _)| *w >= last_now.div_euclid(*per) * per).collect(),
        returned: state.returned.into_iter().filter(|((per, w), _)| *w >= last_now.div_euclid(*per) * per).collect(),
        taken_back: state
            .taken_back
            .into_iter()
            .filter(|((per, w, _), _)| *w >= last_now.div_euclid(*per) * per)
            .collect(),
        ..state
    };
    for budget in &scenario.shared.budgets {
        let in_redis = current(runtime.block_on(redis.budget_state(budget)).expect("budget_state"));
        let in_model = current(memory.budget_state(&budget.name).unwrap_or_default());
        if in_model != in_redis {
            return Err(TestCaseError::fail(format!("budget {}: model {in_model:?}, lua {in_redis:?}", budget.name)));
        }
    }
    // A leased budget's pools likewise (a pool's copy of its home's pause aside: the model
    // keeps the pause at the home).
    for budget in &scenario.shared.budgets {
        for partition in 0..budget.leases.map_or(0, |l| l.partitions) {
            let pool = runtime.block_on(redis.pool_state(budget, partition)).expect("pool_state");
            let in_redis = current(drip_core::schedule::BudgetState { paused_until: None, ..pool });
            let in_model = current(memory.budget_state(&budget.pool_name(partition)).unwrap_or_default());
            if in_model != in_redis {
                return Err(TestCaseError::fail(format!(
                    "{}: model {in_model:?}, lua {in_redis:?}",
                    budget.pool_name(partition)
                )));
            }
        }
    }
    // Each key's classes calendar likewise.
    if let Some(calendar) = &scenario.shared.classes {
        for (entity, _) in &entities {
            let (key, rule) = (format!("entity_{entity}"), scenario.rule_of(&rule, *entity));
            let rule = rule_ref(&rule, &scenario);
            let in_redis = current(runtime.block_on(redis.class_calendar_state(rule, &key)).expect("calendar"));
            let in_model = current(memory.budget_state(&calendar.state_name(Some(&key))).unwrap_or_default());
            if in_model != in_redis {
                return Err(TestCaseError::fail(format!("{key}'s calendar: model {in_model:?}, lua {in_redis:?}")));
            }
        }
    }
    check(&scenario, &lua).map_err(TestCaseError::fail)
}

#[test]
fn reserve_lua_gives_the_model_s_answer_for_every_random_sequence() {
    differential(scenario(Kinds::All, 60), 192, check_schedule);
}

/// Overrides set, ended and deleted between events: the model and the Lua still agree, events whose
/// cost exceeds a lowered limit are refused (and so on redelivery), and no window of a fixed or
/// sliding limit holds more than the largest count that limit had.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_overrides() {
    differential(scenario_with_overrides(60), 160, check_overridden_bounds);
}

/// The rule edited once mid-sequence (limits added, removed, or changed in count, period or kind):
/// the model and the Lua agree, FIFO holds across the edit, and no window of a limit after the edit
/// that holds a new slot holds more than the larger of its old and new count.
#[test]
fn reserve_lua_gives_the_model_s_answer_across_a_rule_edit() {
    differential(scenario_with_an_edit(60), 160, check_edit_bounds);
}

/// The rule gains its budgets at a random event, loses them at a later one and sometimes gains
/// them again, with costs corrected after the call at random: its events go the script's lean way
/// outside the spans, the general way inside, and the model and the Lua agree on every answer and
/// on the state left behind (every window of the key and of the budgets as the model keeps it),
/// with the key's limits exact throughout and no budget window over its count. A message reserved
/// before the rule had its budgets (or in a gap between spans) and given a new slot or a
/// corrected cost inside a span gives the budgets back nothing and charges them nothing: its slot
/// never took from them.
#[test]
fn reserve_lua_gives_the_model_s_answer_across_edits_between_its_paths() {
    use proptest::sample::Index;
    let cuts = proptest::collection::vec(any::<Index>(), 2..=4);
    let corrections = proptest::collection::vec((any::<Index>(), any::<Index>(), 0u64..=4), 0..6);
    let strategy = (scenario_with_budgets(60), cuts, corrections).prop_map(|(mut scenario, cuts, corrections)| {
        let n = scenario.events.len();
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(n + 1)).collect();
        cuts.sort_unstable();
        scenario.shared.budgeted =
            cuts.chunks_exact(2).map(|span| span[0]..span[1]).filter(|s| !s.is_empty()).collect();
        if scenario.shared.budgeted.is_empty() {
            scenario.shared.budgeted.push(0..0);
        }
        scenario.shared.corrections = corrections
            .into_iter()
            .filter_map(|(at, of, actual)| {
                let at = at.index(n);
                (at > 0).then(|| (at, of.index(at), actual))
            })
            .collect();
        scenario.shared.corrections.sort_by_key(|c| c.0);
        scenario
    });
    differential(strategy, 128, |scenario, answers| {
        let scenario = &Scenario { events: corrected_events(scenario, answers), ..scenario.clone() };
        check_pause_bounds(scenario, answers)?;
        // The budgets' windows over the events that drew from them.
        let (events, answers): (Vec<Arrival>, Vec<Reservation>) = scenario
            .shared
            .budgeted
            .iter()
            .flat_map(|span| span.clone())
            .map(|j| (scenario.events[j].clone(), answers[j]))
            .unzip();
        check_budget_bounds(&Scenario { events, ..scenario.clone() }, &answers)
    });
}

/// Costs reported after the call, lowering or raising what messages booked (budgets too): the model
/// and the Lua agree on each correction, every answer and the state left behind, and the limits
/// hold over the slots in use at the lowered costs.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_costs_corrected_after_the_call() {
    differential(scenario_with_corrections(60), 160, check_corrected_bounds);
}

/// Pauses and new slots for redelivered messages: the model and the Lua agree, nothing lands inside a
/// pause, FIFO holds, and the limits hold over everything reserved.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_pauses_and_new_slots() {
    differential(scenario_with_pauses(60), 160, check_pause_bounds);
}

/// Shared budgets (calendars filled out of order by three entities, fair shares, spread
/// placement), adaptive limits lowered by 429s and climbing back, and budget pauses: the model and
/// the Lua agree on every answer and on the state left behind, no budget window holds more than its
/// count, no entity more than its share, nothing lands inside a budget's pause, FIFO holds.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_budgets_and_adaptive_limits() {
    differential(scenario_with_budgets(60), 192, check_budget_bounds);
}

/// A rule that parks a throttled key's backlog, with pauses of keys and budgets, adaptive limits
/// and their signals, budgets, new slots and drains at random moments: the model and reserve.lua
/// (and wake.lua) agree on every answer, every drain's wake and unpark, and the state; every
/// limit holds over what was reserved, the drains' slots included.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_parked_backlogs() {
    differential(scenario_with_parking(60), 192, check_budget_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A fair budget (book near, park far) with weights, pauses, adaptive limits, new slots and
/// drains at random moments: the model and the scripts (reserve.lua's parking, fair.lua's ring)
/// agree on every answer, every park's ring join and wake, every drain's unparks (a drain's call
/// holds the queues of every key waiting in the ring, round robin, as the dispatcher's does), the
/// ring it read, who left it and the next wake; every limit holds over what was reserved. Alone
/// and in batches (a call's events of several keys, each joining the ring as its own).
#[test]
fn reserve_lua_gives_the_model_s_answer_with_fair_budgets() {
    differential(scenario_with_fair_budgets(60), 160, check_budget_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_fair_budgets(60), sizes()), 64, check_budget_bounds);
}

/// A rule with classes (a reserve for one or two of them) over fixed limits, with and without
/// shared budgets, new slots and republished ids: the model and reserve.lua agree on every answer,
/// the entities' and the calendars' state; FIFO holds per key and class, and no window of a key
/// (all classes together) or of a budget holds more than its count.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_classes() {
    differential(scenario_with_classes(60), 160, check_class_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_classes(60), sizes()), 64, check_class_bounds);
}

/// Batches of 1 to 64 events per script call (mixed entities, redeliveries and republished ids
/// inside a batch, budgets, fair shares, adaptive limits; a batch ends before a pause or a signal):
/// reserve.lua gives each event the answer the model gives it reserving them one after another,
/// and leaves the same state.
#[test]
fn reserve_lua_gives_each_event_of_a_batch_the_model_s_answer() {
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario(Kinds::All, 60), sizes()), 96, check_schedule);
    differential_in_batches((scenario_with_budgets(60), sizes()), 96, check_budget_bounds);
}

/// Budgets leased over 2 to 4 partitions, with chunks from one unit to a whole window, alone and in
/// batches (a call stops at an event whose pool needs a lease and goes on after it): the model and
/// reserve.lua with lease.lua agree on every answer, on the entities' state, on each home's leases
/// and each pool's; no budget window holds more than its count, nothing lands in a pause, FIFO
/// holds.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_leased_budgets() {
    differential(scenario_with_leases(60), 160, check_budget_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_leases(60), sizes()), 64, check_budget_bounds);
}

/// Leased budgets under a rule that parks a throttled key's backlog (pauses of keys and budgets,
/// adaptive keys, drains at random moments): a drain's unpark whose partition's pool has no units
/// asks the home and goes on, as a reservation does; the model and the scripts agree on every
/// answer, every drain's unparks and wake, each home's leases and each pool's; no budget window
/// holds more than its count, nothing lands in a pause, FIFO holds.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_leased_budgets_that_park() {
    differential(scenario_with_leased_parking(60), 160, check_budget_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A fair budget leased over 2 to 4 partitions, with weights, pauses, adaptive keys and drains at
/// random moments: each key joins its partition's ring; a drain hands a ring's heads over in one
/// call that stops for a lease where the partition's pool has none (the heads behind it in its
/// demand, in the model as in the store). The model and the scripts agree on every answer, ring
/// op, unpark, lease and pool; every limit holds over what was reserved. Alone and in batches.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_fair_leased_budgets() {
    differential(scenario_with_fair_leased_budgets(60), 160, check_budget_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_fair_leased_budgets(60), sizes()), 64, check_budget_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A rule with classes that parks a throttled key's backlog (pauses of keys, each its calendar's
/// for every class; adaptive calendars and their signals; budgets and their pauses): each class
/// parks in its own queue and drains in its own order, keeping the classes' reserves. The model
/// and the scripts agree on every answer, every drain's wake and unparks, and the state; each
/// key's windows (all classes together) and each budget's hold their counts, FIFO per class.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_classes_that_park() {
    differential(scenario_with_parked_classes(60), 160, check_class_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_parked_classes(60), sizes()), 64, check_class_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A rule with classes drawing from a fair budget (weights for some keys), its keys paused and
/// signalled: each class of a key parks past the near horizon in its own queue and joins the ring
/// as its own member; a drain hands the ring's heads over in one call. The model and the scripts
/// agree on every answer, ring op, unpark and the state; each key's windows (all classes) and
/// each budget's hold their counts; FIFO per class. Alone and in batches.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_classes_in_a_fair_budget() {
    differential(scenario_with_fair_classes(60), 128, check_class_bounds);
    let sizes = || proptest::collection::vec(1usize..=64, 1..8);
    differential_in_batches((scenario_with_fair_classes(60), sizes()), 48, check_class_bounds);
    let seen = PARKING_SEEN.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(seen.iter().all(|&n| n > 0), "dropped, drained, parked: {seen:?}");
}

/// A delivery margin: the model and the Lua agree, and every fixed window and sliding interval
/// holds its limit at the delivery times too, each delivery up to the margin late.
#[test]
fn reserve_lua_gives_the_model_s_answer_with_a_delivery_margin() {
    differential(scenario_with_margin(60), 160, check_delivery_bounds);
}

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

/// `cmdstat_<name>:calls=N` for the commands the script calls (the EVALSHA itself excluded).
fn script_commands(stats: &str) -> BTreeMap<String, u64> {
    stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            let command = name.split('|').next().unwrap_or(name);
            (!matches!(command, "evalsha" | "eval" | "fcall" | "function" | "config" | "info" | "script"))
                .then(|| (name.to_owned(), calls))
        })
        .collect()
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

/// Answers are filed by id and minute of publication in both stores: m1 published at 12:00:59, an
/// m1 published at 12:01:00 and m2 at 12:01:01 under 1 a minute are three messages for both; a
/// message's redelivery in a later minute (its publish time unchanged) finds its answer.
#[test]
fn both_stores_file_answers_by_the_minute_of_publication() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let noon = T0 - T0 % (60 * MINUTE) + 12 * 60 * MINUTE;
    let arrival = |id: &str, now: Millis, published: Millis, redelivery: bool| Arrival {
        entity: 0,
        id: id.into(),
        cost: 1,
        now,
        published,
        redelivery,
        reslot: None,
        floor: None,
        class: 0,
        unclassed: false,
    };
    let (t0, t1, t2) = (noon + 59 * SECOND, noon + MINUTE, noon + MINUTE + SECOND);
    let scenario = Scenario {
        limits: vec![Limit::new(1, MINUTE, Window::Fixed(Placement::Start)).unwrap()],
        max_delay: 10 * MINUTE,
        events: vec![
            arrival("m1", t0, t0, false),
            arrival("m1", t1, t1, true),
            arrival("m2", t2, t2, false),
            arrival("m1", t2 + 3 * MINUTE, t0, true),
        ],
        overrides: Vec::new(),
        edit: None,
        pauses: Vec::new(),
        shared: Default::default(),
    };
    let rule = unique("filing");
    let memory = MemoryStore::new();
    let (model, lua) = runtime
        .block_on(async { (run(&memory, &rule, &scenario, &[]).await, run(&redis, &rule, &scenario, &[]).await) });
    assert_eq!(model, lua);
    let slots: Vec<Millis> = lua.iter().map(|r| r.slot).collect();
    assert_eq!(slots, [t0, noon + MINUTE, noon + 2 * MINUTE, t0]);
    assert!(lua[3].replayed(), "{:?}", lua[3]);
}

/// `examples/payouts.yaml`'s payouts rule (three fixed limits), under an id of its own.
fn example_payouts_rule(prefix: &str) -> drip_core::rules::Rule {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/payouts.yaml");
    let rules = drip_core::rules::RuleSet::load(std::path::Path::new(path)).unwrap();
    let mut rule = rules.rule("payouts").unwrap().clone();
    rule.id = unique(prefix);
    rule
}

/// `inspect`'s backlog is exact whatever the limits: 350 payouts into `examples/payouts.yaml`
/// (three fixed limits, 10 a second binding first) leave 340 waiting, and both stores say
/// exactly how many hold a slot after the moment they report, as the reservations themselves
/// do. They also say why a new event would wait: the full limit, with when its window ends.
#[test]
fn both_stores_count_the_backlog_exactly_and_say_why_a_key_waits() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rule = example_payouts_rule("exact");
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let memory = MemoryStore::new();
    for store in [&redis as &dyn Store, &memory] {
        let published = drip_core::time::wall_clock_millis();
        let mut slots = Vec::new();
        for i in 0..350 {
            let id = format!("p{i}");
            let request = SlotRequest::for_rule(&rule, "merchant_7", &id, 1).published(Some(published));
            let reserved = runtime.block_on(store.reserve(&request)).unwrap();
            runtime.block_on(store.complete(&request, &reserved)).unwrap();
            slots.push(reserved.reservation.slot);
        }
        let report = runtime.block_on(store.inspect(&rule, "merchant_7")).unwrap();
        let now = drip_core::time::parse_rfc3339(&report.now).unwrap();
        let ahead = slots.iter().filter(|&&slot| slot > now).count() as u64;
        assert!(ahead >= 330, "about 340 wait: {ahead}");
        assert_eq!(report.backlog, ahead, "{store:?}: exactly the events whose slot is after {}", report.now);
        let again = runtime
            .block_on(store.reserve(&SlotRequest::for_rule(&rule, "merchant_7", "p0", 1).published(Some(published))));
        assert_eq!(again.unwrap().reservation.slot, slots[0], "a redelivery changes nothing");
        assert!(runtime.block_on(store.inspect(&rule, "merchant_7")).unwrap().backlog <= ahead, "nothing added");
        assert!(
            report.waiting_on.iter().any(|w| w.starts_with("10 per 1s (fixed): full (10 of 10) until")
                || w.starts_with("100 per 1m (fixed): full (100 of 100) until")),
            "{:?}",
            report.waiting_on
        );
    }
}

/// Every row `inspect` prints is exact or a range holding the truth: after a burst, a pause and
/// more events behind it, each limit's use now and cost ahead (counted here from the slots the
/// reservations returned) lie within what both stores report, and rows a state keeps exactly
/// (a window still current, a sliding log) are exact. While a pause holds the backlog, it drains
/// after the pause, not at its old last slot.
#[test]
fn inspect_rows_are_exact_or_ranges_that_hold_the_truth() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Booked behind the pause, not parked (a parked event holds no slot to count).
    let rule = drip_core::rules::Rule { park_horizon: None, ..example_payouts_rule("rows") };
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let memory = MemoryStore::new();
    for store in [&redis as &dyn Store, &memory] {
        let published = drip_core::time::wall_clock_millis();
        let mut slots = Vec::new();
        let reserve = |ids: std::ops::Range<usize>, slots: &mut Vec<Millis>| {
            for i in ids {
                let id = format!("e{i}");
                let request = SlotRequest::for_rule(&rule, "merchant_9", &id, 1).published(Some(published));
                let reserved = runtime.block_on(store.reserve(&request)).unwrap();
                runtime.block_on(store.complete(&request, &reserved)).unwrap();
                slots.push(reserved.reservation.slot);
            }
        };
        reserve(0..30, &mut slots);
        let pause_end = drip_core::time::wall_clock_millis() + 10 * MINUTE;
        runtime.block_on(store.pause(&rule, "merchant_9", pause_end)).unwrap();
        let held = runtime.block_on(store.inspect(&rule, "merchant_9")).unwrap();
        assert_eq!(held.drains_at, None, "{store:?}: {held:?}");
        assert_eq!(
            held.drains_after.as_deref().map(|at| drip_core::time::parse_rfc3339(at).unwrap() / SECOND),
            Some(pause_end / SECOND),
            "{store:?}: the backlog drains after the pause"
        );
        reserve(30..55, &mut slots);
        let report = runtime.block_on(store.inspect(&rule, "merchant_9")).unwrap();
        let now = drip_core::time::parse_rfc3339(&report.now).unwrap();
        assert_eq!(report.backlog, slots.iter().filter(|&&s| s > now).count() as u64);
        assert!(
            report.drains_at.is_some() && report.drains_after.is_none(),
            "{store:?}: the last slot is after the pause"
        );
        for (limit, row) in rule.limits.iter().zip(&report.limits) {
            let current = now.div_euclid(limit.per()) * limit.per();
            let used = slots.iter().filter(|&&s| s >= current && s < current + limit.per()).count() as u64;
            let ahead = slots.iter().filter(|&&s| s >= current + limit.per()).count() as u64;
            let within = |least: u64, most: Option<u64>, truth: u64| match most {
                None => least == truth,
                Some(most) => least <= truth && truth <= most,
            };
            assert!(within(row.used_now, row.used_now_at_most, used), "{store:?} {}: used {used}: {row:?}", row.limit);
            assert!(within(row.ahead, row.ahead_at_most, ahead), "{store:?} {}: ahead {ahead}: {row:?}", row.limit);
            assert!(row.ahead <= report.backlog.max(ahead), "{store:?}: no row says more is ahead than waits: {row:?}");
        }
    }
}

/// The common path is the token bucket's: one read of the entity's state (its limits, overrides,
/// pause and adaptive level in one hash) and one write of it, plus the message's answer, written
/// with HSETNX so that knowing whether the message is new costs no read of its own. Counted from
/// Redis's commandstats on a private server, for a plain entity and for one with an override and a
/// pause; a redelivery adds the one read of its answer.
#[tokio::test]
async fn the_common_path_reads_the_entity_once_and_writes_it_once() {
    let server = RedisServer::start(&[]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let store = RedisStore::new(connection.clone(), "drip");
    let limits = [Limit::new(1_000, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let request = |id: &str, key: &'static str, now: Millis| {
        let event = ReserveRequest { published: Some(T0), lease: 10 * SECOND, ..ReserveRequest::new("", &limits, now) };
        (id.to_owned(), SlotRequest::new("r", key, event).at(now))
    };
    let reserve = async |(id, mut request): (String, SlotRequest<'_>)| {
        request.event.message_id = &id;
        store.reserve(&request).await.unwrap().reservation
    };
    let overridden = drip_core::schedule::LimitOverride { limit: 500, until: None };
    let rule = plain_rule("r", &limits);
    store.clock().set(T0);
    store.change_override(&rule, "busy", &limits[0], Some(overridden), "test".into()).await.unwrap();
    store.pause(&rule, "busy", T0 + 10).await.unwrap();
    for key in ["plain", "busy"] {
        // The first event of the entity and of the minute sets the expiries; the next ones do not.
        reserve(request("first", key, T0 + 20)).await;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut connection).await.unwrap();
        for i in 0..10 {
            let reserved = reserve(request(&format!("m{i}"), key, T0 + 30 + i)).await;
            assert_eq!(reserved.attempt, drip_core::schedule::Attempt::Decided);
        }
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
        let expected: BTreeMap<String, u64> = [("hmget", 10), ("hsetnx", 10), ("hset", 10)]
            .into_iter()
            .map(|(name, calls)| (name.to_owned(), calls))
            .collect();
        assert_eq!(script_commands(&stats), expected, "{key}: ten events, each one read and two writes");
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut connection).await.unwrap();
        let again = reserve(request("m3", key, T0 + 50)).await;
        assert_eq!((again.attempt, again.slot), (drip_core::schedule::Attempt::Busy, T0 + 33));
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut connection).await.unwrap();
        let commands = script_commands(&stats);
        assert_eq!((commands.get("hsetnx"), commands.get("hget"), commands.get("hset")), (Some(&1), Some(&1), None));
    }
}

/// A rolling deploy: an entity as the earlier layout left it (its frontier 'last', its overrides
/// and pause in a hash of their own, a message's answer in the minute's answers hash), then
/// reserved by this version. The old message's redelivery gets its answer and consumes nothing;
/// a new message keeps FIFO, the override and the pause; the entity is carried over to the new
/// layout (its overrides in its state hash, the old hash gone) and lives as long as they matter.
#[tokio::test]
async fn an_entity_the_earlier_layout_wrote_keeps_its_answers_and_overrides() {
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let rule = unique("layout");
    let limits = [Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let request =
        |id: &'static str, now: Millis| SlotRequest::new(&rule, "k", ReserveRequest::new(id, &limits, now)).at(now);
    let old = request("old", T0);
    let keys = store.keys(&old);
    let window = state_id(&limits[0]);
    // As the earlier version wrote it: "old" reserved at T0 + 1 s (leased until T0 + 11 s).
    let slot = T0 + SECOND;
    let answer =
        format!("R{}:{}:{}", slot - keys.answers_base, T0 - keys.answers_base, T0 + 11 * SECOND - keys.answers_base);
    let _: () = connection.hset(&keys.answers, &keys.answer_field[..], answer).await.unwrap();
    let (used_window, used) = (format!("{window}:w"), format!("{window}:u"));
    let state = [
        ("last", slot.to_string()),
        ("exp", (slot + 10 * MINUTE).to_string()),
        ("ab", keys.answers_base.to_string()),
        (used_window.as_str(), slot.to_string()),
        (used.as_str(), "1".to_owned()),
    ];
    let _: () = connection.hset_multiple(&keys.state, &state).await.unwrap();
    let _: () = connection.pexpire(&keys.state, 10 * MINUTE).await.unwrap();
    let legacy = [("fixed:1000", "1".to_owned()), ("pause", (T0 + 3 * SECOND).to_string())];
    let _: () = connection.hset_multiple(&keys.legacy_overrides, &legacy).await.unwrap();
    let before = store.entity_state(RuleRef::plain(&rule), "k", &limits).await.unwrap();
    assert_eq!(before.last_slot, Some(slot), "the earlier frontier is read back");
    assert_eq!(before.paused_until, Some(T0 + 3 * SECOND), "and the earlier overrides");

    let redelivered = store.reserve(&request("old", T0 + 20 * SECOND)).await.unwrap().reservation;
    assert_eq!((redelivered.slot, redelivered.decided_at), (slot, T0), "the first answer, replayed");
    assert_eq!(redelivered.attempt, drip_core::schedule::Attempt::Resumed, "its lease had ended");
    assert_eq!(store.entity_state(RuleRef::plain(&rule), "k", &limits).await.unwrap(), before, "nothing consumed");

    let new = [request("new1", T0 + 100), request("new2", T0 + 200)];
    let slots: Vec<Millis> = store.reserve_batch(&new).await.unwrap().iter().map(|r| r.reservation.slot).collect();
    assert_eq!(slots, [T0 + 3 * SECOND, T0 + 4 * SECOND], "after the pause, one a second (the override)");
    let fields: HashMap<String, String> = connection.hgetall(&keys.state).await.unwrap();
    assert!(!fields.contains_key("last") && fields.contains_key("f"), "carried over: {fields:?}");
    assert!(fields.get("o").is_some_and(|o| o.contains("fixed:1000=1")), "{fields:?}");
    assert!(!connection.exists::<_, bool>(&keys.legacy_overrides).await.unwrap(), "the old hash is gone");
    assert_eq!(connection.pttl::<_, i64>(&keys.state).await.unwrap(), -1, "an override without an end keeps it");
    store.clock().set(T0 + 300);
    store.change_override(&plain_rule(&rule, &limits), "k", &limits[0], None, "test".into()).await.unwrap();
    let ttl: i64 = connection.pttl(&keys.state).await.unwrap();
    assert!(ttl > 0, "the state expires again once no override is for ever: {ttl}");
}

/// An override or a pause keeps the entity's state hash (where it lives) alive until it stops
/// mattering, and no longer than the state's own expiry once it has.
#[tokio::test]
async fn overrides_keep_the_state_alive_as_long_as_they_matter() {
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let rule = unique("keep");
    let limits = [Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let now = drip_core::time::wall_clock_millis();
    let request = SlotRequest::new(&rule, "k", ReserveRequest::new("m", &limits, now)).at(now);
    store.reserve(&request).await.unwrap();
    let state = store.keys(&request).state;
    let own: i64 = connection.pttl(&state).await.unwrap();
    assert!(own > 0 && own <= 2 * (SECOND + drip_store::STATE_MARGIN) + SECOND, "{own}");
    let until = now + 3 * drip_core::time::HOUR;
    let set = drip_core::schedule::LimitOverride { limit: 1, until: Some(until) };
    store.clock().set(now);
    store.change_override(&plain_rule(&rule, &limits), "k", &limits[0], Some(set), "test".into()).await.unwrap();
    let kept: i64 = connection.pttl(&state).await.unwrap();
    assert!(kept >= until - now + drip_store::OVERRIDE_MARGIN - SECOND, "until the override's end and a day: {kept}");
    // Another reservation does not cut it short.
    store.reserve(&SlotRequest::new(&rule, "k", ReserveRequest::new("m2", &limits, now)).at(now)).await.unwrap();
    assert!(connection.pttl::<_, i64>(&state).await.unwrap() >= kept - SECOND);
    store.change_override(&plain_rule(&rule, &limits), "k", &limits[0], None, "test".into()).await.unwrap();
    let back: i64 = connection.pttl(&state).await.unwrap();
    assert!(back > 0 && back <= own + SECOND, "back to the state's own expiry: {back} (was {own})");
}

/// A key's override on a rule with classes is its calendar's: every class of the key books against
/// it (named by the key or by any of its classes), another key keeps the rule's count, and an
/// override without an end keeps the calendar alive through reservations until it is deleted.
#[tokio::test]
async fn an_override_of_a_classed_key_holds_for_every_class_and_keeps_its_calendar() {
    let mut connection = shared_connection().await;
    let store = RedisStore::new(connection.clone(), "drip");
    let id = unique("classed");
    let text = format!(
        "default_dlq_topic: dlq\nrules:\n  - name: {id}\n    key: \"{{attributes.k}}\"\n    limits: [ {{ limit: 2, per: 1h }} ]\n    \
         max_delay: 30d\n    classes: {{ from: \"{{attributes.c}}\", default: bulk, reserve: {{ live: 0.5 }} }}\n    \
         forward: {{ topic: ready }}\n    overflow_topic: overflow\n"
    );
    let rules = drip_core::rules::RuleSet::parse("classed.yaml", &text).unwrap();
    let rule = rules.rule(&id).unwrap();
    let now = drip_core::time::wall_clock_millis();
    store.clock().set(now);
    let forever = drip_core::schedule::LimitOverride { limit: 4, until: None };
    store.change_override(rule, "m#live", &rule.limits[0], Some(forever), "test".into()).await.unwrap();
    assert_eq!(store.overrides(rule, "m").await.unwrap().values().next(), Some(&forever), "the key's, not the class's");
    let slots = |key: &'static str| {
        let store = &store;
        async move {
            let mut slots = Vec::new();
            for (i, class) in ["live", "bulk", "bulk", "live", "bulk"].into_iter().enumerate() {
                let message = format!("{key}{i}");
                let event = ReserveRequest::for_rule(rule, &message, 1, now).for_class(rule, (key, class));
                let entity = format!("{key}#{class}");
                let reserved = store.reserve(&SlotRequest::new(&rule.id, &entity, event).at(now)).await.unwrap();
                slots.push(reserved.reservation.slot.div_euclid(drip_core::time::HOUR));
            }
            slots
        }
    };
    let hour = now.div_euclid(drip_core::time::HOUR);
    assert_eq!(slots("m").await, [hour, hour, hour, hour, hour + 1], "4 an hour for every class of m");
    assert_eq!(slots("n").await, [hour, hour, hour + 1, hour + 1, hour + 2], "2 an hour for n");
    let calendar = drip_store::class_calendar_key("drip", RuleRef::of(rule), "m");
    assert_eq!(connection.pttl::<_, i64>(&calendar).await.unwrap(), -1, "an override without an end keeps it");
    store.change_override(rule, "m", &rule.limits[0], None, "test".into()).await.unwrap();
    let ttl: i64 = connection.pttl(&calendar).await.unwrap();
    assert!(ttl > drip_core::time::HOUR, "it expires again with its windows once the override is gone: {ttl}");
    assert!(store.overrides(rule, "m#bulk").await.unwrap().is_empty());
}

/// A message given a new slot with its old one given back, through both stores: the old slot's
/// unit returns to the budget's window (and the entity's), so the new slot can be in the same
/// window; kept, it cannot. Both stores leave the same state.
#[tokio::test]
async fn a_new_slot_gives_the_old_one_s_units_back_in_both_stores() {
    let redis = RedisStore::new(shared_connection().await, "drip");
    let limits = [Limit::new(5, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let budget = Arc::new(Budget::named(
        unique("gateway"),
        unique("gateway"),
        vec![Limit::new(2, SECOND, Window::Fixed(Placement::Start)).unwrap()],
    ));
    let budgets = [budget.clone()];
    for (old, slot, next_window) in [(OldSlot::GivenBack, T0 + 100, None), (OldSlot::Kept, T0 + SECOND, Some(1))] {
        let rule = unique("give-back");
        let memory = MemoryStore::new();
        let request = |id: &'static str, now: Millis, reslot: Option<OldSlot>| {
            let event = ReserveRequest { budgets: &budgets, ..ReserveRequest::new(id, &limits, now) };
            let tag = Some(budget.tag.as_str());
            SlotRequest { reslot, tag, ..SlotRequest::new(&rule, "k", event).at(now) }
        };
        for store in [&redis as &dyn Store, &memory] {
            assert_eq!(store.reserve(&request("a", T0, None)).await.unwrap().reservation.slot, T0);
            assert_eq!(store.reserve(&request("b", T0, None)).await.unwrap().reservation.slot, T0);
            let again = store.reserve(&request("a", T0 + 100, Some(old))).await.unwrap().reservation;
            assert_eq!(again.slot, slot, "{old:?}");
        }
        let tagged = RuleRef { id: &rule, tag: Some(&budget.tag), leases: None, classed: false };
        let in_redis = redis.entity_state(tagged, "k", &limits).await.unwrap();
        assert_eq!(Some(&in_redis), memory.entity_state(&rule, "k").as_ref(), "{old:?}");
        let shared = redis.budget_state(&budget).await.unwrap();
        let windows = (shared.windows.get(&(SECOND, T0)).copied(), shared.windows.get(&(SECOND, T0 + SECOND)).copied());
        assert_eq!(windows, (Some(2), next_window), "{old:?}: the budget's windows");
        assert_eq!(Some(&shared), memory.budget_state(&budget.name).as_ref(), "{old:?}");
        // The next test case starts the budget afresh.
        let mut connection = shared_connection().await;
        let _: () = connection.del(drip_store::budget_key("drip", &budget)).await.unwrap();
    }
}

/// A budget added to a rule with keys already booked, through both stores: a message reserved
/// before took nothing from it, so a new slot or a lowered cost gives it nothing back and a
/// raised cost charges it nothing (the budget's full window stays full: the new slot goes to the
/// next); lost and gained again, a message reserved in the gap likewise. The key's lean events
/// (no budget) and its budgeted ones (the general path) leave the same state in both stores.
#[tokio::test]
async fn a_budget_added_to_a_rule_gets_back_only_what_its_slots_took_in_both_stores() {
    let redis = RedisStore::new(shared_connection().await, "drip");
    let limits = [Limit::new(100, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let budget = Arc::new(Budget::named(
        unique("gateway"),
        unique("gateway"),
        vec![Limit::new(3, SECOND, Window::Fixed(Placement::Start)).unwrap()],
    ));
    let budgets = [budget.clone()];
    let rule = unique("budget-added");
    let memory = MemoryStore::new();
    // (key, message, now, cost, whether the rule has the budget, whether it is a new slot)
    let request = |key: &'static str, id: &'static str, now: Millis, cost: u64, budgeted: bool, reslot: bool| {
        let on = if budgeted { &budgets[..] } else { &[] };
        let event = ReserveRequest { cost, budgets: on, ..ReserveRequest::new(id, &limits, now) };
        let reslot = reslot.then_some(OldSlot::GivenBack);
        SlotRequest { tag: Some(budget.tag.as_str()), reslot, ..SlotRequest::new(&rule, key, event).at(now) }
    };
    let used = |state: drip_core::schedule::BudgetState| state.windows.get(&(SECOND, T0)).copied();
    for store in [&redis as &dyn Store, &memory] {
        macro_rules! slot {
            ($($request:expr),*) => {
                store.reserve(&request($($request),*)).await.unwrap().reservation.slot
            };
        }
        for (id, cost) in [("a0", 1), ("a1", 2), ("a2", 1)] {
            assert_eq!(slot!("a", id, T0, cost, false, false), T0);
        }
        for id in ["b0", "b1", "b2"] {
            assert_eq!(slot!("b", id, T0 + 1, 1, true, false), T0 + 1);
        }
        assert_eq!(slot!("a", "a0", T0 + 2, 1, true, true), T0 + SECOND, "the window stays full");
        let corrected = store.correct_cost(&request("a", "a1", T0 + 3, 1, true, false), 0).await.unwrap();
        assert_eq!(corrected, Correction::Applied { booked: 2, actual: 0 });
        let corrected = store.correct_cost(&request("a", "a2", T0 + 3, 1, true, false), 3).await.unwrap();
        assert_eq!(corrected, Correction::Applied { booked: 1, actual: 3 });
        assert_eq!(slot!("b", "b2", T0 + 4, 1, true, true), T0 + 4, "b2 took its unit");
        // c: budgeted, then a lean event in a gap, then budgeted again.
        assert_eq!(slot!("c", "c0", T0 + 5, 1, true, false), T0 + SECOND);
        assert_eq!(slot!("c", "c1", T0 + 6, 1, false, false), T0 + SECOND);
        assert_eq!(slot!("c", "c2", T0 + 7, 1, true, false), T0 + SECOND);
        assert_eq!(slot!("c", "c1", T0 + 8, 1, true, true), T0 + 2 * SECOND, "a0, c0 and c2 fill the window");
    }
    let in_redis = redis.budget_state(&budget).await.unwrap();
    assert_eq!(used(in_redis.clone()), Some(3));
    assert_eq!(in_redis.windows.get(&(SECOND, T0 + SECOND)).copied(), Some(3));
    assert_eq!(Some(&in_redis), memory.budget_state(&budget.name).as_ref());
    let tagged = RuleRef { id: &rule, tag: Some(&budget.tag), leases: None, classed: false };
    for key in ["a", "b", "c"] {
        let state = redis.entity_state(tagged, key, &limits).await.unwrap();
        assert_eq!(Some(&state), memory.entity_state(&rule, key).as_ref(), "{key}");
    }
}

/// What happens to a key's or a budget's adaptive level, one step of a latency sequence.
#[derive(Debug, Clone)]
enum LevelOp {
    /// A 429, 5xx or timeout.
    Signal,
    /// A window's latency report.
    Report(LatencyReport),
}

fn latency_sequence() -> impl Strategy<Value = (Adaptive, Vec<Limit>, Vec<(Millis, LevelOp)>)> {
    use proptest::prelude::*;
    let control = (1_100_000u64..=4_000_000, 1u64..=1_000_000, 1u64..=1_000_000, 1u64..=10, any::<bool>()).prop_map(
        |(tolerance, smoothing, baseline, recover, shadow)| LatencyControl {
            tolerance,
            smoothing,
            baseline,
            recover,
            shadow,
        },
    );
    let adaptive = (0u64..300_000, 100_000u64..=900_000, 50_000u64..=500_000, 10_000u64..=300_000, control).prop_map(
        |(margin, decrease, min, step, latency)| Adaptive {
            margin,
            decrease,
            min: min.min(PPM - margin),
            step,
            latency: Some(latency),
        },
    );
    let limits = prop::collection::vec((1u64..=200, prop::sample::select(vec![100i64, 250, 1_000, 2_000])), 1..3)
        .prop_map(|limits| {
            let mut seen = std::collections::BTreeSet::new();
            limits
                .into_iter()
                .filter(|(_, per)| seen.insert(*per))
                .map(|(count, per)| Limit::new(count, per, Window::Fixed(Placement::Start)).unwrap())
                .collect::<Vec<_>>()
        });
    // Percentiles from sub-millisecond to past the cap, with runs of steady ones (a baseline forms).
    let percentile = prop_oneof![0u64..2_000, 50_000u64..120_000, 100_000u64..1_000_000, 500_000_000u64..700_000_000];
    let op = prop_oneof![
        1 => Just(LevelOp::Signal),
        6 => (percentile, 0u64..=250).prop_map(|(percentile, calls)| LevelOp::Report(LatencyReport { percentile, calls })),
    ];
    // Mostly reports a window or a few apart; sometimes a pause in the reports longer than a
    // latency-set level holds (`LATENCY_HOLD_WINDOWS`), after which it climbs by step.
    let gap = prop_oneof![9 => 0i64..3_000, 1 => 3_000i64..40_000];
    (adaptive, limits, prop::collection::vec((gap, op), 1..40))
}

/// Latency reports and 429s in any order, on a key and on a budget: override.lua and budget.lua
/// give the model's verdicts and levels and leave its states, and a reservation after them sees
/// the same level (reserve.lua reads a level a latency report set).
#[test]
fn latency_reports_give_the_model_s_levels() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let config = Config {
        cases: 160,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/redis_reserve.proptest-regressions"
        )))),
        ..Config::default()
    };
    let result = TestRunner::new(config).run(&latency_sequence(), |(adaptive, limits, ops)| {
        let rule = unique("latency");
        let budget = Budget {
            name: format!("{rule}-b"),
            limits: limits.clone(),
            max_share: None,
            adaptive: Some(adaptive),
            floors: Vec::new(),
            per_key: false,
            fair: None,
            leases: None,
            tag: format!("{rule}-b"),
        };
        let memory = MemoryStore::new();
        let rule_ref = RuleRef::plain(&rule);
        let keyed = rule_with(&rule, &limits, Some(adaptive));
        let mut now = T0;
        for (i, (dt, op)) in ops.iter().enumerate() {
            now += dt;
            memory.clock().set(now);
            redis.clock().set(now);
            let (model, lua) = runtime.block_on(async {
                let mut said = Vec::new();
                for store in [&memory as &dyn Store, &redis] {
                    match op {
                        LevelOp::Signal => {
                            let key = store.signal(&keyed, "k").await.expect("signal");
                            let budget = store.signal_budget(&budget).await.expect("signal_budget");
                            said.push(format!("{key:?} {budget:?}"));
                        }
                        LevelOp::Report(report) => {
                            let key = store.report_latency(&keyed, "k", *report).await.expect("report_latency");
                            let budget = store.report_budget_latency(&budget, *report).await.expect("budget");
                            said.push(format!("{key:?} {budget:?}"));
                        }
                    }
                }
                (said.remove(0), said.remove(0))
            });
            if model != lua {
                return Err(TestCaseError::fail(format!("step {i} {op:?} at +{}: model {model}, lua {lua}", now - T0)));
            }
        }
        let in_model = memory.entity_state(&rule, "k").unwrap_or_default();
        let in_redis = runtime.block_on(redis.entity_state(rule_ref, "k", &limits)).expect("entity_state");
        if (in_model.adaptive, in_model.latency) != (in_redis.adaptive, in_redis.latency) {
            return Err(TestCaseError::fail(format!("key: model {in_model:?}, lua {in_redis:?}")));
        }
        let in_model = memory.budget_state(&budget.name).unwrap_or_default();
        let in_redis = runtime.block_on(redis.budget_state(&budget)).expect("budget_state");
        if (in_model.adaptive, in_model.latency) != (in_redis.adaptive, in_redis.latency) {
            return Err(TestCaseError::fail(format!("budget: model {in_model:?}, lua {in_redis:?}")));
        }
        // A burst after it: the level in force sets where each event goes.
        for i in 0..5 {
            let id = format!("m{i}");
            let event = ReserveRequest { adaptive: Some(adaptive), ..ReserveRequest::new(&id, &limits, now) };
            let request = SlotRequest::new(&rule, "k", event).at(now);
            let model = runtime.block_on(memory.reserve(&request)).expect("reserve").reservation;
            let lua = runtime.block_on(redis.reserve(&request)).expect("reserve").reservation;
            if model != lua {
                return Err(TestCaseError::fail(format!("event {i} after the sequence: model {model:?}, lua {lua:?}")));
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A pause of one class of a key holds all its classes (it is the key's calendar's), in both
/// stores alike; lifting it through any class lifts it for all.
#[test]
fn a_pause_of_one_class_holds_every_class_of_its_key() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisStore::new(runtime.block_on(shared_connection()), "drip");
    let id = unique("classes").replace('-', "_");
    let yaml = format!(
        "default_dlq_topic: dlq\nrules:\n  - name: {id}\n    key: \"m\"\n    limits: [ {{ limit: 5, per: 1s }} ]\n    classes: {{ from: \"{{attributes.c}}\", default: bulk, reserve: {{ live: 0.4 }} }}\n    max_delay: 1h\n    forward: {{ topic: ready }}\n    overflow_topic: overflow\n"
    );
    let rules = drip_core::rules::RuleSet::parse("classes.yaml", &yaml).unwrap();
    let rule = rules.rules[0].clone();
    let memory = MemoryStore::new();
    let now = T0 + 100;
    let stores: [&dyn Store; 2] = [&redis, &memory];
    let mut answers = Vec::new();
    for store in stores {
        runtime.block_on(async {
            store.pause(&rule, "m#live", now + 5 * SECOND).await.unwrap();
            assert_eq!(store.paused_until(&rule, "m#bulk").await.unwrap(), Some(now + 5 * SECOND));
            let bulk = SlotRequest::for_rule(&rule, "m#bulk", "b1", 1).at(now);
            let held = store.reserve(&bulk).await.unwrap().reservation.slot;
            assert_eq!(store.resume(&rule, "m#bulk").await.unwrap(), Some(now + 5 * SECOND));
            let live = SlotRequest::for_rule(&rule, "m#live", "l1", 1).at(now);
            let free = store.reserve(&live).await.unwrap().reservation.slot;
            answers.push((held, free));
        });
    }
    assert_eq!(answers[0], (now + 5 * SECOND, now), "the bulk class waited for the live class's pause, until lifted");
    assert_eq!(answers[0], answers[1], "Redis and the model agree");
}

/// reserve.lua runs as a function library (FCALL): a Redis that never held it, or lost it (a
/// FUNCTION FLUSH, a new instance), gets it loaded by the first reservation that misses it, and the
/// reservation goes on as if nothing happened.
#[tokio::test]
async fn a_redis_that_lost_the_library_loads_it_again() {
    let server = RedisServer::start(&[]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let store = RedisStore::new(connection.clone(), "drip");
    let limits = [Limit::new(1, SECOND, Window::Fixed(Placement::Start)).unwrap()];
    let reserve = async |id: &str| {
        let request = SlotRequest::new("r", "k", ReserveRequest::new(id, &limits, T0)).at(T0);
        store.reserve(&request).await.unwrap().reservation.slot
    };
    assert_eq!(reserve("m1").await, T0, "loaded on a Redis that never held it");
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query_async(&mut connection).await.unwrap();
    assert_eq!(libraries.len(), 1, "one library: {libraries:?}");
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut connection).await.unwrap();
    assert_eq!(reserve("m2").await, T0 + SECOND, "loaded again, the entity's state intact");
}

/// Classes added to a rule that parks while a key has events parked: the key's drain, its
/// requests made as the dispatcher makes them (`SlotRequest::for_rule` of the rule as it is now),
/// books them as the key's default class against its calendar, so a window holds the classes'
/// events and the drained ones within its count; both stores give every answer alike.
#[tokio::test]
async fn what_a_key_parked_before_its_rule_had_classes_drains_as_its_default_class() {
    // A key may hold a `#` itself (a template renders what the event holds): its bare entity is
    // still its own, not a class of the part before the `#`.
    for key in ["m", "m#1"] {
        parked_then_classed(key).await;
    }
}

async fn parked_then_classed(key: &str) {
    use drip_core::rules::RuleSet;
    let redis = RedisStore::new(shared_connection().await, "drip");
    let id = unique("parked-then-classed");
    let text = |classes: &str| {
        format!(
            "default_dlq_topic: dlq\nrules:\n  - name: {id}\n    key: \"{{attributes.k}}\"\n    limits: [ {{ limit: 3, per: 1s }} ]\n    \
             max_delay: 1h\n    park_horizon: 1s\n{classes}    forward: {{ topic: ready }}\n    overflow_topic: overflow\n"
        )
    };
    let before = RuleSet::parse("before.yaml", &text("")).unwrap();
    let classes = "    classes: { from: \"{attributes.c}\", default: bulk, reserve: { live: 0.34 } }\n";
    let after = RuleSet::parse("after.yaml", &text(classes)).unwrap();
    let (before, after) = (before.rule(&id).unwrap(), after.rule(&id).unwrap());
    let parked: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
    let (mut answers, memory) = (Vec::new(), MemoryStore::new());
    redis.clock().set(T0);
    memory.clock().set(T0);
    for store in [&redis as &dyn Store, &memory] {
        let mut slots = Vec::new();
        // The key is paused until 5 s: its events park (the later ones behind the first).
        store.pause(before, key, T0 + 5 * SECOND).await.unwrap();
        for message in &parked {
            let request = SlotRequest::for_rule(before, key, message, 1).at(T0 + 100);
            assert_eq!(store.reserve(&request).await.unwrap().reservation.status, Status::Parked);
        }
        // The rule gains classes: the key's classes fill the window at 6 s.
        for (message, class) in [("b0", "bulk"), ("b1", "bulk"), ("l0", "live")] {
            let entity = drip_core::rules::Classes::entity(key, class);
            let reserved = store.reserve(&SlotRequest::for_rule(after, &entity, message, 1).at(T0 + 6 * SECOND)).await;
            let reservation = reserved.unwrap().reservation;
            assert_eq!(reservation.status, Status::Reserved);
            slots.push(reservation.slot);
        }
        // The key's drain at 6 s, as the rule is now, books its parked events within 3 s.
        let mut drained = Vec::new();
        for message in &parked {
            let request =
                SlotRequest { unpark: Some(T0 + 9 * SECOND), ..SlotRequest::for_rule(after, key, message, 1) };
            let (unpark, _) = store.unpark(&request.at(T0 + 6 * SECOND)).await.unwrap();
            let Unpark::Decided(reservation) = unpark else { panic!("{key} {message}: {unpark:?}") };
            assert_eq!(reservation.status, Status::Reserved, "{message}");
            drained.push(reservation.slot);
        }
        assert!(drained.iter().all(|&slot| slot >= T0 + 7 * SECOND), "after the classes' full window: {drained:?}");
        slots.extend(&drained);
        let mut per_window = BTreeMap::new();
        for slot in &slots {
            *per_window.entry(slot.div_euclid(SECOND)).or_insert(0) += 1;
        }
        assert!(per_window.values().all(|&n| n <= 3), "every window of the key within 3: {per_window:?}");
        // A pause of the bare key, as the rule is now, is the one its drain and dispatch read.
        store.pause(after, key, T0 + 20 * SECOND).await.unwrap();
        assert_eq!(store.paused_until(after, key).await.unwrap(), Some(T0 + 20 * SECOND), "{key}");
        let request = SlotRequest::for_rule(after, key, "late", 1).at(T0 + 10 * SECOND);
        let parked = store.reserve(&request).await.unwrap().reservation;
        assert_eq!(parked.status, Status::Parked, "{key}: behind its pause");
        // The busiest keys count the bare key and its classes as one key, its own.
        let busiest = store.busiest_keys(after, 10, 10_000_000).await.unwrap();
        let keys: Vec<&str> = busiest.keys.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, [key], "{busiest:?}");
        answers.push(slots);
    }
    assert_eq!(answers[0], answers[1], "{key}: Redis and the model");
}
