//! `drip-demo` (what `./run demo` runs) as a user runs it, against the stack the tests start.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use drip_tests::redis_server::shared_url;
use drip_tests::unique;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `drip-demo` against the local stack the tests start (as `./run demo` does with release
/// binaries): a small burst drains, the summary says nothing was lost, the chart is written.
#[test]
fn demo_drains_a_burst_and_exits_zero() {
    use drip_tests::pubsub_emulator::{Pubsub, PubsubEmulator};
    use drip_tests::stack::{LimiterWiring, TasksStandIn, spawn_dispatcher, spawn_limiter};

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rules = std::fs::read_to_string(repo("examples/demo.yaml")).unwrap();
    // The demo creates fixed topic names: a private emulator keeps runs apart.
    let pubsub = Pubsub::own(PubsubEmulator::start());
    let limiter_url = runtime.block_on(async {
        let namespace = unique("demo");
        let dispatcher = spawn_dispatcher(&rules, &shared_url(), &namespace, &pubsub.host, None).await;
        let tasks = TasksStandIn::start().await;
        let queues = tasks.queues(&unique("demo"), 2);
        let mut wiring = LimiterWiring::new(
            shared_url(),
            pubsub.host.clone(),
            &tasks,
            queues,
            format!("{}/dispatch", dispatcher.url),
        );
        wiring.namespace = namespace;
        let limiter = spawn_limiter(&rules, &wiring).await;
        limiter.url
    });
    let out = std::env::temp_dir().join(unique("demo-out"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_drip-demo"))
        .args([
            "--pubsub-emulator",
            &pubsub.host,
            "--project",
            drip_tests::pubsub_emulator::PROJECT,
            "--limiter",
            &limiter_url,
        ])
        .args([
            "--rules",
            repo("examples/demo.yaml").to_str().unwrap(),
            "--events",
            "40",
            "--keys",
            "2",
            "--out",
            out.to_str().unwrap(),
            "--timeout-secs",
            "60",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The services run on this runtime: keep it turning while the demo runs.
    let output = runtime.block_on(async {
        loop {
            if let Some(_status) = child.try_wait().unwrap() {
                break child.wait_with_output().unwrap();
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    let printed = stdout(&output);
    assert!(output.status.success(), "{printed}");
    assert!(printed.contains("events in:            40"), "{printed}");
    assert!(printed.contains("lost:                 0"), "{printed}");
    assert!(printed.contains("result:               OK"), "{printed}");
    let svg = std::fs::read_to_string(out.join("drip-demo.svg")).unwrap();
    assert!(svg.contains("merchant m001") && svg.contains("merchant m002"), "a panel a merchant");
    std::fs::remove_dir_all(out).unwrap();
}
