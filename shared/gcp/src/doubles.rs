//! Recording doubles of Pub/Sub and Cloud Tasks, for the services' in-process handler tests: each
//! records what it was asked and fails as a test tells it to, for faults the real parts (the
//! emulator, the Cloud Tasks stand-in) cannot be made to produce in a test that runs no services.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use drip_core::time::{Millis, wall_clock_millis};

use crate::pubsub::PublishError;
use crate::tasks::{CreateTask, CreateTaskError, Created};
use crate::{GcpFuture, pubsub::Publish};

#[derive(Debug, Clone)]
pub struct Published {
    pub topic: String,
    pub data: Vec<u8>,
    pub attributes: BTreeMap<String, String>,
    /// The wall clock when it was published.
    pub at: Millis,
}

#[derive(Debug, Default)]
pub struct RecordingPublisher {
    pub published: Mutex<Vec<Published>>,
    /// Topics whose publishes time out.
    pub failing: Mutex<Vec<String>>,
    /// Topics whose publishes never answer.
    pub hanging: Mutex<Vec<String>>,
    /// Messages (`drip-message-id`) whose next publish times out.
    pub fail_once: Mutex<BTreeSet<String>>,
}

impl Publish for RecordingPublisher {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        data: Vec<u8>,
        attributes: BTreeMap<String, String>,
    ) -> GcpFuture<'a, String, PublishError> {
        if self.hanging.lock().unwrap().iter().any(|t| t == topic) {
            return Box::pin(std::future::pending());
        }
        let once = attributes.get("drip-message-id").is_some_and(|id| self.fail_once.lock().unwrap().remove(id));
        let result = if once || self.failing.lock().unwrap().iter().any(|t| t == topic) {
            Err(PublishError::TimedOut { topic: topic.to_owned(), timeout: Duration::from_secs(1) })
        } else {
            let mut published = self.published.lock().unwrap();
            published.push(Published { topic: topic.to_owned(), data, attributes, at: wall_clock_millis() });
            Ok(published.len().to_string())
        };
        Box::pin(async move { result })
    }
}

#[derive(Debug, Clone)]
pub struct CreatedTask {
    pub queue: String,
    pub id: String,
    pub at: Millis,
    pub body: Vec<u8>,
    pub headers: HashMap<String, String>,
}

#[derive(Debug, Default)]
pub struct RecordingTasks {
    pub created: Mutex<Vec<CreatedTask>>,
    /// Cloud Tasks refuses every task as INVALID_ARGUMENT.
    pub refuse: Mutex<bool>,
    /// How long a create takes to answer (a round trip to Cloud Tasks); it takes effect at once.
    pub latency: Mutex<std::time::Duration>,
}

impl CreateTask for RecordingTasks {
    fn create<'a>(
        &'a self,
        queue: &'a str,
        task_id: &'a str,
        schedule_time: Millis,
        body: Vec<u8>,
        headers: HashMap<String, String>,
    ) -> GcpFuture<'a, Created, CreateTaskError> {
        let result = if *self.refuse.lock().unwrap() {
            let status = google_cloud_gax::error::rpc::Status::default()
                .set_code(google_cloud_gax::error::rpc::Code::InvalidArgument)
                .set_message("the task is invalid");
            Err(CreateTaskError { name: task_id.to_owned(), source: google_cloud_gax::error::Error::service(status) })
        } else {
            let mut created = self.created.lock().unwrap();
            if created.iter().any(|t| t.id == task_id) {
                Ok(Created::AlreadyExisted)
            } else {
                let task = CreatedTask { queue: queue.into(), id: task_id.into(), at: schedule_time, body, headers };
                created.push(task);
                Ok(Created::New)
            }
        };
        let latency = *self.latency.lock().unwrap();
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            result
        })
    }
}
