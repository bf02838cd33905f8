//! In-process figures (criterion): the reference model's reservation on one hot key whose backlog
//! grows with every event, and routing an event (rule, key template over a JSON body, cost).
//! What Redis costs is `./run bench`'s job (`shared/store/benches/server.rs`).
//!
//!   cargo bench -p drip-core --bench model

use std::collections::BTreeMap;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use drip_core::event::Event;
use drip_core::routing::{Plan, plan};
use drip_core::rules::{Limit, Placement, RuleSet, Window};
use drip_core::schedule::{ReserveRequest, Scheduler};
use drip_core::time::{DAY, MINUTE, SECOND};

const T0: i64 = 1_785_758_400_000;

fn limit_sets() -> Vec<(&'static str, Vec<Limit>)> {
    let fixed = |limit, per| Limit::new(limit, per, Window::Fixed(Placement::Start)).unwrap();
    vec![
        ("fixed 100 per min", vec![fixed(100, MINUTE)]),
        (
            "fixed 10 per s + 100 per min + 10000 per day",
            vec![fixed(10, SECOND), fixed(100, MINUTE), fixed(10_000, DAY)],
        ),
        ("sliding 100 per min", vec![Limit::new(100, MINUTE, Window::Sliding).unwrap()]),
        ("gcra 10 per s burst 20", vec![Limit::new(10, SECOND, Window::Gcra { burst: 20 }).unwrap()]),
    ]
}

fn reserve(c: &mut Criterion) {
    let mut group = c.benchmark_group("model reserve, one hot key");
    group.throughput(Throughput::Elements(1));
    for (name, limits) in limit_sets() {
        let mut scheduler = Scheduler::new();
        let mut n: u64 = 0;
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    n.to_string()
                },
                |id| {
                    let request = ReserveRequest { max_delay: 3_650 * DAY, ..ReserveRequest::new(&id, &limits, T0) };
                    scheduler.reserve("bench", "hot", &request)
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

const RULES: &str = r#"
default_dlq_topic: drip-dlq
rules:
  - name: payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant.id}"
    cost: "{data.amount_units}"
    limits: [ { limit: 100, per: 1m, window: fixed } ]
    max_delay: 1h
    forward: { topic: payouts-ready }
    overflow_topic: payouts-overflow
"#;

fn route(c: &mut Criterion) {
    let rules = RuleSet::parse("bench.yaml", RULES).expect("the bench rules are valid");
    let attributes = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let data = br#"{"id":"pay_1","amount":1250,"currency":"EUR","merchant":{"id":"m_8421","country":"DE"},"amount_units":3,"memo":"weekly settlement"}"#.to_vec();
    let event = Event::new("1", attributes, data);
    let mut group = c.benchmark_group("routing");
    group.throughput(Throughput::Elements(1));
    group.bench_function("plan: rule, key from a JSON body, cost", |b| {
        b.iter(|| match plan(&rules, std::hint::black_box(&event)) {
            Plan::Reserve { cost, .. } => cost,
            Plan::DeadLetter { detail, .. } => panic!("the bench event is dead-lettered: {detail}"),
        })
    });
    group.finish();
}

criterion_group!(benches, reserve, route);
criterion_main!(benches);
