//! Adaptive levels from latency reports, and a pause of one class of a key: the model's.

use super::*;

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
