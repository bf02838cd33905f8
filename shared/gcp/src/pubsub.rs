//! Publishing, with one long-lived publisher per topic on one shared connection pool. Publishers
//! send at once (`delay_threshold` 0): a handler awaiting each publish must not wait for a batch.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::time::Duration;

use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};
use google_cloud_pubsub::client::{BasePublisher, Publisher};
use google_cloud_pubsub::model::Message;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("publishing to {topic}: {source}")]
    Failed { topic: String, source: google_cloud_pubsub::error::PublishError },
    #[error("publishing to {topic}: no answer within {timeout:?}")]
    TimedOut { topic: String, timeout: Duration },
}

/// Publishing one message and waiting for its id: [`Publishers`] in production, a recording double in
/// the handlers' in-process tests.
pub trait Publish: Send + Sync + std::fmt::Debug {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> crate::GcpFuture<'a, String, PublishError>;
}

impl Publish for Publishers {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> crate::GcpFuture<'a, String, PublishError> {
        Box::pin(Publishers::publish(self, topic, data, attributes))
    }
}

#[derive(Debug)]
pub struct Publishers {
    base: BasePublisher,
    project: String,
    timeout: Duration,
    by_topic: RwLock<HashMap<String, Publisher>>,
}

impl Publishers {
    /// `endpoint`: the emulator's `host:port` or URL; `None` for the real service.
    pub async fn connect(
        project: &str,
        endpoint: Option<&str>,
        timeout: Duration,
    ) -> Result<Self, google_cloud_gax::client_builder::Error> {
        let mut builder = BasePublisher::builder().with_retry_policy(Aip194Strict.with_time_limit(timeout));
        if let Some(endpoint) = endpoint {
            builder = builder.with_endpoint(crate::endpoint_url(endpoint));
        }
        if let Some(credentials) = crate::emulator_credentials(endpoint) {
            builder = builder.with_credentials(credentials);
        }
        Ok(Self { base: builder.build().await?, project: project.to_owned(), timeout, by_topic: RwLock::default() })
    }

    /// `payouts-ready` → `projects/<project>/topics/payouts-ready`; full names are kept.
    pub fn topic_name(&self, topic: &str) -> String {
        if topic.starts_with("projects/") {
            topic.to_owned()
        } else {
            format!("projects/{}/topics/{topic}", self.project)
        }
    }

    fn publisher(&self, topic: &str) -> Publisher {
        if let Some(publisher) = self.by_topic.read().unwrap_or_else(|e| e.into_inner()).get(topic) {
            return publisher.clone();
        }
        let mut by_topic = self.by_topic.write().unwrap_or_else(|e| e.into_inner());
        by_topic
            .entry(topic.to_owned())
            .or_insert_with(|| self.base.publisher(self.topic_name(topic)).set_delay_threshold(Duration::ZERO).build())
            .clone()
    }

    /// Publishes and waits for the server's message id.
    pub async fn publish(
        &self,
        topic: &str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> Result<String, PublishError> {
        let message = Message::new().set_data(data).set_attributes(attributes);
        let publish = self.publisher(topic).publish(message);
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(Ok(id)) => Ok(id),
            Ok(Err(source)) => Err(PublishError::Failed { topic: topic.to_owned(), source }),
            Err(_) => Err(PublishError::TimedOut { topic: topic.to_owned(), timeout: self.timeout }),
        }
    }
}
