//! A small REST client for Google's Pub/Sub emulator, for the demo and the tests: create topics and
//! subscriptions, publish, pull. Production code publishes through the official client instead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct EmulatorClient {
    /// `host:port`.
    pub host: String,
    pub project: String,
    http: reqwest::Client,
}

/// A message read back from a subscription.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub message_id: String,
    pub data: Vec<u8>,
    pub attributes: BTreeMap<String, String>,
    pub publish_time: String,
}

#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("Pub/Sub emulator: {0}")]
    Http(#[from] reqwest::Error),
    #[error("Pub/Sub emulator: {path} answered {status}: {body}")]
    Refused { path: String, status: u16, body: String },
}

impl EmulatorClient {
    pub fn new(host: impl Into<String>, project: impl Into<String>) -> Self {
        Self { host: host.into(), project: project.into(), http: reqwest::Client::new() }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Result<Value, EmulatorError> {
        let url = format!("http://{}/v1/projects/{}/{path}", self.host, self.project);
        let response = self.http.request(method, url).json(&body).send().await?;
        let status = response.status();
        let value: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(EmulatorError::Refused {
                path: path.to_owned(),
                status: status.as_u16(),
                body: value.to_string(),
            });
        }
        Ok(value)
    }

    pub async fn create_topic(&self, topic: &str) -> Result<(), EmulatorError> {
        self.call(reqwest::Method::PUT, &format!("topics/{topic}"), json!({})).await.map(|_| ())
    }

    /// A pull subscription, or a push one to `push_endpoint`. It has no retry policy: the emulator
    /// (0.8.20) then redelivers a failed push about every second for as long as it fails, while
    /// with one it redelivers a failed push two or three times and then never again, which loses
    /// the messages a test or the demo waits for.
    pub async fn create_subscription(
        &self,
        subscription: &str,
        topic: &str,
        push_endpoint: Option<&str>,
    ) -> Result<(), EmulatorError> {
        let mut body = json!({
            "topic": format!("projects/{}/topics/{topic}", self.project),
            "ackDeadlineSeconds": 10,
        });
        if let Some(endpoint) = push_endpoint {
            body["pushConfig"] = json!({"pushEndpoint": endpoint});
        }
        self.call(reqwest::Method::PUT, &format!("subscriptions/{subscription}"), body).await.map(|_| ())
    }

    /// A topic with a pull subscription of the same name.
    pub async fn topic_with_subscription(&self, topic: &str) -> Result<(), EmulatorError> {
        self.create_topic(topic).await?;
        self.create_subscription(topic, topic, None).await
    }

    /// Publishes a batch; returns the message ids in order.
    pub async fn publish_batch(
        &self,
        topic: &str,
        messages: &[(Vec<u8>, BTreeMap<String, String>)],
    ) -> Result<Vec<String>, EmulatorError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|(data, attributes)| json!({"data": base64::engine::general_purpose::STANDARD.encode(data), "attributes": attributes}))
            .collect();
        let reply =
            self.call(reqwest::Method::POST, &format!("topics/{topic}:publish"), json!({"messages": messages})).await?;
        Ok(reply["messageIds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|id| id.as_str().map(str::to_owned))
            .collect())
    }

    pub async fn publish(
        &self,
        topic: &str,
        data: &[u8],
        attributes: &BTreeMap<String, String>,
    ) -> Result<String, EmulatorError> {
        Ok(self
            .publish_batch(topic, &[(data.to_vec(), attributes.clone())])
            .await?
            .into_iter()
            .next()
            .unwrap_or_default())
    }

    /// Pulls and acks what is there now (at most `max`).
    pub async fn pull(&self, subscription: &str, max: usize) -> Result<Vec<Pulled>, EmulatorError> {
        let body = json!({"maxMessages": max, "returnImmediately": true});
        let reply = self.call(reqwest::Method::POST, &format!("subscriptions/{subscription}:pull"), body).await?;
        let received = reply["receivedMessages"].as_array().cloned().unwrap_or_default();
        let ack_ids: Vec<Value> = received.iter().map(|r| r["ackId"].clone()).collect();
        if !ack_ids.is_empty() {
            self.call(
                reqwest::Method::POST,
                &format!("subscriptions/{subscription}:acknowledge"),
                json!({"ackIds": ack_ids}),
            )
            .await?;
        }
        Ok(received
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
            .collect())
    }

    /// Pulls until `count` messages came or `timeout` passed.
    pub async fn pull_until(
        &self,
        subscription: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Pulled>, EmulatorError> {
        let deadline = Instant::now() + timeout;
        let mut all = Vec::new();
        while all.len() < count && Instant::now() < deadline {
            let batch = self.pull(subscription, 1_000).await?;
            if batch.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            all.extend(batch);
        }
        Ok(all)
    }
}
