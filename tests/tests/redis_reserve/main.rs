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
use drip_store::{Clock, MemoryStore, ParkedBody, RedisStore, Reserved, RuleRef, SlotRequest, Store};
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

mod bounds;
mod differentials;
mod levels;
mod stored;

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
            let carried: Vec<Option<ParkedBody>> = queue
                .iter()
                .map(|&j| {
                    parked_body_of(&scenario.events[j]).map(|body| ParkedBody { body: body.to_vec(), in_entry: true })
                })
                .collect();
            assert_eq!(bodies, carried, "the parked bodies of {key}, kept in their queue entries");
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
