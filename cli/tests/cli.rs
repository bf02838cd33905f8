//! The `drip` binary as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use drip_tests::redis_server::shared_url;
use drip_tests::unique;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn drip(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drip")).args(args).output().expect("run drip")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Every rules file in `examples/` is one a user can start from as it is.
#[test]
fn check_config_says_ok_for_every_example() {
    let mut examples: Vec<String> = std::fs::read_dir(repo("examples"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .map(|path| path.display().to_string())
        .collect();
    examples.sort();
    assert!(examples.len() >= 5, "{examples:?}");
    let mut args = vec!["check-config"];
    args.extend(examples.iter().map(String::as_str));
    let output = drip(&args);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output), "ok\n");
}

#[test]
fn check_config_prints_every_error_and_fails() {
    let fixtures = repo("shared/core/tests/fixtures/invalid");
    let file = fixtures.join("several_errors.yaml");
    let output = drip(&["check-config", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let expected = std::fs::read_to_string(fixtures.join("several_errors.expected")).unwrap();
    let printed =
        stdout(&output).replace(&format!("{}", fixtures.display()), "").replace("/several_errors", "several_errors");
    assert_eq!(printed.trim_end(), expected.trim_end());
    assert_eq!(printed.lines().count(), 4);
    let good = repo("examples/payouts-per-minute.yaml");
    let json = drip(&["check-config", "--output", "json", file.to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(json.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["files"][0]["errors"].as_array().unwrap().len(), 4, "{report}");
    assert!(
        report["files"][0]["errors"][0]["field"].is_string() && report["files"][0]["errors"][0]["message"].is_string()
    );
    assert_eq!(
        (report["files"][1]["ok"].clone(), report["files"][1]["errors"].clone()),
        (true.into(), serde_json::json!([]))
    );
}

/// A gcra limit takes `burst` units at once (default 1): with a cost template, an event of cost 2
/// would be dead-lettered while the file looks fine. check-config warns, naming the rule and field,
/// and still says ok; a constant cost above the burst is refused outright.
#[test]
fn check_config_warns_of_a_cost_template_above_a_gcra_burst() {
    let dir = std::env::temp_dir().join(format!("drip-gcra-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rule = |cost: &str, burst: &str| {
        format!(
            "default_dlq_topic: dlq\nrules:\n  - name: sms\n    key: \"user_{{data.user}}\"\n    cost: \"{cost}\"\n    limits: [ {{ limit: 5, per: 1s, window: gcra{burst} }} ]\n    max_delay: 1h\n    forward: {{ topic: ready }}\n    overflow_topic: over\n"
        )
    };
    let file = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let template = file("template.yaml", rule("{data.parts}", ""));
    let output = drip(&["check-config", &template]);
    assert!(output.status.success(), "{output:?}");
    let printed = stdout(&output);
    assert!(printed.starts_with(&format!("warning: {template}: rule 'sms': limits[0].burst: ")), "{printed}");
    assert!(printed.contains("at most 1 unit at once") && printed.ends_with("ok\n"), "{printed}");
    let json: serde_json::Value =
        serde_json::from_slice(&drip(&["check-config", "--output", "json", &template]).stdout).unwrap();
    assert_eq!(json["files"][0]["warnings"][0]["field"], "limits[0].burst", "{json}");
    let wide = file("wide.yaml", rule("{data.parts}", ", burst: 5"));
    assert_eq!(stdout(&drip(&["check-config", &wide])), "ok\n", "a burst as large as the count: nothing to warn of");
    let constant = file("constant.yaml", rule("2", ""));
    let refused = drip(&["check-config", &constant]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stdout(&refused).contains("cost: 2 exceeds limits[0].burst 1"), "{}", stdout(&refused));
}

fn simulate(store: &str, extra: &[&str]) -> Output {
    let rules = repo("examples/payouts-per-minute.yaml");
    let events = repo("examples/payouts-burst.jsonl");
    let mut args =
        vec!["simulate", "--rules", rules.to_str().unwrap(), "--events", events.to_str().unwrap(), "--store", store];
    args.extend_from_slice(extra);
    drip(&args)
}

/// The reference example: 100 per minute, 500 events at 12:00:01.
#[test]
fn simulate_prints_the_reference_schedule_and_redis_prints_exactly_the_same() {
    let chart = std::env::temp_dir().join(format!("{}.svg", unique("reference-chart")));
    let memory = simulate("memory", &["--plot", chart.to_str().unwrap()]);
    assert!(memory.status.success(), "{memory:?}");
    let lines: Vec<serde_json::Value> = stdout(&memory).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 500);
    let mut per_slot = std::collections::BTreeMap::<String, (usize, String)>::new();
    for line in &lines {
        let entry = per_slot.entry(line["scheduledFor"].as_str().unwrap().to_owned()).or_default();
        entry.0 += 1;
        entry.1 = line["decision"].as_str().unwrap().to_owned();
        assert_eq!(line["key"], "merchant_8421:payout");
        assert_eq!(line["reason"], serde_json::Value::Null);
    }
    let expected: Vec<(&str, (usize, &str))> = vec![
        ("2026-08-03T12:00:01.000Z", (100, "forward")),
        ("2026-08-03T12:01:00.000Z", (100, "delay")),
        ("2026-08-03T12:02:00.000Z", (100, "delay")),
        ("2026-08-03T12:03:00.000Z", (100, "delay")),
        ("2026-08-03T12:04:00.000Z", (100, "delay")),
    ];
    let actual: Vec<(&str, (usize, &str))> =
        per_slot.iter().map(|(k, (n, d))| (k.as_str(), (*n, d.as_str()))).collect();
    assert_eq!(actual, expected);

    let summary = String::from_utf8_lossy(&memory.stderr);
    assert!(summary.contains("500 events: 100 forward, 400 delay, 0 dlq"), "{summary}");
    assert!(summary.contains("2026-08-03T12:04:00.000Z  100   100"), "{summary}");
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("limit 100") && svg.contains("merchant_8421:payout"));
    std::fs::remove_file(chart).unwrap();
    let table = simulate("memory", &["--output", "table"]);
    let rows: Vec<String> =
        stdout(&table).lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(rows.len(), 500);
    let first = &lines[0];
    let row = format!(
        "{} payouts merchant_8421:payout forward {}",
        first["id"].as_str().unwrap(),
        first["scheduledFor"].as_str().unwrap()
    );
    assert_eq!(rows[0], row, "a line per decision, as the JSON says");

    let namespace = unique("simulate");
    let redis = simulate(&shared_url(), &["--namespace", &namespace]);
    assert!(redis.status.success(), "{redis:?}");
    assert_eq!(stdout(&redis), stdout(&memory));
    let rerun = simulate(&shared_url(), &["--namespace", &namespace]);
    assert_eq!(stdout(&rerun), stdout(&memory), "a rerun replays the answers kept per message id");
    // The 500 share one publishTime: 64 a call, one merchant's state read and written once a call.
    let batched = simulate(&shared_url(), &["--namespace", &unique("simulate-batched"), "--batch", "64"]);
    assert!(batched.status.success(), "{batched:?}");
    assert_eq!(stdout(&batched), stdout(&memory), "in batches, the same decisions");
}

#[test]
fn simulate_dead_letters_with_reasons_and_both_stores_agree() {
    let dir = std::env::temp_dir().join(unique("simulate-dlq"));
    std::fs::create_dir_all(&dir).unwrap();
    let events = dir.join("events.jsonl");
    std::fs::write(
        &events,
        [
            r#"{"id":"a","publishTime":"2026-08-03T12:00:00Z","attributes":{"event_type":"payout"},"data":{"merchant_id":1}}"#,
            r#"{"id":"b","publishTime":"2026-08-03T12:00:00Z","attributes":{"event_type":"payout"},"data":{}}"#,
            r#"{"id":"c","publishTime":"2026-08-03T12:00:00Z","attributes":{"event_type":"payout"},"dataBase64":"bm90IGpzb24="}"#,
            r#"{"id":"d","publishTime":"2026-08-03T12:00:00Z","attributes":{"event_type":"sms"},"data":{"user":{"id":5},"parts":25}}"#,
            r#"{"id":"e","publishTime":"2026-08-03T12:00:00Z","attributes":{"event_type":"sms"},"data":{"user":{"id":5},"parts":"two"}}"#,
            r#"{"id":"f","publishTime":"2026-08-03T12:00:00Z","attributes":{"event_type":"kyc_submit"},"data":{}}"#,
            r#"{"id":"g","publishTime":"2026-08-03T12:00:00Z","attributes":{},"data":{}}"#,
            r#"{"id":"a","publishTime":"2026-08-03T12:00:05Z","attributes":{"event_type":"payout"},"data":{"merchant_id":1}}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let rules = repo("examples/payouts.yaml");
    let run = |store: &str| {
        let namespace = unique("dlq");
        drip(&[
            "simulate",
            "--rules",
            rules.to_str().unwrap(),
            "--events",
            events.to_str().unwrap(),
            "--store",
            store,
            "--namespace",
            &namespace,
        ])
    };
    let memory = run("memory");
    assert!(memory.status.success(), "{memory:?}");
    let decisions: Vec<(String, String)> = stdout(&memory)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["decision"].as_str().unwrap().to_owned(), v["reason"].as_str().unwrap_or("-").to_owned())
        })
        .collect();
    let expected = [
        ("forward", "-"),
        ("dlq", "missing_key_field"),
        ("dlq", "non_json_body"),
        ("dlq", "cost_exceeds_limit"),
        ("dlq", "invalid_cost"),
        ("forward", "-"),
        ("dlq", "missing_key_field"),
        ("forward", "-"),
    ];
    let expected: Vec<(String, String)> = expected.iter().map(|(d, r)| (d.to_string(), r.to_string())).collect();
    assert_eq!(decisions, expected);
    assert_eq!(stdout(&run(&shared_url())), stdout(&memory));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn simulate_names_the_line_of_a_malformed_event() {
    let dir = std::env::temp_dir().join(unique("simulate-bad"));
    std::fs::create_dir_all(&dir).unwrap();
    let events = dir.join("events.jsonl");
    std::fs::write(&events, "{\"id\":\"a\",\"publishTime\":\"2026-08-03T12:00:00Z\",\"data\":{}}\n{\"id\":\"b\",\"publishTime\":\"yesterday\"}\n").unwrap();
    let rules = repo("examples/payouts-per-minute.yaml");
    let output = drip(&["simulate", "--rules", rules.to_str().unwrap(), "--events", events.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("events.jsonl:2") && stderr.contains("invalid timestamp 'yesterday'"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Reserves 250 payouts for one merchant on `url` (a cluster node when `cluster`; `ca` the PEM file
/// of the CA for `rediss://`), then runs `drip inspect` against it with the services' connection
/// code: 100 now, 100 next minute, 50 after.
fn inspect_after_a_burst(url: &str, cluster: bool, ca: Option<&std::path::Path>) {
    use drip_store::{AnyConnection, RedisSettings, RedisStore, SlotRequest, Store};
    let rules_path = repo("examples/payouts-per-minute.yaml");
    let rules = drip_core::rules::RuleSet::load(&rules_path).unwrap();
    let rule = rules.rule("payouts").unwrap();
    let namespace = unique("inspect");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let into_minute = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() % 60_000;
    if into_minute > 57_000 {
        std::thread::sleep(std::time::Duration::from_millis((60_500 - into_minute) as u64));
    }
    runtime.block_on(async {
        let settings = RedisSettings {
            url: url.to_owned(),
            ca_cert_pem: ca.map(|path| std::fs::read(path).unwrap()),
            cluster,
            response_timeout: std::time::Duration::from_secs(5),
            tokens: None,
        };
        let store = RedisStore::new(AnyConnection::connect(&settings).await.unwrap(), namespace.clone());
        for i in 0..250 {
            let id = format!("m{i}");
            let request = SlotRequest::for_rule(rule, "merchant_1:payout", &id, 1);
            store.reserve(&request).await.unwrap();
        }
    });
    let inspect = |extra: &[&str]| {
        let mut args =
            vec!["inspect", "--redis", url, "--rules", rules_path.to_str().unwrap(), "--namespace", &namespace];
        if cluster {
            args.push("--redis-cluster");
        }
        let ca = ca.map(|path| path.to_str().unwrap());
        if let Some(ca) = ca {
            args.extend(["--redis-ca-cert", ca]);
        }
        args.extend_from_slice(extra);
        args.extend(["payouts", "merchant_1:payout"]);
        drip(&args)
    };
    let output = inspect(&["--output", "json"]);
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let mut legacy: serde_json::Value = serde_json::from_str(&stdout(&inspect(&["--json"]))).unwrap();
    legacy["now"] = report["now"].clone();
    assert_eq!(legacy, report, "--json is --output json (but for the time it was read)");
    assert_eq!(report["backlog"], 150, "100 now, 100 next minute, 50 the one after: {report}");
    assert!(report["drainsAt"].as_str().unwrap().ends_with(":00.000Z"));
    let text = inspect(&[]);
    assert!(stdout(&text).contains("backlog    150 events ahead, drains at"), "{}", stdout(&text));
    assert!(stdout(&text).contains("waiting    100 per 1m (fixed): full (100 of 100) until"), "{}", stdout(&text));
}

/// `drip inspect RULE KEY` of a rule with classes, straight from Redis: the key's classes
/// together (each one's backlog), its calendar and each reserve; `KEY#CLASS` is one class.
#[test]
fn inspect_shows_a_key_s_classes_and_their_reserves() {
    let rules_path = std::env::temp_dir().join(format!("{}.yaml", unique("classes")));
    std::fs::write(
        &rules_path,
        "default_dlq_topic: dlq\nrules:\n  - name: settlements\n    key: \"merchant_{attributes.m}\"\n    limits: [ { limit: 10, per: 1h } ]\n    classes: { from: \"{attributes.p}\", default: bulk, reserve: { live: 0.2 } }\n    max_delay: 30d\n    forward: { topic: ready }\n    overflow_topic: overflow\n",
    )
    .unwrap();
    let rules = drip_core::rules::RuleSet::load(&rules_path).unwrap();
    let rule = rules.rule("settlements").unwrap();
    let namespace = unique("inspect-classes");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let connection = drip_tests::redis_server::shared_connection().await;
        let store = drip_store::RedisStore::new(connection, namespace.clone());
        use drip_store::Store;
        for (i, class) in ["bulk"; 26].into_iter().chain(["live"; 3]).enumerate() {
            let (key, id) = (format!("merchant_7#{class}"), format!("m{i}"));
            store.reserve(&drip_store::SlotRequest::for_rule(rule, &key, &id, 1)).await.unwrap();
        }
    });
    let url = shared_url();
    let inspect = |key: &str| {
        let args = ["inspect", "--redis", &url, "--rules", rules_path.to_str().unwrap(), "--namespace", &namespace];
        stdout(&drip(&[&args[..], &["settlements", key]].concat()))
    };
    let whole = inspect("merchant_7");
    assert!(whole.contains("backlog    19 events ahead"), "16 bulk and 3 live after this hour: {whole}");
    assert!(whole.contains("class      live: 3 events ahead"), "{whole}");
    assert!(whole.contains("class      bulk: 16 events ahead"), "{whole}");
    assert!(whole.contains("budget     classes of merchant_7"), "{whole}");
    assert!(whole.contains("reserve live 0.2: 2 of 10 units of each 10 per 1h (fixed) window"), "{whole}");
    let live = inspect("merchant_7#live");
    assert!(live.contains("backlog    3 events ahead") && !live.contains("class      "), "one class: {live}");
    std::fs::remove_file(&rules_path).ok();
}

#[test]
fn inspect_reports_an_entity_waiting_in_redis() {
    inspect_after_a_burst(&shared_url(), false, None);
}

/// `drip pause` holds a key (inspect says until when), is audited, and `drip resume` lifts it; a
/// pause longer than a week is refused.
#[test]
fn a_key_paused_from_the_cli_waits_until_resumed() {
    let rules_path = repo("examples/payouts-per-minute.yaml");
    let namespace = unique("pause");
    let url = shared_url();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--redis", &url, "--rules", rules_path.to_str().unwrap(), "--namespace", &namespace]);
        drip(&all)
    };
    let paused = run(&[
        "pause",
        "payouts",
        "merchant_1:payout",
        "--for",
        "10m",
        "--reason",
        "partner maintenance",
        "--output",
        "json",
    ]);
    assert!(paused.status.success(), "{paused:?}");
    let paused: serde_json::Value = serde_json::from_str(&stdout(&paused)).unwrap();
    let until = paused["pausedUntil"].as_str().expect("paused").to_owned();
    assert_eq!(paused["change"]["paused_until"], until.as_str());
    let inspected = stdout(&run(&["inspect", "payouts", "merchant_1:payout"]));
    assert!(inspected.contains(&format!("paused     until {until}")), "{inspected}");
    let history = stdout(&run(&["limits", "history", "--rule", "payouts"]));
    assert!(history.contains(&format!("payouts merchant_1:payout paused key until {until}")), "{history}");
    assert!(history.contains("partner maintenance"), "{history}");
    let resumed = stdout(&run(&["resume", "payouts", "merchant_1:payout"]));
    assert!(resumed.contains(&format!("lifted the pause until {until}")), "{resumed}");
    let too_long = run(&["pause", "payouts", "merchant_1:payout", "--for", "8d"]);
    assert!(!too_long.status.success());
    assert!(String::from_utf8_lossy(&too_long.stderr).contains("at most 7d"), "{too_long:?}");
}

#[test]
fn inspect_reaches_redis_over_tls_with_auth_and_a_private_ca() {
    let redis = drip_tests::redis_tls::start();
    let url = format!("rediss://:{}@127.0.0.1:{}/", drip_tests::redis_tls::PASSWORD, redis.port);
    inspect_after_a_burst(&url, false, Some(&redis.dir.join("ca.pem")));
}

#[test]
fn inspect_reaches_a_redis_cluster_as_the_services_do() {
    let cluster = drip_tests::redis_server::RedisCluster::start();
    // Any node will do: the cluster client follows the slot map.
    inspect_after_a_burst(&cluster.urls()[1], true, None);
}

/// `drip limits` on `url`: an override set from the CLI applies to the next reservations, shows in
/// `get`, `list`, `inspect` and `history`, and is gone after `delete`.
fn limits_through_the_cli(url: &str, cluster: bool) {
    use drip_store::{AnyConnection, RedisSettings, RedisStore, SlotRequest, Store};
    let rules_path = repo("examples/payouts-per-minute.yaml");
    let rules = drip_core::rules::RuleSet::load(&rules_path).unwrap();
    let rule = rules.rule("payouts").unwrap();
    let namespace = unique("limits");
    let limits = |args: &[&str]| {
        let mut all = vec!["limits", args[0], "--redis", url, "--rules", rules_path.to_str().unwrap()];
        all.extend(["--namespace", &namespace, "--rule", "payouts"]);
        if cluster {
            all.push("--redis-cluster");
        }
        all.extend_from_slice(&args[1..]);
        let output = drip(&all);
        assert!(output.status.success(), "{args:?}: {output:?}");
        stdout(&output)
    };
    let set = limits(&[
        "set",
        "--key",
        "merchant_8421:payout",
        "--limit",
        "150/1m",
        "--expires",
        "2099-12-31",
        "--reason",
        "the partner raised our quota",
    ]);
    assert!(
        set.contains(
            "payouts merchant_8421:payout 100 per 1m (fixed): the rule's -> 150 until 2100-01-01T00:00:00.000Z"
        ),
        "{set}"
    );
    assert!(limits(&["get", "--key", "merchant_8421:payout"]).contains("100 per 1m (fixed): 150 until 2100-01-01"));
    let json = |text: String| serde_json::from_str::<serde_json::Value>(&text).expect("--output json prints JSON");
    let got = json(limits(&["get", "--key", "merchant_8421:payout", "--output", "json"]));
    assert_eq!(got["key"], "merchant_8421:payout");
    let expected = serde_json::json!([
        {"limit": "100 per 1m (fixed)", "count": 150, "until": "2100-01-01T00:00:00.000Z", "inForce": true}
    ]);
    assert_eq!(got["overrides"], expected);
    let listed = json(limits(&["list", "--output", "json"]));
    assert_eq!(listed[0]["key"], "merchant_8421:payout");
    assert_eq!(listed[0]["overrides"], got["overrides"]);
    assert!(limits(&["list"]).starts_with("merchant_8421:payout\n  100 per 1m (fixed): 150"));
    // A new count without --expires keeps the override's end; an end in the past is refused.
    let again = limits(&["set", "--key", "merchant_8421:payout", "--limit", "150/1m"]);
    assert!(again.contains("150 until 2100-01-01T00:00:00.000Z -> 150 until 2100-01-01T00:00:00.000Z"), "{again}");
    let mut past = vec!["limits", "set", "--redis", url, "--rules", rules_path.to_str().unwrap()];
    past.extend(["--namespace", &namespace, "--rule", "payouts", "--key", "merchant_8421:payout"]);
    past.extend(["--limit", "150/1m", "--expires", "2020-01-01"]);
    if cluster {
        past.push("--redis-cluster");
    }
    let refused = drip(&past);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--expires 2020-01-01: the end 2020-01-02T00:00:00.000Z is in the past"), "{stderr}");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let connect = async || {
        let settings = RedisSettings {
            url: url.to_owned(),
            ca_cert_pem: None,
            cluster,
            response_timeout: std::time::Duration::from_secs(5),
            tokens: None,
        };
        RedisStore::new(AnyConnection::connect(&settings).await.unwrap(), namespace.clone())
    };
    let reserve = |key: &str, count: usize| {
        runtime.block_on(async {
            let store = connect().await;
            let now = drip_core::time::wall_clock_millis();
            let mut slots = Vec::new();
            for _ in 0..count {
                let id = unique("m");
                let request = SlotRequest::for_rule(rule, key, &id, 1).at(now).published(Some(now));
                slots.push(store.reserve(&request).await.unwrap().reservation.slot);
            }
            slots.into_iter().filter(|&slot| slot == now).count()
        })
    };
    assert_eq!(reserve("merchant_8421:payout", 200), 150, "150 this minute for the overridden merchant");
    assert_eq!(reserve("merchant_7:payout", 200), 100, "the rule's 100 for another");

    let deleted = json(limits(&["delete", "--key", "merchant_8421:payout", "--per", "1m", "--output", "json"]));
    assert_eq!(deleted["before"]["limit"], 150, "{deleted}");
    assert_eq!(deleted["after"], serde_json::Value::Null, "{deleted}");
    assert_eq!(limits(&["list"]), "no overrides for rule payouts\n");
    // A /v1/feedback call, as the limiter records it, is in the same history.
    runtime.block_on(async {
        let store = connect().await;
        let call = drip_store::FeedbackChange {
            at: 0,
            by: "consumer@example.iam.gserviceaccount.com".into(),
            rule: rule.id.clone(),
            key: "merchant_7:payout".into(),
            target: "key".into(),
            status: 429,
            retry_after: Some(30),
            paused_before: None,
            paused_after: Some(30_000),
            adaptive_level: None,
        };
        drip_store::Store::record_audit(&store, &drip_store::AuditEntry::Feedback(call)).await.unwrap();
    });
    let history = limits(&["history"]);
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 4, "{history}");
    let entries = json(limits(&["history", "--output", "json"]));
    assert_eq!(entries.as_array().map(Vec::len), Some(4), "{entries}");
    assert_eq!(
        (entries[0]["status"].clone(), entries[3]["reason"].clone()),
        (429.into(), "the partner raised our quota".into())
    );
    assert_eq!(
        lines[0],
        "payouts merchant_7:payout feedback 429 (Retry-After 30 s) on key: paused until 1970-01-01T00:00:30.000Z \
         (was none) (by consumer@example.iam.gserviceaccount.com at 1970-01-01T00:00:00.000Z)"
    );
    assert!(lines[1].contains("-> the rule's") && lines[3].contains("the rule's -> 150"), "newest first: {history}");
    assert!(lines[1].contains("(drip limits)"), "who: {history}");
    assert!(lines[3].ends_with(": the partner raised our quota)"), "why: {history}");
}

#[test]
fn limits_are_set_listed_and_deleted_from_the_cli() {
    limits_through_the_cli(&shared_url(), false);
}

#[test]
fn limits_work_on_a_redis_cluster() {
    let cluster = drip_tests::redis_server::RedisCluster::start();
    limits_through_the_cli(&cluster.urls()[0], true);
}

#[test]
fn rules_diff_says_which_edits_need_care() {
    let old = repo("examples/payouts.yaml");
    let text = std::fs::read_to_string(&old).unwrap();
    let dir = std::env::temp_dir();
    let write = |name: &str, text: String| {
        let path = dir.join(format!("{}.yaml", unique(name)));
        std::fs::write(&path, text).unwrap();
        path
    };
    let same = drip(&["rules", "diff", old.to_str().unwrap(), old.to_str().unwrap(), "--check"]);
    assert!(same.status.success());
    assert_eq!(stdout(&same), "no rule changes\n");

    let raised = write("raised", text.replacen("limit: 100,", "limit: 500,", 1));
    let output = drip(&["rules", "diff", old.to_str().unwrap(), raised.to_str().unwrap(), "--check"]);
    assert!(output.status.success(), "a raised limit is safe: {output:?}");
    assert!(
        stdout(&output).contains("payouts (id payouts)\n  safe        limit 100 per 1m (fixed) -> 500 per 1m (fixed)"),
        "{}",
        stdout(&output)
    );

    let rekeyed = write(
        "rekeyed",
        text.replacen("key: \"tenant_{data.merchant_id}:payouts\"", "key: \"m_{data.merchant_id}\"", 1),
    );
    let output = drip(&["rules", "diff", old.to_str().unwrap(), rekeyed.to_str().unwrap(), "--check"]);
    assert_eq!(output.status.code(), Some(1), "a key change needs care: {output:?}");
    assert!(
        stdout(&output).contains("needs care  key \"tenant_{data.merchant_id}:payouts\" -> \"m_{data.merchant_id}\""),
        "{}",
        stdout(&output)
    );
    let without_check = drip(&["rules", "diff", old.to_str().unwrap(), rekeyed.to_str().unwrap()]);
    assert!(without_check.status.success());
    let json = drip(&["rules", "diff", old.to_str().unwrap(), rekeyed.to_str().unwrap(), "--output", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["needsCare"], true, "{report}");
    let edits = report["rules"][0]["edits"].as_array().unwrap();
    assert!(
        edits.iter().any(|e| e["safety"] == "needs care" && e["what"].as_str().unwrap().starts_with("key ")),
        "{report}"
    );
}

#[test]
fn simulate_says_what_a_shadow_rule_would_do() {
    let dir = std::env::temp_dir().join(unique("simulate-shadow"));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "default_dlq_topic: dlq\nrules:\n  - name: trial\n    mode: shadow\n    key: k\n    limits: [ { limit: 1, per: 1m, window: fixed } ]\n    max_delay: 1h\n    forward: { topic: ready }\n    overflow_topic: overflow\n",
    )
    .unwrap();
    let events = dir.join("events.jsonl");
    let line =
        |id: &str| format!(r#"{{"id":"{id}","publishTime":"2026-08-03T12:00:00Z","attributes":{{}},"data":{{}}}}"#);
    std::fs::write(&events, [line("a"), line("b")].join("\n")).unwrap();
    let output = drip(&["simulate", "--rules", rules.to_str().unwrap(), "--events", events.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let lines: Vec<serde_json::Value> = stdout(&output).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!((lines[0]["decision"].as_str(), lines[0]["shadow"].as_bool()), (Some("forward"), Some(true)));
    assert_eq!((lines[1]["decision"].as_str(), lines[1]["shadow"].as_bool()), (Some("delay"), Some(true)));
    assert_eq!(lines[1]["scheduledFor"], "2026-08-03T12:01:00.000Z");
}

/// Run with a service's environment (a Cloud Run job on its secrets), the CLI needs no flags to
/// reach its Redis and rules; without either it says which flag or variable is missing.
#[test]
fn limits_take_their_settings_from_the_services_environment() {
    let namespace = unique("limits-env");
    let rules = repo("examples/payouts-per-minute.yaml");
    let run = |env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_drip"));
        for name in ["REDIS_URL", "DRIP_RULES", "DRIP_REDIS_NAMESPACE", "REDIS_CA_CERT", "REDIS_CLUSTER"] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied()).args(["limits", "list", "--rule", "payouts"]).output().expect("run drip")
    };
    let url = shared_url();
    let settings =
        [("REDIS_URL", url.as_str()), ("DRIP_RULES", rules.to_str().unwrap()), ("DRIP_REDIS_NAMESPACE", &namespace)];
    let listed = run(&settings);
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(stdout(&listed), "no overrides for rule payouts\n");
    let missing = run(&settings[1..]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("--redis"), "{stderr}");
}

const API_RULES: &str = r#"
default_dlq_topic: {p}-dlq
rules:
  - name: {p}-payouts
    match: { attributes: { event_type: payout } }
    key: "merchant_{data.merchant}"
    limits: [{ limit: 2, per: 1h }]
    max_delay: 2h
    inline_wait: 0s
    forward: { topic: {p}-ready }
    overflow_topic: {p}-overflow
"#;

const AUDIENCE: &str = "https://limiter.example";
const PUSHER: &str = "push@drip-test.iam.gserviceaccount.com";
const OPERATOR: &str = "ops@drip-test.iam.gserviceaccount.com";
const CONSUMER: &str = "consumer@drip-test.iam.gserviceaccount.com";

fn token(email: &str) -> String {
    let now = drip_core::time::wall_clock_millis() / 1_000;
    cloud_tasks_emulator::TokenSigner::test_key().sign(email, AUDIENCE, now, 3_600)
}

/// `drip ARGS` on a blocking thread, for tests that run a service on their runtime.
async fn drip_async(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || drip(&args.iter().map(String::as_str).collect::<Vec<_>>())).await.unwrap()
}

/// An operator on a laptop reaches a limiter that verifies OIDC through its API alone (no Redis,
/// no rules file): inspect, every `limits` command and `feedback`, each with the token of an
/// account on that route's list; the audit names the token's account; the API and Redis
/// transports print the same; a token of the wrong account is refused with what to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_limits_and_feedback_reach_production_through_the_limiter_s_api() {
    use drip_tests::stack::{Callers, LimiterWiring, TasksStandIn, spawn_limiter};
    let pubsub = drip_tests::pubsub_emulator::Pubsub::shared();
    let prefix = unique("api");
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 1);
    let mut wiring =
        LimiterWiring::new(shared_url(), pubsub.host.clone(), &tasks, queues, "http://127.0.0.1:9/dispatch".into());
    wiring.oidc_audience = Some(AUDIENCE.into());
    wiring.oidc_jwks_url = Some(tasks.client.jwks_url());
    wiring.callers = Callers {
        push: PUSHER.into(),
        admin: OPERATOR.into(),
        feedback: CONSUMER.into(),
        metrics: "collector@drip-test.iam.gserviceaccount.com".into(),
    };
    let limiter = spawn_limiter(&API_RULES.replace("{p}", &prefix), &wiring).await;
    let http = reqwest::Client::new();
    for id in ["a", "b", "c"] {
        let attributes = [("event_type", "payout")];
        let body = drip_tests::push_envelope(
            id,
            "projects/drip-test/subscriptions/s",
            drip_tests::publish_time(),
            &attributes,
            br#"{"merchant":7}"#,
        );
        let pushed =
            http.post(format!("{}/push", limiter.url)).bearer_auth(token(PUSHER)).body(body).send().await.unwrap();
        assert_eq!(pushed.status(), reqwest::StatusCode::NO_CONTENT);
    }
    let rule = format!("{prefix}-payouts");
    let api = |who: &str, args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--api".into(), limiter.url.clone(), "--api-token".into(), token(who)]);
        all
    };
    let json = |output: &Output| -> serde_json::Value {
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {output:?}"))
    };

    let report = json(&drip_async(api(OPERATOR, &["inspect", &rule, "merchant_7", "--output", "json"])).await);
    assert_eq!(report["limits"][0]["usedNow"], 2, "{report}");
    assert!(report["drainsAt"].is_string(), "the third waits for the next hour: {report}");
    let flags = json(
        &drip_async(api(OPERATOR, &["inspect", "--rule", &rule, "--key", "merchant_7", "--output", "json"])).await,
    );
    assert_eq!(flags["limits"], report["limits"], "`--rule R --key K`, as `limits` takes them, says the same");

    let set = drip_async(api(
        OPERATOR,
        &["limits", "set", "--rule", &rule, "--key", "merchant_7", "--limit", "5/1h", "--reason", "raised"],
    ))
    .await;
    assert!(set.status.success(), "{set:?}");
    assert!(stdout(&set).contains("2 per 1h (fixed): the rule's -> 5"), "{}", stdout(&set));
    let got = json(
        &drip_async(api(OPERATOR, &["limits", "get", "--rule", &rule, "--key", "merchant_7", "--output", "json"]))
            .await,
    );
    assert_eq!(got["overrides"][0]["count"], 5, "{got}");
    let rules_path = limiter.rules_path.to_str().unwrap().to_owned();
    let redis = ["--redis", &limiter.redis_url, "--rules", &rules_path, "--namespace", &limiter.namespace];
    let mut through_redis = vec!["limits", "get", "--rule", &rule, "--key", "merchant_7", "--output", "json"];
    through_redis.extend(redis);
    let via_redis = json(&drip_async(through_redis.iter().map(|a| a.to_string()).collect()).await);
    assert_eq!(via_redis, got, "both transports print the same");
    let listed = json(&drip_async(api(OPERATOR, &["limits", "list", "--rule", &rule, "--output", "json"])).await);
    assert_eq!(listed[0]["key"], "merchant_7", "{listed}");
    let history = json(&drip_async(api(OPERATOR, &["limits", "history", "--rule", &rule, "--output", "json"])).await);
    assert_eq!(history[0]["by"], OPERATOR, "the audit names the token's account: {history}");
    assert_eq!(history[0]["reason"], "raised", "{history}");
    let deleted =
        drip_async(api(OPERATOR, &["limits", "delete", "--rule", &rule, "--key", "merchant_7", "--limit", "5/1h"]))
            .await;
    assert!(stdout(&deleted).contains("5 -> the rule's"), "{deleted:?}");

    let paused = drip_async(api(
        CONSUMER,
        &["feedback", "--rule", &rule, "--key", "merchant_7", "--status", "429", "--retry-after", "60"],
    ))
    .await;
    assert!(paused.status.success(), "{paused:?}");
    assert!(stdout(&paused).contains("paused until"), "{}", stdout(&paused));
    let report = json(&drip_async(api(OPERATOR, &["inspect", &rule, "merchant_7", "--output", "json"])).await);
    assert!(report["pausedUntil"].is_string(), "the feedback paused the key: {report}");
    // A merchant Drip has not seen yet is paused through Redis all the same, and a pause past the
    // rule's max_pause is said to be capped.
    let stranger = drip_async(api(
        CONSUMER,
        &["feedback", "--rule", &rule, "--key", "merchant_new", "--status", "503", "--retry-after", "999999"],
    ))
    .await;
    assert!(stranger.status.success(), "{stranger:?}");
    assert!(stdout(&stranger).contains("capped by the rule's max_pause"), "{}", stdout(&stranger));
    let report = json(&drip_async(api(OPERATOR, &["inspect", &rule, "merchant_new", "--output", "json"])).await);
    assert!(report["pausedUntil"].is_string(), "paused before its first event: {report}");
    let noted = drip_async(api(
        OPERATOR,
        &["limits", "set", "--rule", &rule, "--key", "merchant_typo", "--limit", "5/1h", "--output", "json"],
    ))
    .await;
    assert_eq!(json(&noted)["keySeen"], false, "{noted:?}");
    let negative =
        drip_async(api(OPERATOR, &["limits", "set", "--rule", &rule, "--key", "k", "--limit", "-5/1h"])).await;
    assert!(String::from_utf8_lossy(&negative.stderr).contains("not a count"), "{negative:?}");

    // A cost after the call names its message; one Drip never reserved is unknown (404).
    let cost = ["--cost", "3", "--message-id", "never-sent", "--published", "2026-12-01T00:00:00Z"];
    let mut report_cost = vec!["feedback", "--rule", &rule, "--key", "merchant_7"];
    report_cost.extend(cost);
    let unknown = drip_async(api(CONSUMER, &report_cost)).await;
    assert!(!unknown.status.success(), "{unknown:?}");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("404"), "{unknown:?}");
    let without_message =
        drip(&["feedback", "--api", "http://127.0.0.1:9", "--rule", &rule, "--key", "k", "--cost", "3"]);
    assert!(!without_message.status.success(), "a cost needs --message-id and --published");
    // A latency report reaches the limiter, which says this rule's limit does not follow latency.
    let latency =
        drip_async(api(CONSUMER, &["feedback", "--rule", &rule, "--key", "merchant_7", "--latency-ms", "80"])).await;
    assert!(!latency.status.success(), "{latency:?}");
    assert!(String::from_utf8_lossy(&latency.stderr).contains("adaptive.latency"), "{latency:?}");
    let both = drip(&[
        "feedback",
        "--api",
        "http://127.0.0.1:9",
        "--rule",
        &rule,
        "--key",
        "k",
        "--status",
        "429",
        "--latency-ms",
        "5",
    ]);
    assert!(!both.status.success(), "a latency is reported on its own");
    let refused =
        drip_async(api(OPERATOR, &["feedback", "--rule", &rule, "--key", "merchant_7", "--status", "503"])).await;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("403") && said.contains("DRIP_FEEDBACK_CALLERS"), "{said}");
    let no_redis = drip(&["inspect", &rule, "merchant_7"]);
    assert!(!no_redis.status.success(), "without --api, Redis and rules are needed");
}

/// `drip dlq replay` gives each dead letter a filter picks back as the event it was (Drip's
/// attributes stripped, a wrapped body unwrapped, a claim-checked payload read from Redis) to the
/// topic given, marked with the message it replays; a dry run publishes and acks nothing; what it
/// leaves stays on the dead-letter subscription; a second run finds nothing more to replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_publishes_the_events_of_the_dead_letters_a_filter_picks() {
    use drip_core::attributes::{Stamp, WRAPPED};
    use drip_core::outcome::DlqReason;
    use std::collections::BTreeMap;
    let pubsub = drip_tests::pubsub_emulator::Pubsub::shared();
    let prefix = unique("dlq");
    let (dlq, source) = (format!("{prefix}-dlq"), format!("{prefix}-source"));
    pubsub.topic_with_subscription(&dlq).await;
    pubsub.topic_with_subscription(&source).await;
    let stamp = |id: &'static str, rule: &'static str, reason| Stamp {
        message_id: Some(id),
        subscription: Some("projects/drip-test/subscriptions/payouts-push"),
        rule: Some(rule),
        key: Some("merchant_1"),
        reason: Some((reason, "why")),
        ..Stamp::default()
    };
    let payout = BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    let crowded: BTreeMap<String, String> = (0..99).map(|i| (format!("a{i}"), "v".to_owned())).collect();
    // A large event's dead letter from the dispatcher: the task's body, naming its payload in Redis.
    let url = shared_url();
    let reference = format!("{prefix}:payload");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::AsyncCommands::set(&mut redis, &reference, b"the large event".as_slice()).await.unwrap();
    let task_body = serde_json::json!({
        "isRatelimited": true,
        "rateLimitMeta": {"key": "merchant_1", "rule": "payouts", "windowType": "RPH", "limit": 2,
            "scheduledFor": "2026-08-03T13:00:00.000Z", "overflowTopic": "payouts-overflow"},
        "claimCheck": reference,
        "attributes": {"event_type": "payout", "size": "large"},
        "messageId": "m5",
    });
    let letters = [
        stamp("m1", "payouts", DlqReason::MaxDelayExceeded).dead_letter(&payout, br#"{"n":1}"#),
        stamp("m2", "payouts", DlqReason::MaxDelayExceeded).dead_letter(&crowded, &[0, 159, 146, 150]),
        stamp("m3", "sms", DlqReason::MaxDelayExceeded).dead_letter(&payout, br#"{"n":3}"#),
        stamp("m4", "payouts", DlqReason::CostExceedsLimit).dead_letter(&payout, br#"{"n":4}"#),
        stamp("m5", "payouts", DlqReason::DispatchFailed)
            .dead_letter(&BTreeMap::new(), &serde_json::to_vec(&task_body).unwrap()),
        stamp("m6", "payouts", DlqReason::MalformedEnvelope).dead_letter(&payout, b"not an envelope"),
    ];
    assert_eq!(letters[1].1[WRAPPED], "json", "the crowded one travels wrapped");
    for (data, attributes) in &letters {
        pubsub.publish(&dlq, data, attributes).await;
    }
    let replay = |extra: Vec<String>| {
        let mut args: Vec<String> =
            ["dlq", "replay", "--subscription", &dlq, "--topic", &source, "--project", "drip-test"]
                .iter()
                .map(|a| a.to_string())
                .collect();
        args.extend(["--idle", "3s", "--output", "json"].map(String::from));
        args.extend(extra);
        let host = pubsub.host.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                Command::new(env!("CARGO_BIN_EXE_drip"))
                    .args(&args)
                    .env("PUBSUB_EMULATOR_HOST", host)
                    .env_remove("REDIS_URL")
                    .output()
                    .expect("run drip")
            })
            .await
            .unwrap()
        }
    };
    let summary = |output: &Output| -> serde_json::Value {
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    };

    const PICK: [&str; 6] = ["--rule", "payouts", "--reason", "max_delay_exceeded", "--reason", "dispatch_failed"];
    let picked = |extra: &[&str]| -> Vec<String> { PICK.iter().chain(extra).map(|a| a.to_string()).collect() };
    let only = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.to_string()).collect() };
    let dry = summary(&replay(picked(&["--dry-run", "--redis", &url])).await);
    assert_eq!((dry["wouldReplay"].as_u64(), dry["replayed"].as_u64()), (Some(3), Some(0)), "{dry}");
    assert_eq!(dry["stayOnSubscription"], 6, "a dry run leaves every one, counted once: {dry}");
    let entries = dry["deadLetters"].as_array().unwrap();
    assert!(entries.iter().all(|e| !e["detail"].as_str().unwrap().is_empty()), "every line says why: {dry}");
    assert!(pubsub.pull(&source, 10).await.is_empty(), "a dry run publishes nothing");

    let without_redis = summary(&replay(picked(&[])).await);
    assert_eq!(without_redis["replayed"], 2, "{without_redis}");
    let claim =
        without_redis["deadLetters"].as_array().unwrap().iter().find(|e| e["messageId"] == "m5").unwrap().clone();
    assert!(claim["detail"].as_str().unwrap().contains("give --redis"), "{claim}");
    let done = summary(&replay(picked(&["--redis", &url])).await);
    assert_eq!(done["replayed"], 1, "only the claim-checked one was left to replay: {done}");
    assert_eq!(done["stayOnSubscription"], done["left"], "nothing failed: what stays is what was left: {done}");

    let mut replayed = pubsub.pull_until(&source, 3, Duration::from_secs(10)).await;
    replayed.sort_by_key(|m| m.attributes["drip-replay-of"].clone());
    let of = |id: &str| {
        drip_core::event::MessageRef::new(id, Some("projects/drip-test/subscriptions/payouts-push".into())).identity()
    };
    let got: Vec<(String, Vec<u8>)> =
        replayed.iter().map(|m| (m.attributes["drip-replay-of"].clone(), m.data.clone())).collect();
    let mut want = vec![
        (of("m1"), br#"{"n":1}"#.to_vec()),
        (of("m2"), vec![0, 159, 146, 150]),
        (of("m5"), b"the large event".to_vec()),
    ];
    want.sort();
    assert_eq!(got, want, "each event's data, as it came");
    for message in &replayed {
        let mut own = message.attributes.clone();
        own.remove("drip-replay-of");
        let published = own.remove("drip-replay-published").expect("the dead letter's time");
        let age = drip_core::time::wall_clock_millis() - drip_core::time::parse_rfc3339(&published).unwrap();
        assert!((0..600_000).contains(&age), "the dead letter's own publish time: {published}");
        let expected = match message.data.as_slice() {
            [0, ..] => crowded.clone(),
            b"the large event" => {
                BTreeMap::from([("event_type".into(), "payout".into()), ("size".into(), "large".into())])
            }
            _ => payout.clone(),
        };
        assert_eq!(own, expected, "its own attributes, and no other drip-* one");
    }
    let again = summary(&replay(picked(&["--redis", &url])).await);
    assert_eq!(again["replayed"], 0, "acked once replayed: {again}");

    // What Drip could not read is never replayed unless asked for by reason.
    let any_reason = summary(&replay(only(&["--rule", "payouts", "--dry-run"])).await);
    let unreadable = any_reason["deadLetters"].as_array().unwrap().iter().find(|e| e["messageId"] == "m6").unwrap();
    assert_eq!(unreadable["action"], "left", "{any_reason}");
    assert!(unreadable["detail"].as_str().unwrap().contains("--reason malformed_envelope"), "{any_reason}");
    let m4 = any_reason["deadLetters"].as_array().unwrap().iter().find(|e| e["messageId"] == "m4").unwrap();
    assert_eq!(m4["action"], "would_replay", "a readable one of any reason would go: {any_reason}");
    let asked = summary(&replay(only(&["--reason", "malformed_envelope"])).await);
    assert_eq!(asked["replayed"], 1, "named by reason, it goes: {asked}");
    assert_eq!(pubsub.pull_until(&source, 1, Duration::from_secs(10)).await[0].data, b"not an envelope");
    let mut kept: Vec<String> =
        pubsub.pull(&dlq, 10).await.into_iter().map(|m| m.attributes["drip-message-id"].clone()).collect();
    kept.sort();
    assert_eq!(kept, ["m3", "m4"], "what the filters left stays on the dead-letter subscription");
}

/// `drip schema` prints the schemas `docs/schemas/` holds (`DRIP_BLESS=1` rewrites them after a
/// deliberate change), every example rules file is valid under the rules schema, and a file with
/// an unknown field or a wrongly typed one is not.
#[test]
fn the_schemas_are_current_and_every_example_fits_the_rules_schema() {
    for which in ["rules", "overflow"] {
        let output = drip(&["schema", which]);
        assert!(output.status.success(), "{output:?}");
        let path = repo(&format!("docs/schemas/{which}.schema.json"));
        if std::env::var_os("DRIP_BLESS").is_some() {
            std::fs::write(&path, &output.stdout).unwrap();
        }
        assert_eq!(
            stdout(&output),
            std::fs::read_to_string(&path).unwrap(),
            "{} is stale: DRIP_BLESS=1",
            path.display()
        );
    }
    let schema: serde_json::Value = serde_json::from_slice(&drip(&["schema", "rules"]).stdout).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let mut examples: Vec<PathBuf> = std::fs::read_dir(repo("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 3, "{examples:?}");
    for example in &examples {
        let rules: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(example).unwrap()).unwrap();
        let errors: Vec<String> =
            validator.iter_errors(&rules).map(|e| format!("{} at {}", e, e.instance_path)).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", example.display());
    }
    let valid: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(repo("examples/payouts-per-minute.yaml")).unwrap()).unwrap();
    let mut unknown = valid.clone();
    unknown["rules"][0]["max_dealy"] = "2h".into();
    assert!(!validator.is_valid(&unknown), "a misspelt field");
    let mut mistyped = valid.clone();
    mistyped["rules"][0]["limits"][0]["limit"] = "100".into();
    assert!(!validator.is_valid(&mistyped), "a count as a string");
    let mut missing = valid;
    missing["rules"][0].as_object_mut().unwrap().remove("key");
    assert!(!validator.is_valid(&missing), "a rule without its key");
}

/// A newcomer's first commands: `inspect` with no transport names --api (the way in from a laptop);
/// a Redis URL without its scheme, or a Redis that does not answer, says so once and what to
/// write; `feedback --help` lists no flag it would refuse; `resume` says where to go too.
#[test]
fn first_commands_say_what_to_write() {
    let bare = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_drip"))
            .args(args)
            .env_remove("REDIS_URL")
            .env_remove("DRIP_RULES")
            .env_remove("DRIP_API")
            .output()
            .unwrap()
    };
    let inspect = bare(&["inspect", "payouts", "merchant_1"]);
    let said = String::from_utf8_lossy(&inspect.stderr).into_owned();
    assert_eq!(inspect.status.code(), Some(1));
    assert!(said.contains("--api URL (its admin service") && said.contains("--redis URL and --rules FILE"), "{said}");
    let rules = repo("examples/payouts.yaml");
    let no_scheme =
        bare(&["inspect", "--redis", "localhost:46379", "--rules", rules.to_str().unwrap(), "payouts", "m"]);
    let said = String::from_utf8_lossy(&no_scheme.stderr).into_owned();
    assert!(said.contains("'localhost:46379' is not a Redis URL: write redis://HOST:PORT/"), "{said}");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("redis://127.0.0.1:{port}/");
    let down = bare(&["inspect", "--redis", &url, "--rules", rules.to_str().unwrap(), "payouts", "m"]);
    let said = String::from_utf8_lossy(&down.stderr).into_owned();
    assert!(said.contains(&format!("cannot reach Redis at {url}")) && said.matches("os error").count() == 1, "{said}");
    let help = stdout(&bare(&["feedback", "--help"]));
    assert!(help.contains("--api <") && !help.contains("--redis <") && !help.contains("--rules <"), "{help}");
    let resume = bare(&["resume", "payouts", "merchant_1"]);
    assert!(String::from_utf8_lossy(&resume.stderr).contains("--api URL"), "{resume:?}");
}

/// docs/rules.md documents every field of the schema (burst, max_pause and overflow's url were
/// once missing).
#[test]
fn the_rules_reference_names_every_field_of_the_schema() {
    let schema: serde_json::Value = serde_json::from_slice(&drip(&["schema", "rules"]).stdout).unwrap();
    let mut fields: Vec<String> = schema["properties"].as_object().unwrap().keys().cloned().collect();
    for definition in schema["$defs"].as_object().unwrap().values() {
        fields.extend(definition["properties"].as_object().into_iter().flat_map(|p| p.keys().cloned()));
    }
    let reference = std::fs::read_to_string(repo("docs/rules.md")).unwrap();
    let missing: Vec<_> = fields.iter().filter(|f| !reference.contains(&format!("| `{f}` |"))).collect();
    assert!(missing.is_empty(), "docs/rules.md has no row for {missing:?}");
}

/// What the loader refuses, the schema refuses too, so an editor flags it: every refused fixture of
/// the loader fails the schema, except those whose reason a JSON Schema cannot say (a field
/// against another field, a rule against another rule, a cost against a limit, a sum of
/// durations), each named here with why; those must still be refused by the loader and accepted
/// by the schema, so the list stays true.
#[test]
fn the_rules_schema_refuses_what_the_loader_refuses() {
    const LOADER_ONLY: &[(&str, &str)] = &[
        ("adaptive_min_above_ceiling", "min against margin"),
        ("adaptive_only_gcra", "adaptive against the limits' windows"),
        ("adaptive_with_budget_feedback", "adaptive against feedback"),
        ("budget_floor_for_rule_not_drawing", "a budget's floors against the rules drawing on it"),
        ("budget_floor_for_unknown_rule", "a budget's floors against the file's rules"),
        ("budget_floors_over_one", "a budget's floors against each other"),
        ("budget_gcra_window", "a budget's window against the rules drawing on it"),
        ("budget_key_floors_over_one", "a budget's key floors against each other and its rules'"),
        ("budget_leases_mixed_in_a_rule", "a rule's budgets' leases against each other"),
        ("budget_leases_with_floors", "a budget's leases against its floors"),
        ("budget_leases_with_spread", "a budget's leases against its limits' placement"),
        ("budget_listed_twice", "a rule's budgets against each other"),
        ("classes_reserve_over_one", "a rule's reserves against each other"),
        ("classes_with_sliding_limit", "classes against the rule's windows"),
        ("cost_exceeds_budget", "cost against a budget's limit"),
        ("cost_exceeds_gcra_burst", "cost against burst"),
        ("cost_exceeds_limit", "cost against the count"),
        ("delivery_margin_too_long", "delivery_margin against each window"),
        ("duplicate_limit", "limits against each other"),
        ("duplicate_rule_id", "rules against each other"),
        ("duplicate_rule_names", "rules against each other"),
        ("fair_budget_park_off", "a rule's park_horizon against the fair budget it draws from"),
        ("fair_budgets_two", "a rule's budgets' fairness against each other"),
        ("fair_weights_without_fair", "a budget's weights against its fair"),
        ("feedback_to_unlisted_budget", "feedback against the rule's budgets"),
        ("inline_wait_too_long", "a duration's length (a pattern sees its text)"),
        ("invalid_budget_beside_valid", "a rule naming a budget the file refused"),
        ("learn_policy_period", "one field against another (a learned policy's period against the limits)"),
        ("max_delay_over_30d", "a duration's length (a pattern sees its text)"),
        ("max_pause_over_max_delay", "max_pause against max_delay"),
        ("missing_dlq_topic", "a rule's dlq_topic against default_dlq_topic"),
        ("unknown_budget", "a rule's budgets against the file's"),
        ("unreachable_after_catch_all", "a rule against the rules before it"),
        ("zero_period", "a sum of durations that is zero"),
    ];
    let schema: serde_json::Value = serde_json::from_slice(&drip(&["schema", "rules"]).stdout).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let fixtures = repo("shared/core/tests/fixtures/invalid");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    names.sort();
    assert!(names.len() >= 50, "{names:?}");
    let mut accepted = Vec::new();
    for fixture in &names {
        let name = fixture.file_stem().unwrap().to_str().unwrap().to_owned();
        assert!(drip_core::rules::RuleSet::load(fixture).is_err(), "{name}: the loader accepts it");
        let Ok(document) = serde_yaml_ng::from_str::<serde_json::Value>(&std::fs::read_to_string(fixture).unwrap())
        else {
            continue; // not YAML: an editor flags it before any schema
        };
        if validator.is_valid(&document) {
            accepted.push(name);
        }
    }
    let loader_only: Vec<String> = LOADER_ONLY.iter().map(|(name, _)| (*name).to_owned()).collect();
    assert_eq!(accepted, loader_only, "fixtures the schema lets through, against those listed with a reason");
}

/// `drip rules topics` says which topics the rules publish to, as Drip reads them (a rule's own
/// dead-letter topic or the file's default, other projects' full names apart), and Terraform's
/// example reads its current output (`DRIP_BLESS=1` rewrites it after a rules change).
#[test]
fn rules_topics_are_what_terraform_creates() {
    let example = repo("terraform/examples/basic/rules.yaml");
    let output = drip(&["rules", "topics", example.to_str().unwrap(), "--output", "json"]);
    assert!(output.status.success(), "{output:?}");
    let committed = repo("terraform/examples/basic/rules-topics.json");
    if std::env::var_os("DRIP_BLESS").is_some() {
        std::fs::write(&committed, &output.stdout).unwrap();
    }
    assert_eq!(stdout(&output), std::fs::read_to_string(&committed).unwrap(), "stale: DRIP_BLESS=1");
    let rules = std::env::temp_dir().join(format!("{}.yaml", unique("topics")));
    std::fs::write(
        &rules,
        r#"
default_dlq_topic: all-dlq
rules:
  - name: a
    match: { attributes: { kind: a } }
    key: "k_{data.k}"
    limits: [{ limit: 1, per: 1s }]
    max_delay: 1m
    forward: { topic: projects/partner/topics/inbound }
    overflow_topic: a-overflow
  - name: b
    key: "k_{data.k}"
    limits: [{ limit: 1, per: 1s }]
    max_delay: 1m
    forward: { url: "https://example.com/b" }
    overflow_topic: b-overflow
    dlq_topic: b-dlq
"#,
    )
    .unwrap();
    let topics: serde_json::Value =
        serde_json::from_slice(&drip(&["rules", "topics", rules.to_str().unwrap(), "--output", "json"]).stdout)
            .unwrap();
    std::fs::remove_file(&rules).ok();
    assert_eq!(
        topics,
        serde_json::json!({
            "forward": [],
            "overflow": ["a-overflow", "b-overflow"],
            "dlq": ["all-dlq", "b-dlq"],
            "external": ["projects/partner/topics/inbound"],
        })
    );
}

/// A dead letter whose cause is not fixed comes back as soon as it is replayed: through the real
/// stack (the emulator pushing to the limiter), an event whose cost is over its rule's limit is
/// dead-lettered, replayed, and dead-lettered again. One run replays it once, then reports it
/// (`AGAIN`, its `drip-detail` shown) and leaves it on the subscription: never a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_replays_a_dead_letter_that_stays_bad_once_then_reports_it() {
    use drip_tests::stack::{LimiterWiring, TasksStandIn, spawn_limiter};
    let pubsub = drip_tests::pubsub_emulator::Pubsub::shared();
    let prefix = unique("loop");
    for topic in ["ready", "overflow", "dlq"] {
        pubsub.topic_with_subscription(&format!("{prefix}-{topic}")).await;
    }
    let tasks = TasksStandIn::start().await;
    let queues = tasks.queues(&prefix, 1);
    let wiring =
        LimiterWiring::new(shared_url(), pubsub.host.clone(), &tasks, queues, "http://127.0.0.1:9/dispatch".into());
    let rules = format!(
        r#"
default_dlq_topic: {prefix}-dlq
rules:
  - name: {prefix}-payouts
    match: {{ attributes: {{ event_type: payout }} }}
    key: "merchant_{{data.merchant}}"
    cost: "{{data.parts}}"
    limits: [{{ limit: 2, per: 1s }}]
    max_delay: 1m
    forward: {{ topic: {prefix}-ready }}
    overflow_topic: {prefix}-overflow
"#
    );
    let limiter = spawn_limiter(&rules, &wiring).await;
    let (source, dlq) = (format!("{prefix}-source"), format!("{prefix}-dlq"));
    pubsub.create_topic(&source).await;
    pubsub.create_subscription(&source, &source, Some(&format!("{}/push", limiter.url))).await;
    let attributes = std::collections::BTreeMap::from([("event_type".to_owned(), "payout".to_owned())]);
    pubsub.publish(&source, br#"{"merchant":1,"parts":5}"#, &attributes).await;

    let args: Vec<String> = ["dlq", "replay", "--subscription", &dlq, "--topic", &source, "--project", "drip-test"]
        .iter()
        .map(|a| a.to_string())
        .chain(["--idle", "8s", "--output", "json"].map(String::from))
        .collect();
    let host = pubsub.host.clone();
    let run = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_drip"))
            .args(&args)
            .env("PUBSUB_EMULATOR_HOST", host)
            .env_remove("REDIS_URL")
            .output()
            .expect("run drip")
    })
    .await
    .unwrap();
    assert!(run.status.success(), "{run:?}");
    let summary: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(summary["replayed"], 1, "replayed once: {summary}");
    assert_eq!(summary["deadLetteredAgain"], 1, "then reported, not replayed again: {summary}");
    assert_eq!(summary["stayOnSubscription"], 1, "{summary}");
    let again = summary["deadLetters"].as_array().unwrap().iter().find(|e| e["action"] == "dead_lettered_again");
    let again = again.expect("the entry of the dead letter that came back");
    assert_eq!(again["reason"], "cost_exceeds_limit", "{again}");
    assert!(again["why"].as_str().is_some_and(|why| !why.is_empty()), "its drip-detail is shown: {again}");

    // It stays on the subscription for whoever fixes its cause.
    let left = pubsub.pull_until(&dlq, 1, Duration::from_secs(15)).await;
    assert_eq!(left.len(), 1, "the dead letter that came back is still there");
    assert!(left[0].attributes.contains_key("drip-replay-of"), "{:?}", left[0].attributes);
}

/// Ctrl-C during a replay gives back at once what the run held (a dead letter it left for another
/// reason would otherwise stay out of reach for ten minutes), prints what it did, and exits 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_interrupted_gives_back_what_it_held_and_says_what_it_did() {
    use drip_core::attributes::Stamp;
    use drip_core::outcome::DlqReason;
    let pubsub = drip_tests::pubsub_emulator::Pubsub::shared();
    let prefix = unique("ctrlc");
    let (dlq, source) = (format!("{prefix}-dlq"), format!("{prefix}-source"));
    pubsub.topic_with_subscription(&dlq).await;
    pubsub.topic_with_subscription(&source).await;
    let stamp = Stamp {
        message_id: Some("m1"),
        subscription: Some("projects/drip-test/subscriptions/s"),
        rule: Some("sms"),
        key: Some("user_1"),
        reason: Some((DlqReason::MaxDelayExceeded, "why")),
        ..Stamp::default()
    };
    let (data, attributes) = stamp.dead_letter(&std::collections::BTreeMap::new(), b"{}");
    pubsub.publish(&dlq, &data, &attributes).await;

    // Only rule payouts is picked: the sms dead letter is held (left) while the run waits.
    let child = Command::new(env!("CARGO_BIN_EXE_drip"))
        .args(["dlq", "replay", "--subscription", &dlq, "--topic", &source, "--project", "drip-test"])
        .args(["--rule", "payouts", "--idle", "60s", "--output", "json"])
        .env("PUBSUB_EMULATOR_HOST", &pubsub.host)
        .env_remove("REDIS_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run drip");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let interrupted = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(interrupted.success());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().expect("drip ends")).await.unwrap();
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).expect("what it did, printed");
    assert_eq!((summary["left"].as_u64(), summary["replayed"].as_u64()), (Some(1), Some(0)), "{summary}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("back on the subscription"), "{output:?}");
    // Given back at once, not after the ten minutes it was held for.
    let back = pubsub.pull_until(&dlq, 1, Duration::from_secs(10)).await;
    assert_eq!(back.len(), 1, "the held dead letter is on the subscription again");
}
