//! One fixture per invalid rules file, each beside a `.expected` file holding the exact messages.

use std::fs;
use std::path::Path;

use drip_core::rules::RuleSet;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/invalid");

fn messages(name: &str) -> String {
    let text = fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap();
    match RuleSet::parse(name, &text) {
        Ok(_) => panic!("{name} was accepted"),
        Err(errors) => errors.to_string(),
    }
}

#[test]
fn every_invalid_fixture_fails_with_its_exact_messages() {
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for entry in fs::read_dir(FIXTURES).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let actual = messages(&name);
        let expected_path = path.with_extension("expected");
        if std::env::var_os("DRIP_BLESS").is_some() {
            fs::write(&expected_path, format!("{actual}\n")).unwrap();
        }
        let expected = fs::read_to_string(&expected_path).unwrap_or_else(|_| panic!("{name} has no .expected file"));
        if expected.trim_end() != actual {
            mismatches.push(format!("{name}:\n  expected: {}\n  actual:   {actual}", expected.trim_end()));
        }
        checked += 1;
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(checked >= 30, "only {checked} fixtures found");
}

#[test]
fn the_example_rules_are_valid() {
    for name in [
        "examples/payouts.yaml",
        "examples/payouts-per-minute.yaml",
        "examples/demo.yaml",
        "examples/sms.yaml",
        "terraform/examples/basic/rules.yaml",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(name);
        let text = fs::read_to_string(&path).unwrap();
        if let Err(errors) = RuleSet::parse(name, &text) {
            panic!("{errors}");
        }
    }
}

#[test]
fn dead_letter_topics_are_resolved_when_the_file_loads() {
    let rule = |name: &str, matcher: &str, dlq: &str| {
        format!(
            "  - name: {name}\n{matcher}    key: k\n    limits: [ {{ limit: 1, per: 1s, window: fixed }} ]\n    max_delay: 1m\n    forward: {{ topic: ready }}\n    overflow_topic: overflow\n{dlq}"
        )
    };
    let matched = "    match: { attributes: { t: a } }\n";
    let with_default = format!(
        "default_dlq_topic: everyone-dlq\nrules:\n{}{}",
        rule("own", matched, "    dlq_topic: own-dlq\n"),
        rule("inherits", "    match: { attributes: { t: b } }\n", "")
    );
    let rules =
        drip_core::rules::ServiceRules::new(RuleSet::parse("a.yaml", &with_default).unwrap(), "a.yaml").unwrap();
    assert_eq!(rules.dlq_topic_for(rules.rule("own")), "own-dlq");
    assert_eq!(rules.dlq_topic_for(rules.rule("inherits")), "everyone-dlq");
    assert_eq!(rules.dlq_topic_for(None), "everyone-dlq");

    let catch_all = format!(
        "rules:\n{}{}",
        rule("own", matched, "    dlq_topic: own-dlq\n"),
        rule("rest", "", "    dlq_topic: rest-dlq\n")
    );
    let rules = drip_core::rules::ServiceRules::new(RuleSet::parse("b.yaml", &catch_all).unwrap(), "b.yaml").unwrap();
    assert_eq!(rules.dlq_topic_for(None), "rest-dlq", "what no rule takes goes to the catch-all's topic");

    let neither = format!("rules:\n{}", rule("own", matched, "    dlq_topic: own-dlq\n"));
    let parsed = RuleSet::parse("c.yaml", &neither).expect("valid for check-config and simulate");
    let error = drip_core::rules::ServiceRules::new(parsed, "c.yaml").unwrap_err().to_string();
    assert!(error.contains("c.yaml") && error.contains("default_dlq_topic") && error.contains("required"), "{error}");
}

#[test]
fn topic_names_are_checked_when_made() {
    use drip_core::rules::TopicName;
    for good in ["payouts-ready", "projects/p-1/topics/payouts.v2", "abc"] {
        assert_eq!(TopicName::new(good).unwrap().as_str(), good);
    }
    for bad in ["ab", "9lives", "goog-topic", "has space", "projects//topics/x", "projects/p/subscriptions/x", ""] {
        let error = TopicName::new(bad).unwrap_err();
        assert!(error.contains(&format!("'{bad}'")), "{bad}: {error}");
    }
}

#[test]
fn a_limit_is_valid_when_made_or_not_at_all() {
    use drip_core::rules::{InvalidLimit, Limit, MAX_WINDOW, Placement, Window};
    use drip_core::time::MINUTE;
    let fixed = Window::Fixed(Placement::Start);
    let limit = Limit::new(100, MINUTE, fixed).unwrap();
    assert_eq!((limit.limit(), limit.per(), limit.window()), (100, MINUTE, fixed));
    assert_eq!(Limit::new(0, MINUTE, fixed), Err(InvalidLimit::ZeroLimit));
    assert_eq!(Limit::new(1, 0, fixed), Err(InvalidLimit::EmptyPeriod));
    assert_eq!(Limit::new(1, -5, Window::Sliding), Err(InvalidLimit::EmptyPeriod));
    assert_eq!(Limit::new(1, MAX_WINDOW + 1, fixed), Err(InvalidLimit::PeriodTooLong(MAX_WINDOW + 1)));
    assert!(Limit::new(1, MAX_WINDOW, fixed).is_ok());
    assert_eq!(Limit::new(1, MINUTE, Window::Gcra { burst: 0 }), Err(InvalidLimit::ZeroBurst));
    assert_eq!(InvalidLimit::ZeroBurst.field(), "burst");
    assert_eq!(
        InvalidLimit::PeriodTooLong(32 * 24 * 60 * MINUTE).to_string(),
        "32.0 days is over 31d, the longest supported window"
    );
}

#[test]
fn an_override_names_one_of_the_rule_s_limits_by_its_period() {
    let text = "default_dlq_topic: dlq\nrules:\n  - name: payouts\n    key: k\n    limits:\n      - { limit: 100, per: 1m, window: fixed }\n      - { limit: 10, per: 1s, window: fixed }\n      - { limit: 50, per: 1s, window: sliding }\n    max_delay: 1h\n    forward: { topic: ready }\n    overflow_topic: overflow\n";
    let rules = RuleSet::parse("o.yaml", text).unwrap();
    let rule = rules.rule("payouts").unwrap();
    let (limit, count) = rule.override_target("500/1m", None).unwrap();
    assert_eq!((limit.limit(), limit.per(), count), (100, 60_000, 500));
    let (limit, count) = rule.override_target("20/1s", Some("sliding")).unwrap();
    assert_eq!((limit.limit(), count), (50, 20));
    assert!(rule.override_target("20/1s", None).unwrap_err().contains("several limits per 1s"));
    assert!(rule.override_target("20/1h", None).unwrap_err().contains("no limit per 1h"));
    assert!(rule.override_target("0/1m", None).unwrap_err().contains("at least 1"));
    assert!(rule.override_target("500", None).unwrap_err().contains("COUNT/PERIOD"));
}

#[test]
fn budgets_linked_by_a_rule_share_one_hash_tag_and_rules_resolve_them() {
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sms.yaml")).unwrap();
    let rules = RuleSet::parse("sms.yaml", &text).unwrap();
    let sms = rules.rule("sms").unwrap();
    assert_eq!(sms.budget_tag(), Some("sms-gateway"));
    assert_eq!(sms.feedback_budget().map(|b| b.name.as_str()), Some("sms-gateway"));
    assert_eq!(sms.budgets[0].max_share, Some(200_000));
    assert!(rules.rule("kyc").unwrap().adaptive.is_some() && rules.rule("kyc").unwrap().budget_tag().is_none());

    let linked = "budgets:\n  zeta: [ { limit: 5, per: 1s } ]\n  alpha: [ { limit: 5, per: 1s } ]\n  mid: [ { limit: 5, per: 1s } ]\n  alone: [ { limit: 5, per: 1s } ]\nrules:\n".to_owned()
        + &["  - { name: a, match: { attributes: { t: a } }, key: k, limits: [ { limit: 1, per: 1s } ], max_delay: 1m, forward: { topic: ready }, overflow_topic: overflow, dlq_topic: dlq, budgets: [zeta, mid] }\n",
            "  - { name: b, match: { attributes: { t: b } }, key: k, limits: [ { limit: 1, per: 1s } ], max_delay: 1m, forward: { topic: ready }, overflow_topic: overflow, dlq_topic: dlq, budgets: [alpha, mid] }\n"]
            .concat();
    let rules = RuleSet::parse("linked.yaml", &linked).unwrap();
    let tag = |name: &str| rules.budgets[name].tag.clone();
    assert_eq!((tag("zeta"), tag("mid"), tag("alpha")), ("alpha".into(), "alpha".into(), "alpha".into()));
    assert_eq!(tag("alone"), "alone");
    assert_eq!(rules.rule("a").unwrap().budget_tag(), Some("alpha"));
}

#[test]
fn a_budget_floor_is_held_for_a_rule_or_for_named_keys_of_a_rule_by_its_id() {
    let text = "budgets:\n  gateway:\n    limits: [ { limit: 100, per: 1s } ]\n    floors: { otp: 0.1, alerts: { tenant_7: 0.05, tenant_9: 0.2 } }\nrules:\n".to_owned()
        + &["  - { name: otp, match: { attributes: { t: otp } }, key: k, limits: [ { limit: 10, per: 1s } ], max_delay: 1m, forward: { topic: ready }, overflow_topic: overflow, dlq_topic: dlq, budgets: [gateway] }\n",
            "  - { name: alerts, id: alerts-v1, match: { attributes: { t: alerts } }, key: k, limits: [ { limit: 10, per: 1s } ], max_delay: 1m, forward: { topic: ready }, overflow_topic: overflow, dlq_topic: dlq, budgets: [gateway] }\n"]
            .concat();
    let rules = RuleSet::parse("floors.yaml", &text).unwrap();
    let gateway = &rules.budgets["gateway"];
    let floors: Vec<(&str, u64)> = gateway.floors.iter().map(|(m, f)| (m.as_str(), *f)).collect();
    assert_eq!(floors, [("alerts-v1|tenant_7", 50_000), ("alerts-v1|tenant_9", 200_000), ("otp", 100_000)]);
    assert_eq!(gateway.floor_member("alerts-v1", "tenant_9"), "alerts-v1|tenant_9");
    assert_eq!(gateway.floor_member("alerts-v1", "tenant_8"), "alerts-v1");
    assert_eq!(gateway.floor_member("otp", "tenant_7"), "otp");
}

/// A leased budget takes an adaptive limit (its home's level binds every partition: docs/rules.md,
/// "A budget past one shard"), with a latency controller too.
#[test]
fn a_leased_budget_may_be_adaptive() {
    let text = "budgets:\n  gateway:\n    limits: [ { limit: 20000, per: 1s } ]\n    leases: { partitions: 3 }\n    adaptive: { margin: 0.1, decrease: 0.9, min: 0.2, step: 0.1, latency: { tolerance: 2.0 } }\nrules:\n  - { name: otp, match: { attributes: { kind: otp } }, key: k, limits: [ { limit: 10, per: 1s } ], max_delay: 1h, forward: { topic: ready }, overflow_topic: overflow, dlq_topic: dlq, budgets: [gateway] }\n";
    let rules = RuleSet::parse("leased.yaml", text).unwrap_or_else(|errors| panic!("{errors}"));
    let gateway = &rules.budgets["gateway"];
    assert_eq!(gateway.leases.map(|l| l.partitions), Some(3));
    assert!(gateway.adaptive.is_some_and(|a| a.latency.is_some()));
}
