//! The `drip-limiter` binary as Cloud Run runs it: settings from the environment, refusal to
//! start on bad settings or rules (naming what is wrong), and a clean exit on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drip_tests::pubsub_emulator::Pubsub;
use drip_tests::redis_server::{free_port, shared_url};

fn repo(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

fn limiter(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_drip-limiter"));
    command.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("DRIP_LOG_FORMAT", "text");
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

fn base_env(pubsub: &str, rules: &str, port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("PORT", port.to_string()),
        ("REDIS_URL", shared_url()),
        ("GOOGLE_CLOUD_PROJECT", "drip-test".into()),
        ("DRIP_RULES", rules.into()),
        ("PUBSUB_EMULATOR_HOST", pubsub.into()),
        ("CLOUD_TASKS_ENDPOINT", "http://127.0.0.1:9".into()),
        ("DRIP_TASKS_QUEUES", "drip-0".into()),
        ("DRIP_DISPATCHER_URL", "http://127.0.0.1:9/dispatch".into()),
        ("DRIP_TASK_SIGNING_KEY", drip_tests::stack::SIGNING_KEY.into()),
        ("DRIP_AUTH", "off".into()),
    ]
}

fn as_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[test]
fn refuses_to_start_without_a_setting_and_names_it() {
    let pubsub = Pubsub::shared();
    let env: Vec<_> = base_env(&pubsub.host, &repo("examples/payouts.yaml"), free_port())
        .into_iter()
        .filter(|(k, _)| *k != "REDIS_URL")
        .collect();
    let output = limiter(&as_refs(&env)).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("REDIS_URL"), "{stderr}");
}

/// Runs the limiter with `base_env` changed by `change`; returns its stderr after it refused to start.
fn refusal(change: impl FnOnce(&mut Vec<(&'static str, String)>)) -> String {
    let pubsub = Pubsub::shared();
    let mut env = base_env(&pubsub.host, &repo("examples/payouts.yaml"), free_port());
    change(&mut env);
    let output = limiter(&as_refs(&env)).output().unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A newcomer's mistakes are named with what was given and what to write: a setting that does not
/// parse, a Redis URL without its scheme, a Redis that does not answer (said once), a route class
/// that does not exist.
#[test]
fn refusals_say_what_was_given_and_what_to_write() {
    let poll = refusal(|env| env.push(("DRIP_RULES_POLL_MS", "10s".into())));
    assert!(poll.contains("DRIP_RULES_POLL_MS='10s' is not valid: expected a whole number of milliseconds"), "{poll}");
    let scheme = refusal(|env| env.push(("REDIS_URL", "localhost:46379".into())));
    assert!(scheme.contains("'localhost:46379' is not a Redis URL: write redis://HOST:PORT/"), "{scheme}");
    let port = free_port();
    let down = refusal(|env| env.push(("REDIS_URL", format!("redis://127.0.0.1:{port}/"))));
    assert!(down.contains(&format!("cannot reach Redis at redis://127.0.0.1:{port}/")), "{down}");
    assert_eq!(down.matches("os error 111").count(), 1, "the cause once: {down}");
    let routes = refusal(|env| env.push(("DRIP_ROUTES", "push,admn".into())));
    assert!(routes.contains("unknown route class 'admn'"), "{routes}");
}

/// In JSON mode (Cloud Run's) a refusal is one Cloud Logging line, not a multi-line `Error:`.
#[test]
fn a_refusal_is_one_json_log_line() {
    let pubsub = Pubsub::shared();
    let mut env = base_env(&pubsub.host, &repo("examples/payouts.yaml"), free_port());
    env.push(("DRIP_TASK_SIGNING_KEY", "short".into()));
    env.push(("DRIP_LOG_FORMAT", "json".into()));
    let output = limiter(&as_refs(&env)).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let refusal = lines.iter().find(|l| l["severity"] == "ERROR").expect("an ERROR line");
    assert!(
        refusal["error"].as_str().unwrap().contains("DRIP_TASK_SIGNING_KEY must be at least 32 characters"),
        "{refusal}"
    );
    assert!(!String::from_utf8_lossy(&output.stderr).contains("Error:"), "no plain-text error on stderr");
}

#[test]
fn refuses_a_missing_or_short_task_signing_key() {
    let missing = refusal(|env| env.retain(|(k, _)| *k != "DRIP_TASK_SIGNING_KEY"));
    assert!(missing.contains("DRIP_TASK_SIGNING_KEY"), "{missing}");
    let short = refusal(|env| env.push(("DRIP_TASK_SIGNING_KEY", "short".into())));
    assert!(short.contains("DRIP_TASK_SIGNING_KEY must be at least 32 characters"), "{short}");
}

#[test]
fn authentication_fails_closed() {
    let unsaid = refusal(|env| env.retain(|(k, _)| *k != "DRIP_AUTH"));
    assert!(unsaid.contains("DRIP_OIDC_AUDIENCE is not set") && unsaid.contains("DRIP_AUTH=off"), "{unsaid}");
    let no_callers = refusal(|env| {
        env.retain(|(k, _)| *k != "DRIP_AUTH");
        env.push(("DRIP_OIDC_AUDIENCE", "https://limiter.example".into()));
    });
    assert!(no_callers.contains("DRIP_PUSH_CALLERS names no caller"), "{no_callers}");
    let old_list = refusal(|env| env.push(("DRIP_OIDC_ALLOWED_EMAILS", "a@b.iam.gserviceaccount.com".into())));
    assert!(old_list.contains("DRIP_OIDC_ALLOWED_EMAILS allowed its callers on every route"), "{old_list}");
    let typo = refusal(|env| env.push(("DRIP_AUTH", "of".into())));
    assert!(typo.contains("DRIP_AUTH must be oidc or off, got 'of'"), "{typo}");
}

/// The whole attempt (payouts.yaml's longest inline wait, 1 s, the action, a dead letter, three
/// Redis calls) must end before SIGKILL: the defaults fit in 10 s (9 s), a longer publish timeout
/// or a shorter grace does not.
#[test]
fn refuses_an_attempt_that_could_outlast_the_shutdown_grace() {
    let stderr = refusal(|env| env.push(("DRIP_PUBLISH_TIMEOUT_MS", "10000".into())));
    assert!(
        stderr.contains("a push may take 16500 ms, which must be under DRIP_SHUTDOWN_GRACE_MS (10000 ms")
            && stderr.contains("the longest inline_wait (1000 ms)")
            && stderr.contains("DRIP_PUBLISH_TIMEOUT_MS (10000 ms)"),
        "{stderr}"
    );
    let stderr = refusal(|env| env.push(("DRIP_SHUTDOWN_GRACE_MS", "9000".into())));
    assert!(
        stderr.contains("a push may take 9000 ms, which must be under DRIP_SHUTDOWN_GRACE_MS (9000 ms"),
        "{stderr}"
    );
}

#[test]
fn refuses_to_start_on_invalid_rules_naming_file_rule_and_field() {
    let pubsub = Pubsub::shared();
    let rules = repo("shared/core/tests/fixtures/invalid/zero_limit.yaml");
    let output = limiter(&as_refs(&base_env(&pubsub.host, &rules, free_port()))).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("zero_limit.yaml: rule 'payouts': limits[0].limit: must be at least 1, got 0"), "{stderr}");
}

#[test]
fn refuses_to_start_when_unmatched_messages_could_not_be_dead_lettered() {
    let pubsub = Pubsub::shared();
    let dir = std::env::temp_dir().join(drip_tests::unique("no-dlq"));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.yaml");
    let text = std::fs::read_to_string(repo("examples/payouts-per-minute.yaml"))
        .unwrap()
        .replace("default_dlq_topic: drip-dlq\n", "");
    std::fs::write(&rules, text).unwrap();
    let output = limiter(&as_refs(&base_env(&pubsub.host, rules.to_str().unwrap(), free_port()))).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("default_dlq_topic: required"));
}

#[test]
fn serves_and_stops_cleanly_on_sigterm() {
    let pubsub = Pubsub::shared();
    let port = free_port();
    let mut child = limiter(&as_refs(&base_env(&pubsub.host, &repo("examples/payouts.yaml"), port)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = format!("http://127.0.0.1:{port}/readyz");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    loop {
        let ready =
            runtime.block_on(async { reqwest::get(&url).await.map(|r| r.status().is_success()).unwrap_or(false) });
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the limiter never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(Instant::now() < deadline, "still running 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The admin service as Terraform runs it: the limiter with `DRIP_ROUTES=admin,feedback`, OIDC on,
/// no push callers, and neither Cloud Tasks settings nor the task signing key (it never creates a
/// task). It starts, answers its admin routes' auth check, and serves no `/push` to anyone.
#[test]
fn the_admin_service_starts_without_tasks_or_a_signing_key_and_serves_no_push() {
    let pubsub = Pubsub::shared();
    let port = free_port();
    let mut env = base_env(&pubsub.host, &repo("examples/payouts.yaml"), port);
    let tasks_only =
        ["CLOUD_TASKS_ENDPOINT", "DRIP_TASKS_QUEUES", "DRIP_DISPATCHER_URL", "DRIP_TASK_SIGNING_KEY", "DRIP_AUTH"];
    env.retain(|(k, _)| !tasks_only.contains(k));
    env.push(("DRIP_ROUTES", "admin,feedback".into()));
    env.push(("DRIP_OIDC_AUDIENCE", "https://drip-admin.example".into()));
    env.push(("DRIP_ADMIN_CALLERS", "operator@p.iam.gserviceaccount.com".into()));
    env.push(("DRIP_OIDC_JWKS_URL", "http://127.0.0.1:9/jwks".into()));
    let mut child = limiter(&as_refs(&env)).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !runtime.block_on(async {
        reqwest::get(format!("{base}/readyz")).await.map(|r| r.status().is_success()).unwrap_or(false)
    }) {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            panic!("the admin service did not start ({status}): {stderr}");
        }
        assert!(Instant::now() < deadline, "the admin service never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (push, inspect) = runtime.block_on(async {
        let http = reqwest::Client::new();
        let push = http.post(format!("{base}/push")).body("{}").send().await.unwrap().status();
        let inspect = http.get(format!("{base}/v1/rules/payouts/keys/m1")).send().await.unwrap().status();
        (push, inspect)
    });
    assert_eq!(push, reqwest::StatusCode::NOT_FOUND, "no /push here, whoever calls");
    assert_eq!(inspect, reqwest::StatusCode::UNAUTHORIZED, "the admin routes are served, behind OIDC");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// With OIDC on, `/metrics` on the main port wants a token; DRIP_METRICS_PORT serves it on
/// 127.0.0.1 without one, for the collector sidecar of the same instance.
#[test]
fn metrics_have_their_own_unauthenticated_listener() {
    let pubsub = Pubsub::shared();
    let (port, metrics_port) = (free_port(), free_port());
    let mut env = base_env(&pubsub.host, &repo("examples/payouts.yaml"), port);
    env.retain(|(k, _)| *k != "DRIP_AUTH");
    env.push(("DRIP_OIDC_AUDIENCE", "https://limiter.example".into()));
    env.push(("DRIP_PUSH_CALLERS", "push@p.iam.gserviceaccount.com".into()));
    env.push(("DRIP_OIDC_JWKS_URL", "http://127.0.0.1:9/jwks".into()));
    env.push(("DRIP_METRICS_PORT", metrics_port.to_string()));
    let mut child = limiter(&as_refs(&env)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let status =
        |url: String| runtime.block_on(async move { reqwest::get(&url).await.map(|r| r.status().as_u16()).ok() });
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(format!("http://127.0.0.1:{port}/readyz")) != Some(200) {
        assert!(Instant::now() < deadline, "the limiter never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status(format!("http://127.0.0.1:{port}/metrics")), Some(401), "the main port wants a token");
    let body = runtime.block_on(async {
        reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.unwrap().text().await.unwrap()
    });
    assert!(body.contains("drip_build_info"), "{body}");
    assert_eq!(status(format!("http://127.0.0.1:{metrics_port}/push")), Some(404), "nothing else on it");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The body of `/readyz` once it answers 200 (it names the rules version in force).
fn readyz(port: u16, deadline: Instant) -> String {
    loop {
        if let Some(body) = drip_tests::get_ok(port, "/readyz") {
            return body;
        }
        assert!(Instant::now() < deadline, "the limiter never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sighup_reloads_the_rules_and_a_bad_file_is_refused() {
    let pubsub = Pubsub::shared();
    let port = free_port();
    let rules = std::env::temp_dir().join(format!("{}.yaml", drip_tests::unique("sighup-rules")));
    let original = std::fs::read_to_string(repo("examples/payouts.yaml")).unwrap();
    std::fs::write(&rules, &original).unwrap();
    let mut env = base_env(&pubsub.host, &rules.display().to_string(), port);
    env.push(("DRIP_RULES_POLL_MS", "0".into()));
    let log = std::env::temp_dir().join(format!("{}.log", drip_tests::unique("sighup-log")));
    let mut child =
        limiter(&as_refs(&env)).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
    let hangup = || Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = readyz(port, deadline);
    assert!(first.starts_with("ready; rules "), "{first}");

    std::fs::write(&rules, original.replace("limit: 100,", "limit: 120,")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(readyz(port, deadline), first, "polling is off: nothing changes before SIGHUP");
    hangup();
    let second = loop {
        let body = readyz(port, deadline);
        if body != first {
            break body;
        }
        assert!(Instant::now() < deadline, "SIGHUP never reloaded the rules");
        std::thread::sleep(Duration::from_millis(50));
    };

    std::fs::write(&rules, original.replace("limit: 100,", "limit: 0,")).unwrap();
    hangup();
    let refused = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("new rules refused") {
            break text;
        }
        assert!(Instant::now() < deadline, "the bad file was never refused: {text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(refused.contains("limits[0].limit"), "the ERROR names the field: {refused}");
    assert_eq!(readyz(port, deadline), second, "the rules in force stay");
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_file(&rules);
    let _ = std::fs::remove_file(&log);
}
