//! Batched delayed delivery: delayed events of one queue whose slots fall in one bucket (default
//! 1 s) travel in one Cloud Task. Group commit again, with a linger: each create of a bucket waits
//! up to `DRIP_TASK_BATCH_LINGER_MS` for more events (in the limiter, only while a push in flight
//! may still join it), and the events that arrive while the creates are in flight share the next
//! one. A task of one event is that event's own (the per-event task, name and body of an
//! unbatched Drip). Each caller is answered only once the task that carries its event exists, so a
//! push is acked only then.
//!
//! A batch task's name is a hash of its events' own task names, so a retried create of the same
//! batch is ALREADY_EXISTS. An event can still travel in two tasks (a create that timed out and a
//! redelivery regrouped elsewhere): the dispatcher's once-only claim per event publishes it once.

use std::sync::Arc;
use std::time::Duration;

use drip_batch::{Batcher, Caller, Callers, Flush, Linger, fan_out};
use drip_core::overflow::{BATCH_ENVELOPE, MAX_INLINE_TASK_BODY, TaskBatch, batch_task_id};
use drip_core::time::Millis;
use drip_gcp::tasks::{CreateTaskError, Created};

pub use crate::tasks::TaskBatching;
use crate::tasks::Tasks;

/// One event's own task: what it would be created as alone.
#[derive(Debug, Clone)]
pub struct EventTask {
    pub name: String,
    pub slot: Millis,
    /// The encoded `TaskBody`.
    pub body: Vec<u8>,
}

pub type TaskResult = Result<Created, TaskError>;

/// Why an event's task was not created (shared by every event of a batch).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Create(Arc<CreateTaskError>),
    /// Its create never answered (the runtime is shutting down): retry the push.
    #[error("the create of the event's task was abandoned")]
    Abandoned,
}

impl TaskError {
    /// Cloud Tasks refused the event's task itself: no retry can help.
    pub fn is_invalid(&self) -> bool {
        matches!(self, TaskError::Create(error) if error.is_invalid())
    }
}

fn shared(error: CreateTaskError) -> TaskError {
    TaskError::Create(Arc::new(error))
}

/// One Cloud Tasks create per batch.
#[derive(Debug)]
pub struct TaskCreates {
    tasks: Tasks,
    batching: TaskBatching,
}

impl Flush for TaskCreates {
    /// (queue number, bucket number).
    type Lane = (usize, i64);
    type Item = EventTask;
    type Output = TaskResult;

    /// As many as one task takes: `max_events`, and the bytes under the task size limit.
    fn take(&self, waiting: &mut dyn Iterator<Item = &EventTask>) -> usize {
        let mut bytes = BATCH_ENVELOPE;
        let mut take = 0;
        for task in waiting {
            bytes += task.body.len() + 1;
            if take == self.batching.max_events || (take > 0 && bytes > MAX_INLINE_TASK_BODY) {
                break;
            }
            take += 1;
        }
        take
    }

    async fn flush(&self, &(queue, _): &(usize, i64), batch: Vec<EventTask>) -> Vec<TaskResult> {
        if let [one] = batch.as_slice() {
            return vec![self.tasks.create_on(queue, &one.name, one.slot, one.body.clone()).await.map_err(shared)];
        }
        let names: Vec<&str> = batch.iter().map(|t| t.name.as_str()).collect();
        let bodies: Vec<&[u8]> = batch.iter().map(|t| t.body.as_slice()).collect();
        let first = batch.iter().map(|t| t.slot).min().unwrap_or_default();
        let (name, body) = (batch_task_id(&names), TaskBatch::encode(&bodies));
        match self.tasks.create_on(queue, &name, first, body).await {
            Ok(created) => {
                tracing::debug!(task = name, events = batch.len(), "batch task created");
                vec![Ok(created); batch.len()]
            }
            // Refused for what it is (its size, its name): each event alone, so that only an event
            // that cannot have a task is refused one.
            Err(error) if error.is_invalid() => {
                tracing::warn!(task = name, %error, "a batch task was refused: its events get a task each");
                let mut results = Vec::with_capacity(batch.len());
                for EventTask { name, slot, body } in batch {
                    results.push(self.tasks.create_on(queue, &name, slot, body).await.map_err(shared));
                }
                results
            }
            Err(error) => fan_out(batch.len(), Err(shared(error))),
        }
    }
}

/// Creates the limiter's delayed events' tasks, a few creates per (queue, bucket) in flight.
pub struct TaskBatcher {
    tasks: Tasks,
    batching: TaskBatching,
    batcher: Batcher<TaskCreates>,
    /// The requests that may create tasks, where the service counts them ([`Self::for_pushes`]).
    callers: Option<Arc<Callers>>,
}

impl std::fmt::Debug for TaskBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskBatcher").field("batching", &self.batching).finish_non_exhaustive()
    }
}

impl TaskBatcher {
    /// Each create lingers its whole length.
    pub fn new(tasks: Tasks, batching: TaskBatching) -> Arc<Self> {
        Self::build(tasks, batching, None)
    }

    /// Each create lingers only while a request in flight ([`Self::caller`]) may still join it:
    /// with few pushes in flight (a closed loop such as the local Pub/Sub emulator's), a create
    /// goes once they all wait, rather than holding every one of them the whole linger.
    pub fn for_pushes(tasks: Tasks, batching: TaskBatching) -> Arc<Self> {
        Self::build(tasks, batching, Some(Arc::default()))
    }

    fn build(tasks: Tasks, batching: TaskBatching, callers: Option<Arc<Callers>>) -> Arc<Self> {
        let linger = Linger { length: Duration::from_millis(batching.linger.max(0) as u64), callers: callers.clone() };
        let creates = TaskCreates { tasks: tasks.clone(), batching };
        let batcher = Batcher::new(creates, batching.max_events, batching.in_flight, linger);
        Arc::new(Self { tasks, batching, batcher, callers })
    }

    /// Counts a request that may create tasks in until the guard is dropped (a push, from its
    /// start): `None` where creates linger their whole length.
    pub fn caller(&self) -> Option<Caller> {
        self.callers.as_ref().map(Callers::enter)
    }

    pub fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    /// Creates a task that carries `task`'s event (rule id, key) to the dispatcher at its slot:
    /// its own, or a batch shared with the events of the same queue and bucket that wait with it.
    pub async fn create(&self, (rule, key): (&str, &str), task: EventTask) -> TaskResult {
        let lane = (self.tasks.queue_of(rule, key), task.slot.div_euclid(self.batching.bucket));
        // `None` only if the runtime is shutting down: the push is answered 5xx and redelivered.
        self.batcher.submit(lane, task).await.unwrap_or(Err(TaskError::Abandoned))
    }
}
