//! Google's Pub/Sub emulator for tests: the shared one `./run test` starts
//! (`DRIP_TEST_PUBSUB_EMULATOR_HOST`) or a private one a test owns (and may stop and restart),
//! and the REST calls tests make to it: topics, subscriptions, publish, pull.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::redis_server::free_port;

pub const EMULATOR: &str = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";
pub const PROJECT: &str = "drip-test";

#[derive(Debug)]
pub struct PubsubEmulator {
    child: Option<Child>,
    pub port: u16,
}

impl PubsubEmulator {
    pub fn start() -> Self {
        let mut emulator = Self { child: None, port: free_port() };
        emulator.restart();
        emulator
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// (Re)starts it on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new(EMULATOR)
            .args(["--host=127.0.0.1", &format!("--port={}", self.port)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("the Pub/Sub emulator of the Cloud SDK");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !answers_ok(self.port) {
            assert!(Instant::now() < deadline, "the Pub/Sub emulator on port {} never answered", self.port);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The emulator is ready when `GET /` answers `Ok`.
fn answers_ok(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.") && reply.contains(" 200 ") && reply.trim_end().ends_with("Ok")
}

impl Drop for PubsubEmulator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The emulator a test talks to: the shared one, or one of its own.
#[derive(Debug)]
pub struct Pubsub {
    pub host: String,
    _owned: Option<PubsubEmulator>,
    http: reqwest::Client,
}

#[derive(Debug, Clone)]
pub struct Pulled {
    pub message_id: String,
    pub data: Vec<u8>,
    pub attributes: BTreeMap<String, String>,
    pub publish_time: String,
}

impl Pubsub {
    pub fn shared() -> Self {
        match std::env::var("DRIP_TEST_PUBSUB_EMULATOR_HOST") {
            Ok(host) => Self { host, _owned: None, http: reqwest::Client::new() },
            Err(_) => Self::own(PubsubEmulator::start()),
        }
    }

    pub fn own(emulator: PubsubEmulator) -> Self {
        Self { host: emulator.host(), _owned: Some(emulator), http: reqwest::Client::new() }
    }

    pub fn emulator(&mut self) -> Option<&mut PubsubEmulator> {
        self._owned.as_mut()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/v1/projects/{PROJECT}/{path}", self.host)
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response =
            self.http.request(method, self.url(path)).json(&body).send().await.expect("the Pub/Sub emulator answers");
        let status = response.status();
        let value: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {value}");
        value
    }

    pub async fn create_topic(&self, topic: &str) {
        self.call(reqwest::Method::PUT, &format!("topics/{topic}"), json!({})).await;
    }

    /// A pull subscription (no `push_endpoint`) or a push one, with a 10 s ack deadline and a
    /// short retry backoff so redeliveries come quickly in tests.
    pub async fn create_subscription(&self, subscription: &str, topic: &str, push_endpoint: Option<&str>) {
        let mut body = json!({
            "topic": format!("projects/{PROJECT}/topics/{topic}"),
            "ackDeadlineSeconds": 10,
            "retryPolicy": {"minimumBackoff": "0.1s", "maximumBackoff": "1s"},
        });
        if let Some(endpoint) = push_endpoint {
            body["pushConfig"] = json!({"pushEndpoint": endpoint});
        }
        self.call(reqwest::Method::PUT, &format!("subscriptions/{subscription}"), body).await;
    }

    /// A topic with a pull subscription of the same name.
    pub async fn topic_with_subscription(&self, topic: &str) {
        self.create_topic(topic).await;
        self.create_subscription(topic, topic, None).await;
    }

    pub async fn publish(&self, topic: &str, data: &[u8], attributes: &BTreeMap<String, String>) -> String {
        let message = json!({"data": base64::engine::general_purpose::STANDARD.encode(data), "attributes": attributes});
        let reply =
            self.call(reqwest::Method::POST, &format!("topics/{topic}:publish"), json!({"messages": [message]})).await;
        reply["messageIds"][0].as_str().unwrap_or_default().to_owned()
    }

    /// Pulls and acks what is there now (at most `max`).
    pub async fn pull(&self, subscription: &str, max: usize) -> Vec<Pulled> {
        let reply = self
            .call(
                reqwest::Method::POST,
                &format!("subscriptions/{subscription}:pull"),
                json!({"maxMessages": max, "returnImmediately": true}),
            )
            .await;
        let received = reply["receivedMessages"].as_array().cloned().unwrap_or_default();
        let ack_ids: Vec<Value> = received.iter().map(|r| r["ackId"].clone()).collect();
        if !ack_ids.is_empty() {
            self.call(
                reqwest::Method::POST,
                &format!("subscriptions/{subscription}:acknowledge"),
                json!({"ackIds": ack_ids}),
            )
            .await;
        }
        received
            .iter()
            .map(|r| {
                let m = &r["message"];
                Pulled {
                    message_id: m["messageId"].as_str().unwrap_or_default().to_owned(),
                    data: base64::engine::general_purpose::STANDARD
                        .decode(m["data"].as_str().unwrap_or_default())
                        .unwrap_or_default(),
                    attributes: serde_json::from_value(m["attributes"].clone()).unwrap_or_default(),
                    publish_time: m["publishTime"].as_str().unwrap_or_default().to_owned(),
                }
            })
            .collect()
    }

    /// Pulls until `count` messages came or `timeout` passed.
    pub async fn pull_until(&self, subscription: &str, count: usize, timeout: Duration) -> Vec<Pulled> {
        let deadline = Instant::now() + timeout;
        let mut all = Vec::new();
        while all.len() < count && Instant::now() < deadline {
            let batch = self.pull(subscription, 1_000).await;
            if batch.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            all.extend(batch);
        }
        all
    }
}
