//! A publisher that counts what it sends Pub/Sub: requests and the messages they carry, by topic
//! (`drip_pubsub_requests_total`, `drip_pubsub_messages_total`), around the real client and
//! inside the group commit, so their ratio is how well publishes are batched.

use std::collections::BTreeMap;
use std::sync::Arc;

use drip_gcp::pubsub::{Outgoing, Publish, PublishAllFuture, PublishError};

use crate::metrics::Metrics;

#[derive(Debug)]
pub struct CountedPublish {
    inner: Arc<dyn Publish>,
    metrics: Arc<Metrics>,
}

impl CountedPublish {
    pub fn new(inner: Arc<dyn Publish>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self { inner, metrics })
    }
}

impl Publish for CountedPublish {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> drip_gcp::GcpFuture<'a, String, PublishError> {
        self.metrics.publish_request(topic, 1);
        self.inner.publish(topic, data, attributes)
    }

    /// One request (the client cuts a request at 1,000 messages or 10 MB; a batch is at most
    /// `DRIP_PUBLISH_BATCH_MAX` of messages Pub/Sub takes, so one).
    fn publish_all<'a>(&'a self, topic: &'a str, messages: Vec<Outgoing>) -> PublishAllFuture<'a> {
        self.metrics.publish_request(topic, messages.len());
        self.inner.publish_all(topic, messages)
    }
}

#[cfg(test)]
mod tests {
    use drip_gcp::doubles::RecordingPublisher;
    use drip_gcp::pubsub::BatchedPublishes;

    use super::*;

    /// A publisher whose requests take 10 ms.
    #[derive(Debug)]
    struct Slow(Arc<RecordingPublisher>);

    impl Publish for Slow {
        fn publish<'a>(
            &'a self,
            topic: &'a str,
            data: Vec<u8>,
            attributes: BTreeMap<String, String>,
        ) -> drip_gcp::GcpFuture<'a, String, PublishError> {
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                self.0.publish(topic, data, attributes).await
            })
        }
    }

    #[tokio::test]
    async fn counts_each_request_and_the_messages_it_carries() {
        let metrics = Arc::new(Metrics::default());
        let recording = Arc::new(RecordingPublisher::default());
        let counted = CountedPublish::new(recording.clone(), metrics.clone());
        counted.publish("a", b"1".to_vec(), BTreeMap::new()).await.unwrap();
        let three = (0..3).map(|i| (vec![i], BTreeMap::new())).collect();
        assert!(counted.publish_all("a", three).await.iter().all(Result::is_ok));
        // Behind group commit: 20 concurrent publishes, a lone one first, then the rest together
        // (batches form while a request is in flight: each takes 10 ms here).
        let slow = CountedPublish::new(Arc::new(Slow(recording.clone())), metrics.clone());
        let batched = BatchedPublishes::new(slow, 100);
        let each = (0..20).map(|i| batched.publish("b", vec![i], BTreeMap::new()));
        assert!(futures_util::future::join_all(each).await.iter().all(Result::is_ok));
        assert_eq!(recording.published.lock().unwrap().len(), 24, "every message sent");

        let text = metrics.render();
        let count = |name: &str, topic: &str| -> u64 {
            let prefix = format!("drip_{name}_total{{topic=\"{topic}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        assert_eq!((count("pubsub_requests", "a"), count("pubsub_messages", "a")), (2, 4), "{text}");
        let requests = count("pubsub_requests", "b");
        assert_eq!(count("pubsub_messages", "b"), 20, "{text}");
        assert!((1..20).contains(&requests), "20 publishes that arrive together share requests: {requests}");
    }
}
