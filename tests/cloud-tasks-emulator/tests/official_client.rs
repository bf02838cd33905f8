//! The stand-in driven by the official `google-cloud-tasks-v2` client, as Drip drives it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use cloud_tasks_emulator::client::EmulatorClient;
use cloud_tasks_emulator::{Emulator, Settings};
use google_cloud_gax::error::rpc::Code;
use google_cloud_tasks_v2::client::CloudTasks;
use google_cloud_tasks_v2::model::{HttpMethod, HttpRequest, OidcToken, Queue, RetryConfig, Task};

const PROJECT: &str = "projects/drip-test/locations/local";

struct Received {
    headers: HeaderMap,
    body: Vec<u8>,
    at: std::time::Instant,
}

/// A target that records every request and answers with the next status of a script (then 200).
async fn target(statuses: Vec<u16>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let received: Arc<Mutex<Vec<Received>>> = Arc::default();
    let script = Arc::new(Mutex::new(statuses.into_iter()));
    let log = received.clone();
    let app = axum::Router::new().route(
        "/dispatch",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (log, script) = (log.clone(), script.clone());
            async move {
                log.lock().unwrap().push(Received { headers, body: body.to_vec(), at: std::time::Instant::now() });
                StatusCode::from_u16(script.lock().unwrap().next().unwrap_or(200)).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let url = format!("http://{}/dispatch", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

async fn start(settings: Settings) -> (CloudTasks, EmulatorClient, String) {
    let (addr, _) = Emulator::new(settings).serve(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await.unwrap();
    let endpoint = format!("http://{addr}");
    let client = CloudTasks::builder()
        .with_endpoint(&endpoint)
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .unwrap();
    (client, EmulatorClient::new(endpoint.clone()), endpoint)
}

async fn queue(client: &CloudTasks, id: &str, min_backoff_ms: i64) -> String {
    let name = format!("{PROJECT}/queues/{id}");
    let retry = RetryConfig::new()
        .set_max_attempts(4)
        .set_min_backoff(google_cloud_wkt::Duration::clamp(0, (min_backoff_ms * 1_000_000) as i32))
        .set_max_backoff(google_cloud_wkt::Duration::clamp(1, 0))
        .set_max_doublings(2);
    client
        .create_queue()
        .set_parent(PROJECT)
        .set_queue(Queue::new().set_name(&name).set_retry_config(retry))
        .send()
        .await
        .unwrap();
    name
}

fn timestamp_in(ms: i64) -> google_cloud_wkt::Timestamp {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 + ms;
    google_cloud_wkt::Timestamp::clamp(at / 1_000, ((at % 1_000) * 1_000_000) as i32)
}

fn http_task(name: &str, url: &str, body: &[u8]) -> Task {
    let request = HttpRequest::new()
        .set_url(url)
        .set_http_method(HttpMethod::Post)
        .set_headers([("Content-Type", "application/json"), ("X-Drip-Test", "yes")])
        .set_body(body.to_vec())
        .set_oidc_token(
            OidcToken::new()
                .set_service_account_email("tasks@drip-test.iam.gserviceaccount.com")
                .set_audience("https://dispatcher.example"),
        );
    Task::new().set_name(name).set_http_request(request)
}

#[tokio::test]
async fn dispatches_at_schedule_time_with_headers_body_and_a_verifiable_token() {
    let (client, emulator, _) = start(Settings::default()).await;
    let queue = queue(&client, "dispatch", 100).await;
    let (url, received) = target(vec![]).await;
    let name = format!("{queue}/tasks/first-task");
    let created_at = std::time::Instant::now();
    let task = http_task(&name, &url, br#"{"hello":"drip"}"#).set_schedule_time(timestamp_in(700));
    let created = client.create_task().set_parent(&queue).set_task(task).send().await.unwrap();
    assert_eq!(created.name, name);
    assert!(client.get_task().set_name(&name).send().await.is_ok());

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let received = std::mem::take(&mut *received.lock().unwrap());
    assert_eq!(received.len(), 1);
    let request = &received[0];
    let waited = request.at - created_at;
    assert!(waited >= Duration::from_millis(650), "dispatched after {waited:?}, scheduled for 700 ms");
    assert_eq!(request.body, br#"{"hello":"drip"}"#);
    assert_eq!(request.headers["x-cloudtasks-queuename"], "dispatch");
    assert_eq!(request.headers["x-cloudtasks-taskname"], "first-task");
    assert_eq!(request.headers["x-cloudtasks-taskretrycount"], "0");
    assert_eq!(request.headers["x-cloudtasks-taskexecutioncount"], "0");
    assert!(request.headers.contains_key("x-cloudtasks-tasketa"));
    assert_eq!(request.headers["x-drip-test"], "yes");
    let token = request.headers["authorization"].to_str().unwrap().strip_prefix("Bearer ").unwrap().to_owned();
    let verifier = google_cloud_auth::credentials::idtoken::verifier::Builder::new(["https://dispatcher.example"])
        .with_jwks_url(emulator.jwks_url())
        .with_email("tasks@drip-test.iam.gserviceaccount.com")
        .build();
    verifier.verify(&token).await.expect("the stand-in's token verifies against its JWKS");

    let snapshot = emulator.tasks().await.unwrap();
    assert_eq!(snapshot[0].state, "succeeded");
    assert!(client.get_task().set_name(&name).send().await.is_err(), "a finished task is gone");
}

#[tokio::test]
async fn names_are_deduplicated_with_already_exists_even_after_the_task_ran() {
    let (client, _, _) = start(Settings::default()).await;
    let queue = queue(&client, "dedup", 100).await;
    let (url, received) = target(vec![]).await;
    let name = format!("{queue}/tasks/same-name");
    client.create_task().set_parent(&queue).set_task(http_task(&name, &url, b"1")).send().await.unwrap();
    let again =
        client.create_task().set_parent(&queue).set_task(http_task(&name, &url, b"2")).send().await.unwrap_err();
    assert_eq!(again.status().map(|s| s.code), Some(Code::AlreadyExists));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(received.lock().unwrap().len(), 1);
    let after_run =
        client.create_task().set_parent(&queue).set_task(http_task(&name, &url, b"3")).send().await.unwrap_err();
    assert_eq!(after_run.status().map(|s| s.code), Some(Code::AlreadyExists), "the name stays taken (tombstone)");
}

#[tokio::test]
async fn rejects_bad_names_oversized_bodies_and_far_schedules() {
    let (client, _, _) = start(Settings::default()).await;
    let queue = queue(&client, "invalid", 100).await;
    let code = |result: Result<Task, google_cloud_tasks_v2::Error>| result.unwrap_err().status().map(|s| s.code);
    let bad_name = http_task(&format!("{queue}/tasks/has.dot"), "http://127.0.0.1:9/x", b"{}");
    assert_eq!(
        code(client.create_task().set_parent(&queue).set_task(bad_name).send().await),
        Some(Code::InvalidArgument)
    );
    let big = http_task(&format!("{queue}/tasks/big"), "http://127.0.0.1:9/x", &vec![b'x'; 1_000_001]);
    assert_eq!(code(client.create_task().set_parent(&queue).set_task(big).send().await), Some(Code::InvalidArgument));
    let fits = http_task(&format!("{queue}/tasks/fits"), "http://127.0.0.1:9/x", &vec![b'x'; 990_000]);
    assert!(client.create_task().set_parent(&queue).set_task(fits).send().await.is_ok(), "1 MB, bytes not base64");
    let far = http_task(&format!("{queue}/tasks/far"), "http://127.0.0.1:9/x", b"{}")
        .set_schedule_time(timestamp_in(31 * 86_400_000));
    assert_eq!(code(client.create_task().set_parent(&queue).set_task(far).send().await), Some(Code::InvalidArgument));
    let missing = http_task(&format!("{PROJECT}/queues/missing/tasks/a"), "http://127.0.0.1:9/x", b"{}");
    let result = client.create_task().set_parent(format!("{PROJECT}/queues/missing")).set_task(missing).send().await;
    assert_eq!(code(result), Some(Code::NotFound));
}

#[tokio::test]
async fn failed_dispatches_retry_with_the_queue_s_backoff() {
    let (client, emulator, _) = start(Settings::default()).await;
    let queue = queue(&client, "retries", 200).await;
    let (url, received) = target(vec![500, 503]).await;
    client
        .create_task()
        .set_parent(&queue)
        .set_task(http_task(&format!("{queue}/tasks/flaky"), &url, b"{}"))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let received = std::mem::take(&mut *received.lock().unwrap());
    assert_eq!(received.len(), 3, "two failures, then success");
    let retry_counts: Vec<&str> =
        received.iter().map(|r| r.headers["x-cloudtasks-taskretrycount"].to_str().unwrap()).collect();
    assert_eq!(retry_counts, ["0", "1", "2"]);
    let execution_counts: Vec<&str> =
        received.iter().map(|r| r.headers["x-cloudtasks-taskexecutioncount"].to_str().unwrap()).collect();
    assert_eq!(execution_counts, ["0", "1", "2"]);
    assert!(received[1].at - received[0].at >= Duration::from_millis(190), "min backoff 200 ms");
    assert!(received[2].at - received[1].at >= Duration::from_millis(390), "then doubled");
    let attempts = emulator.attempts().await.unwrap();
    assert_eq!(attempts.iter().map(|a| a.status).collect::<Vec<_>>(), [Some(500), Some(503), Some(200)]);
}

#[tokio::test]
async fn deleted_tasks_never_run_and_injected_faults_reach_the_client() {
    let (client, emulator, _) = start(Settings::default()).await;
    let queue = queue(&client, "faults", 100).await;
    let (url, received) = target(vec![]).await;
    let name = format!("{queue}/tasks/deleted");
    let task = http_task(&name, &url, b"{}").set_schedule_time(timestamp_in(300));
    client.create_task().set_parent(&queue).set_task(task).send().await.unwrap();
    client.delete_task().set_name(&name).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(received.lock().unwrap().is_empty());

    emulator
        .set_faults(cloud_tasks_emulator::Faults { create_task: cloud_tasks_emulator::Fault::Error })
        .await
        .unwrap();
    let err = client
        .create_task()
        .set_parent(&queue)
        .set_task(http_task(&format!("{queue}/tasks/x"), &url, b"{}"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.code), Some(Code::Internal));
}

/// The REST surface also takes what other clients send: enum names instead of numbers, no `$alt`.
#[tokio::test]
async fn string_enums_and_plain_json_are_accepted() {
    let (client, emulator, endpoint) = start(Settings::default()).await;
    let queue = queue(&client, "strings", 100).await;
    let tomorrow = std::time::SystemTime::now() + Duration::from_secs(86_400);
    let millis = tomorrow.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let at_millis = std::time::UNIX_EPOCH + Duration::from_millis(millis);
    let body = serde_json::json!({
        "task": {
            "name": format!("{queue}/tasks/put-task"),
            "scheduleTime": humantime::format_rfc3339_nanos(tomorrow).to_string(),
            "httpRequest": {"url": "http://127.0.0.1:9/x", "httpMethod": "PUT", "body": "e30="},
        },
        "responseView": "FULL",
    });
    let response =
        reqwest::Client::new().post(format!("{endpoint}/v2/{queue}/tasks")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let task: serde_json::Value = response.json().await.unwrap();
    assert_eq!(task["httpRequest"]["httpMethod"], "PUT");
    assert_eq!(task["view"], "FULL");
    assert_eq!(task["httpRequest"]["body"], "e30=");
    assert_eq!(task["scheduleTime"], humantime::format_rfc3339_nanos(at_millis).to_string(), "kept to the millisecond");
    let snapshot = emulator.tasks().await.unwrap();
    assert_eq!(snapshot[0].name, format!("{queue}/tasks/put-task"));
    let bad = serde_json::json!({"task": {"httpRequest": {"url": "http://127.0.0.1:9/x", "httpMethod": "BREW"}}});
    let refused = reqwest::Client::new().post(format!("{endpoint}/v2/{queue}/tasks")).json(&bad).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    let error: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["status"], "INVALID_ARGUMENT");
}

/// Runs six tasks against a target that holds each request 150 ms, under `settings`; returns when
/// each request arrived and the most that were in flight at once.
async fn six_slow_tasks(settings: Settings, id: &str) -> (Vec<std::time::Instant>, usize) {
    let (client, _, _) = start(settings).await;
    let queue = queue(&client, id, 100).await;
    let (in_flight, most) = (Arc::new(std::sync::atomic::AtomicUsize::new(0)), Arc::new(Mutex::new(0)));
    let starts: Arc<Mutex<Vec<std::time::Instant>>> = Arc::default();
    let (count, top, log) = (in_flight.clone(), most.clone(), starts.clone());
    let app = axum::Router::new().route(
        "/slow",
        axum::routing::post(move || {
            let (count, top, log) = (count.clone(), top.clone(), log.clone());
            async move {
                log.lock().unwrap().push(std::time::Instant::now());
                let now = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                {
                    let mut top = top.lock().unwrap();
                    *top = (*top).max(now);
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
                count.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let url = format!("http://{}/slow", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    for i in 0..6 {
        let task = http_task(&format!("{queue}/tasks/{id}-{i}"), &url, b"x");
        client.create_task().set_parent(&queue).set_task(task).send().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let starts = starts.lock().unwrap().clone();
    let most = *most.lock().unwrap();
    (starts, most)
}

/// A queue's rate limits: at most `max_concurrent_dispatches` requests in flight; starts spread at
/// `max_dispatches_per_second`; every task still runs. Without them, all six run at once.
#[tokio::test]
async fn dispatches_keep_within_the_queues_rate_limits() {
    let (starts, most) = six_slow_tasks(Settings::default(), "free").await;
    assert_eq!((starts.len(), most), (6, 6), "unbounded: all six at once");

    let concurrent = Settings { max_concurrent_dispatches: Some(2), ..Settings::default() };
    let (starts, most) = six_slow_tasks(concurrent, "concurrent").await;
    assert_eq!((starts.len(), most), (6, 2), "two in flight at most");

    let paced = Settings { max_dispatches_per_second: Some(20), ..Settings::default() };
    let (starts, _) = six_slow_tasks(paced, "paced").await;
    assert_eq!(starts.len(), 6);
    let span = *starts.last().unwrap() - starts[0];
    assert!(span >= Duration::from_millis(200), "six starts at 20/s span at least 250 ms: {span:?}");
}
