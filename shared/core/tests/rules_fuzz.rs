//! The rules loader under structured mutations of valid files: whatever the input, it answers with
//! a rule set or with errors that name the file, never a panic.

use std::path::Path;

use proptest::prelude::*;
use serde_yaml_ng::Value;

use drip_core::rules::RuleSet;

const EXAMPLES: [&str; 6] = [
    "examples/payouts.yaml",
    "examples/payouts-per-minute.yaml",
    "examples/demo.yaml",
    "examples/sms.yaml",
    "examples/demo-feedback.yaml",
    "shared/core/tests/fixtures/invalid/invalid_budget_beside_valid.yaml",
];

fn example(index: usize) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(EXAMPLES[index]);
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Values a person (or a bad template) might put anywhere in a rules file.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(0i64), Just(-1), Just(1), Just(2), Just(3), Just(i64::MAX), Just(i64::MIN), any::<i64>()]
            .prop_map(|n| Value::Number(n.into())),
        prop_oneof![Just(0.5f64), Just(1e300), Just(-0.0), Just(f64::NAN)].prop_map(|n| Value::Number(n.into())),
        prop_oneof![
            Just("1s"),
            Just("0s"),
            Just("1M"),
            Just("0.5s"),
            Just("99999999999999999d"),
            Just("gcra"),
            Just("sliding"),
            Just("fixed"),
            Just("spread"),
            Just("shadow"),
            Just("{data.x}"),
            Just("{"),
            Just("a"),
            Just("b"),
            Just("sms-budget"),
            Just(""),
            Just("https://x.example/"),
            Just("key"),
            Just("payouts"),
            Just("budget"),
            Just("dlq"),
            Just("{attributes.user}"),
        ]
        .prop_map(|s| Value::String(s.into())),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the value at a path with a scalar.
    Replace(Vec<usize>, Value),
    /// Remove the entry at a path.
    Remove(Vec<usize>),
    /// Duplicate the entry at a path (a sequence element or a mapping value under a new key).
    Duplicate(Vec<usize>),
    /// Wrap the value at a path in a sequence.
    Wrap(Vec<usize>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let path = proptest::collection::vec(0usize..8, 1..6);
    prop_oneof![
        4 => (path.clone(), scalar()).prop_map(|(p, v)| Mutation::Replace(p, v)),
        2 => path.clone().prop_map(Mutation::Remove),
        1 => path.clone().prop_map(Mutation::Duplicate),
        1 => path.prop_map(Mutation::Wrap),
    ]
}

/// The child of `value` chosen by `index` (modulo its size), if it has children.
fn child(value: &mut Value, index: usize) -> Option<&mut Value> {
    match value {
        Value::Sequence(items) if !items.is_empty() => {
            let len = items.len();
            items.get_mut(index % len)
        }
        Value::Mapping(map) if !map.is_empty() => {
            let len = map.len();
            map.values_mut().nth(index % len)
        }
        _ => None,
    }
}

fn has_children(value: &Value) -> bool {
    matches!(value, Value::Sequence(items) if !items.is_empty())
        || matches!(value, Value::Mapping(map) if !map.is_empty())
}

fn apply(value: &mut Value, mutation: &Mutation) {
    let (path, leaf) = match mutation {
        Mutation::Replace(p, _) | Mutation::Remove(p) | Mutation::Duplicate(p) | Mutation::Wrap(p) => {
            (&p[..p.len() - 1], p[p.len() - 1])
        }
    };
    let mut at = value;
    for &index in path {
        if !has_children(at) {
            break;
        }
        at = child(at, index).expect("it has children");
    }
    match (mutation, at) {
        (Mutation::Remove(_), Value::Sequence(items)) if !items.is_empty() => {
            let len = items.len();
            items.remove(leaf % len);
        }
        (Mutation::Remove(_), Value::Mapping(map)) if !map.is_empty() => {
            let key = map.keys().nth(leaf % map.len()).cloned().unwrap();
            map.remove(&key);
        }
        (Mutation::Duplicate(_), Value::Sequence(items)) if !items.is_empty() => {
            let copy = items[leaf % items.len()].clone();
            items.push(copy);
        }
        (Mutation::Duplicate(_), Value::Mapping(map)) if !map.is_empty() => {
            let (key, copy) = map.iter().nth(leaf % map.len()).map(|(k, v)| (k.clone(), v.clone())).unwrap();
            map.insert(Value::String(format!("{}_copy", key.as_str().unwrap_or("k"))), copy);
        }
        (Mutation::Replace(_, scalar), at) => match child(at, leaf) {
            Some(target) => *target = scalar.clone(),
            None => *at = scalar.clone(),
        },
        (Mutation::Wrap(_), at) => {
            let target = if has_children(at) { child(at, leaf).unwrap() } else { at };
            *target = Value::Sequence(vec![target.clone()]);
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn no_mutation_of_a_valid_file_makes_the_loader_panic(
        base in 0..EXAMPLES.len(),
        mutations in proptest::collection::vec(mutation(), 1..5),
    ) {
        let mut value = example(base);
        for mutation in &mutations {
            apply(&mut value, mutation);
        }
        let text = serde_yaml_ng::to_string(&value).unwrap();
        let outcome = std::panic::catch_unwind(|| RuleSet::parse("fuzzed.yaml", &text).map(|_| ()));
        match outcome {
            Err(_) => panic!("the loader panicked on:\n{text}"),
            Ok(Err(errors)) => {
                let message = errors.to_string();
                prop_assert!(message.starts_with("fuzzed.yaml"), "{message}");
            }
            Ok(Ok(())) => {}
        }
    }
}
