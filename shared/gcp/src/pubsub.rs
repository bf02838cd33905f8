//! Publishing, with long-lived publishers per topic on one shared connection pool. A lone publish
//! is sent at once (`delay_threshold` 0: a handler awaiting it must not wait for a batch); the
//! publishes that arrive while a topic's requests are in flight go together in the next request
//! ([`BatchedPublishes`], group commit: `drip_batch`).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use drip_batch::{Batcher, Flush, Linger, up_to};

use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};
use google_cloud_pubsub::client::{BasePublisher, Publisher};
use google_cloud_pubsub::model::Message;

/// How much longer than its own time limit the client may take to answer: an attempt the limit
/// bounds, the backoff's last sleep, and scheduling on a loaded instance.
const CLIENT_ANSWER_SLACK: Duration = Duration::from_secs(2);

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

    /// Publishes several messages to one topic in as few requests as the client makes of them;
    /// one result each, in order. By default, each on its own, all at once.
    fn publish_all<'a>(&'a self, topic: &'a str, messages: Vec<Outgoing>) -> PublishAllFuture<'a> {
        let each = messages.into_iter().map(|(data, attributes)| self.publish(topic, data, attributes));
        Box::pin(futures_util::future::join_all(each))
    }
}

/// A message to publish: its data and attributes.
pub type Outgoing = (Vec<u8>, BTreeMap<String, String>);

pub type PublishAllFuture<'a> = Pin<Box<dyn Future<Output = Vec<Result<String, PublishError>>> + Send + 'a>>;

impl Publish for Publishers {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> crate::GcpFuture<'a, String, PublishError> {
        Box::pin(Publishers::publish(self, topic, data, attributes))
    }

    fn publish_all<'a>(&'a self, topic: &'a str, messages: Vec<Outgoing>) -> PublishAllFuture<'a> {
        Box::pin(Publishers::publish_all(self, topic, messages))
    }
}

#[derive(Debug)]
pub struct Publishers {
    base: BasePublisher,
    project: String,
    timeout: Duration,
    by_topic: RwLock<HashMap<String, Publisher>>,
    /// Publishers that send only when flushed (or full), for [`Publishers::publish_all`].
    batching_by_topic: RwLock<HashMap<String, Publisher>>,
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
        Ok(Self {
            base: builder.build().await?,
            project: project.to_owned(),
            timeout,
            by_topic: RwLock::default(),
            batching_by_topic: RwLock::default(),
        })
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
        self.cached(&self.by_topic, topic, Duration::ZERO)
    }

    fn cached(&self, cache: &RwLock<HashMap<String, Publisher>>, topic: &str, delay: Duration) -> Publisher {
        if let Some(publisher) = cache.read().unwrap_or_else(|e| e.into_inner()).get(topic) {
            return publisher.clone();
        }
        let mut by_topic = cache.write().unwrap_or_else(|e| e.into_inner());
        by_topic
            .entry(topic.to_owned())
            .or_insert_with(|| self.base.publisher(self.topic_name(topic)).set_delay_threshold(delay).build())
            .clone()
    }

    /// Publishes `messages` together: queued on a publisher that never sends on a timer, then
    /// flushed (the client cuts its requests at its own count and byte limits).
    pub async fn publish_all(&self, topic: &str, messages: Vec<Outgoing>) -> Vec<Result<String, PublishError>> {
        let publisher = self.cached(&self.batching_by_topic, topic, Duration::MAX);
        let pending: Vec<_> = messages
            .into_iter()
            .map(|(data, attributes)| publisher.publish(Message::new().set_data(data).set_attributes(attributes)))
            .collect();
        let answers = futures_util::future::join_all(pending.into_iter().map(|publish| self.answer(topic, publish)));
        let (_, answers) =
            tokio::join!(tokio::time::timeout(self.timeout + CLIENT_ANSWER_SLACK, publisher.flush()), answers);
        answers
    }

    /// The client's answer to a publish. The client ends every publish within `timeout` by itself
    /// (its retry policy's time limit also bounds each attempt), and its answer is the outcome: a
    /// failure it reports was not sent later. Our own timer only catches a client that never
    /// answers, so it waits longer than the client may take; were it to fire first, Drip would
    /// report failure for a publish still going on, which could land after a retry published it
    /// again.
    async fn answer(
        &self,
        topic: &str,
        publish: impl Future<Output = Result<String, google_cloud_pubsub::error::PublishError>>,
    ) -> Result<String, PublishError> {
        match tokio::time::timeout(self.timeout + CLIENT_ANSWER_SLACK, publish).await {
            Ok(Ok(id)) => Ok(id),
            Ok(Err(source)) => Err(PublishError::Failed { topic: topic.to_owned(), source }),
            Err(_) => Err(PublishError::TimedOut { topic: topic.to_owned(), timeout: self.timeout }),
        }
    }

    /// Publishes and waits for the server's message id.
    pub async fn publish(
        &self,
        topic: &str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> Result<String, PublishError> {
        let message = Message::new().set_data(data).set_attributes(attributes);
        self.answer(topic, self.publisher(topic).publish(message)).await
    }
}

/// Group commit of publishes, per topic: a lone publish goes at once; those that arrive while the
/// topic's requests are in flight go together in the next ([`Publish::publish_all`]).
#[derive(Debug)]
pub struct BatchedPublishes {
    inner: Arc<dyn Publish>,
    batcher: Batcher<PublishCalls>,
}

/// One `publish_all` per batch.
#[derive(Debug)]
pub struct PublishCalls {
    inner: Arc<dyn Publish>,
    max_batch: usize,
}

impl Flush for PublishCalls {
    type Lane = String;
    type Item = Outgoing;
    type Output = Result<String, PublishError>;

    fn take(&self, waiting: &mut dyn Iterator<Item = &Outgoing>) -> usize {
        up_to(self.max_batch, waiting)
    }

    async fn flush(&self, topic: &String, messages: Vec<Outgoing>) -> Vec<Self::Output> {
        match messages.len() {
            1 => {
                let Some((data, attributes)) = messages.into_iter().next() else { return Vec::new() };
                vec![self.inner.publish(topic, data, attributes).await]
            }
            _ => self.inner.publish_all(topic, messages).await,
        }
    }
}

/// Requests of one topic in flight at once.
const PUBLISHES_IN_FLIGHT: usize = 4;

impl BatchedPublishes {
    /// `max_batch`: the most messages one request carries (1: each on its own).
    pub fn new(inner: Arc<dyn Publish>, max_batch: usize) -> Self {
        let calls = PublishCalls { inner: inner.clone(), max_batch: max_batch.max(1) };
        Self { inner, batcher: Batcher::new(calls, max_batch, PUBLISHES_IN_FLIGHT, Linger::default()) }
    }
}

impl Publish for BatchedPublishes {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> crate::GcpFuture<'a, String, PublishError> {
        Box::pin(async move {
            let answer = self.batcher.submit(topic.to_owned(), (data, attributes)).await;
            answer.unwrap_or_else(|| Err(PublishError::TimedOut { topic: topic.to_owned(), timeout: Duration::ZERO }))
        })
    }

    fn publish_all<'a>(&'a self, topic: &'a str, messages: Vec<Outgoing>) -> PublishAllFuture<'a> {
        self.inner.publish_all(topic, messages)
    }
}
