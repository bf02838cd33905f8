//! Creating the signed Cloud Task that carries a delayed event to the dispatcher at its slot: the
//! limiter for each delayed event, the dispatcher for an event an `overflow: { url }` target told
//! to wait (docs/design.md: "Overflow to an HTTP target").

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use drip_core::overflow::{SIGNATURE_HEADER, TaskSeal, TaskSigner, queue_index};
use drip_core::time::Millis;
use drip_gcp::tasks::{CreateTask, CreateTaskError, Created, TaskCreator, TaskTarget};
use envconfig::Envconfig;

/// How delayed events are grouped into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskBatching {
    /// The most events one task carries (1: a task per event).
    pub max_events: usize,
    /// The slots of one task's events lie in one bucket of this length.
    pub bucket: Millis,
    /// Creates of one (queue, bucket) in flight at once: fewer make larger batches, and make a
    /// push that arrives during them wait for one more create (docs/design.md: "Batching").
    pub in_flight: usize,
    /// How long each create of a (queue, bucket) waits for more delayed events to share its task
    /// (0: none; a lone event at an idle lane then goes at once). Its pushes are answered that much
    /// later; the events are not delivered later.
    pub linger: Millis,
}

/// Cloud Tasks settings (docs/operations.md: "Settings").
#[derive(Debug, Clone, Envconfig)]
pub struct TaskSettings {
    /// The Cloud Tasks stand-in's URL; unset for the real service.
    #[envconfig(from = "CLOUD_TASKS_ENDPOINT")]
    pub cloud_tasks_endpoint: Option<String>,
    /// Comma-separated queues, as ids (in DRIP_TASKS_LOCATION) or full names. A key's tasks always
    /// go to the same queue; more queues lift Cloud Tasks' 500 dispatches/s per queue.
    #[envconfig(from = "DRIP_TASKS_QUEUES")]
    pub tasks_queues: Option<String>,
    #[envconfig(from = "DRIP_TASKS_LOCATION", default = "us-central1")]
    pub tasks_location: String,
    /// The dispatcher's `/dispatch` URL that tasks call.
    #[envconfig(from = "DRIP_DISPATCHER_URL")]
    pub dispatcher_url: Option<String>,
    /// The service account whose OIDC token tasks carry to the dispatcher.
    #[envconfig(from = "DRIP_TASKS_SERVICE_ACCOUNT")]
    pub tasks_service_account: Option<String>,
    /// The audience of that token; defaults to the dispatcher URL's origin.
    #[envconfig(from = "DRIP_TASKS_AUDIENCE")]
    pub tasks_audience: Option<String>,
    #[envconfig(from = "DRIP_TASKS_TIMEOUT_MS", default = "2500")]
    pub tasks_timeout_ms: u64,
    /// How long after its slot the queues may still run a task: its attempts times the longest
    /// backoff, and a margin (Terraform sets it from the queues' retry config; the default fits
    /// 100 attempts of at most 300 s). A task's signature expires then.
    #[envconfig(from = "DRIP_TASKS_RETRY_SPAN_MS", default = "32400000")]
    pub tasks_retry_span_ms: u64,
    /// The most delayed events one task carries (1: a task per event). Events of one queue whose
    /// slots fall in one bucket and that arrive while a task of that bucket is being created share
    /// the next task.
    #[envconfig(from = "DRIP_TASK_BATCH_MAX", default = "500")]
    pub task_batch_max: usize,
    /// How far apart the slots of one task's events may be: the dispatcher holds the task from
    /// its first slot to its last.
    #[envconfig(from = "DRIP_TASK_BATCH_BUCKET_MS", default = "1000")]
    pub task_batch_bucket_ms: u64,
    /// Creates of one queue and bucket in flight at once.
    #[envconfig(from = "DRIP_TASK_BATCH_IN_FLIGHT", default = "2")]
    pub task_batch_in_flight: usize,
    /// How long each create of a (queue, bucket) waits for more delayed events to share its task
    /// (their pushes are answered that much later; the events go at their slots all the same).
    #[envconfig(from = "DRIP_TASK_BATCH_LINGER_MS", default = "20")]
    pub task_batch_linger_ms: u64,
}

impl TaskSettings {
    /// Whether tasks can be created at all (the dispatcher needs them only for `overflow: { url }`).
    pub fn configured(&self) -> bool {
        self.tasks_queues.is_some() || self.dispatcher_url.is_some()
    }

    /// Full queue names.
    pub fn queues(&self, project: &str) -> anyhow::Result<Vec<String>> {
        let queues: Vec<String> = self
            .tasks_queues
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .map(|q| {
                if q.starts_with("projects/") {
                    q.to_owned()
                } else {
                    format!("projects/{project}/locations/{}/queues/{q}", self.tasks_location)
                }
            })
            .collect();
        if queues.is_empty() {
            bail!("DRIP_TASKS_QUEUES names no queue");
        }
        Ok(queues)
    }

    pub fn dispatcher_url(&self) -> anyhow::Result<&str> {
        match self.dispatcher_url.as_deref() {
            Some(url) if url.starts_with("https://") || url.starts_with("http://") => Ok(url),
            Some(url) => bail!("DRIP_DISPATCHER_URL must be an http(s) URL, got '{url}'"),
            None => bail!("DRIP_DISPATCHER_URL is not set"),
        }
    }

    pub fn tasks_audience(&self) -> anyhow::Result<String> {
        Ok(self.tasks_audience.clone().unwrap_or_else(|| origin(self.dispatcher_url().unwrap_or_default())))
    }

    /// Checks every setting a service that creates tasks needs.
    pub fn check(&self, project: &str) -> anyhow::Result<()> {
        self.queues(project)?;
        self.dispatcher_url()?;
        Ok(())
    }

    pub fn batching(&self) -> TaskBatching {
        TaskBatching {
            max_events: self.task_batch_max.max(1),
            bucket: self.task_batch_bucket_ms.max(1) as Millis,
            in_flight: self.task_batch_in_flight.max(1),
            linger: self.task_batch_linger_ms as Millis,
        }
    }

    pub async fn connect(&self, project: &str, signer: TaskSigner) -> anyhow::Result<Tasks> {
        let target = TaskTarget {
            url: self.dispatcher_url()?.to_owned(),
            service_account: self.tasks_service_account.clone(),
            audience: self.tasks_audience()?,
        };
        let client = TaskCreator::connect(
            self.cloud_tasks_endpoint.as_deref(),
            target,
            Duration::from_millis(self.tasks_timeout_ms),
        )
        .await
        .context("creating the Cloud Tasks client (CLOUD_TASKS_ENDPOINT / credentials)")?;
        let tasks = Tasks::new(Arc::new(client), self.queues(project)?, signer);
        Ok(tasks.with_retry_span(self.tasks_retry_span_ms as Millis))
    }
}

/// `https://host/path` → `https://host`.
pub fn origin(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(slash) => url[..after_scheme + slash].to_owned(),
        None => url.to_owned(),
    }
}

/// The default of DRIP_TASKS_RETRY_SPAN_MS.
pub const DEFAULT_RETRY_SPAN: Millis = 9 * drip_core::time::HOUR;

/// Creates signed tasks on the queue of their key.
#[derive(Debug, Clone)]
pub struct Tasks {
    pub client: Arc<dyn CreateTask>,
    pub queues: Arc<Vec<String>>,
    signer: TaskSigner,
    retry_span: Millis,
}

impl Tasks {
    pub fn new(client: Arc<dyn CreateTask>, queues: Vec<String>, signer: TaskSigner) -> Self {
        Self { client, queues: Arc::new(queues), signer, retry_span: DEFAULT_RETRY_SPAN }
    }

    /// How long after its slot a task may still run (and its signature hold).
    pub fn with_retry_span(self, retry_span: Millis) -> Self {
        Self { retry_span, ..self }
    }

    /// Creates task `name` for (rule id, key) at `slot` with `body` (an encoded `TaskBody`),
    /// sealed: its signature covers the name, the slot, the expiry (slot + retry span) and the body.
    pub async fn create(
        &self,
        (rule, key): (&str, &str),
        name: &str,
        slot: Millis,
        body: Vec<u8>,
    ) -> Result<Created, CreateTaskError> {
        self.create_on(self.queue_of(rule, key), name, slot, body).await
    }

    /// The number of the queue that takes (rule id, key)'s tasks.
    pub fn queue_of(&self, rule: &str, key: &str) -> usize {
        queue_index(rule, key, self.queues.len())
    }

    /// Creates task `name` on queue number `queue`, sealed as [`Tasks::create`] seals it.
    pub async fn create_on(
        &self,
        queue: usize,
        name: &str,
        slot: Millis,
        body: Vec<u8>,
    ) -> Result<Created, CreateTaskError> {
        let queue = &self.queues[queue];
        let headers = HashMap::from([
            ("Content-Type".to_owned(), "application/json".to_owned()),
            (
                SIGNATURE_HEADER.to_owned(),
                self.signer.sign(&TaskSeal { name, slot, expires: slot + self.retry_span }, &body),
            ),
        ]);
        self.client.create(queue, name, slot, body, headers).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_span_setting_defaults_to_the_span_tasks_are_made_with() {
        let settings = TaskSettings::init_from_hashmap(&HashMap::new()).unwrap();
        assert_eq!(settings.tasks_retry_span_ms as Millis, DEFAULT_RETRY_SPAN);
    }
}
