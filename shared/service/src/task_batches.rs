//! Batched delayed delivery: delayed events of one queue whose slots fall in one bucket (default
//! 1 s) travel in one Cloud Task. Group commit again, with no timer: the first event of an idle
//! bucket gets its own task at once (the per-event task, name and body of an unbatched Drip); the
//! events that arrive while that create is in flight share the next one, and so on. Each caller
//! is answered only once the task that carries its event exists, so a push is acked only then.
//!
//! A batch task's name is a hash of its events' own task names, so a retried create of the same
//! batch is ALREADY_EXISTS. An event can still travel in two tasks (a create that timed out and a
//! redelivery regrouped elsewhere): the dispatcher's once-only claim per event publishes it once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use drip_core::overflow::{BATCH_ENVELOPE, MAX_INLINE_TASK_BODY, TaskBatch, batch_task_id};
use drip_core::time::Millis;
use drip_gcp::tasks::{CreateTaskError, Created};
use tokio::sync::oneshot;

use crate::tasks::Tasks;

/// How delayed events are grouped into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskBatching {
    /// The most events one task carries (1: a task per event).
    pub max_events: usize,
    /// The slots of one task's events lie in one bucket of this length.
    pub bucket: Millis,
}

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

struct Waiting {
    task: EventTask,
    reply: oneshot::Sender<TaskResult>,
}

#[derive(Default)]
struct Lane {
    creating: bool,
    waiting: VecDeque<Waiting>,
}

/// Creates the limiter's delayed events' tasks, a batch per (queue, bucket) at a time.
pub struct TaskBatcher {
    tasks: Tasks,
    batching: TaskBatching,
    lanes: Mutex<HashMap<(usize, i64), Lane>>,
}

impl std::fmt::Debug for TaskBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskBatcher").field("batching", &self.batching).finish_non_exhaustive()
    }
}

impl TaskBatcher {
    pub fn new(tasks: Tasks, batching: TaskBatching) -> Arc<Self> {
        Arc::new(Self { tasks, batching, lanes: Mutex::new(HashMap::new()) })
    }

    pub fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    fn lanes(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, i64), Lane>> {
        self.lanes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Creates a task that carries `task`'s event (rule id, key) to the dispatcher at its slot:
    /// its own, or a batch shared with the events of the same queue and bucket that wait with it.
    pub async fn create(self: &Arc<Self>, (rule, key): (&str, &str), task: EventTask) -> TaskResult {
        let queue = self.tasks.queue_of(rule, key);
        if self.batching.max_events <= 1 {
            return self.tasks.create_on(queue, &task.name, task.slot, task.body).await.map_err(shared);
        }
        let lane = (queue, task.slot.div_euclid(self.batching.bucket));
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes();
            let entry = lanes.entry(lane).or_default();
            entry.waiting.push_back(Waiting { task, reply });
            !std::mem::replace(&mut entry.creating, true)
        };
        if start {
            // Its own task: a caller that gives up (a deadline) must not strand the others.
            tokio::spawn(Arc::clone(self).drive(lane));
        }
        match answer.await {
            Ok(result) => result,
            // Only if the runtime is shutting down: the push is answered 5xx and redelivered.
            Err(_) => Err(TaskError::Abandoned),
        }
    }

    /// The next batch of the lane: as many waiting events as fit one task.
    fn next_batch(&self, lane: (usize, i64)) -> Option<Vec<Waiting>> {
        let mut lanes = self.lanes();
        let entry = lanes.get_mut(&lane)?;
        if entry.waiting.is_empty() {
            lanes.remove(&lane);
            return None;
        }
        let mut bytes = BATCH_ENVELOPE;
        let mut take = 0;
        for waiting in &entry.waiting {
            bytes += waiting.task.body.len() + 1;
            if take == self.batching.max_events || (take > 0 && bytes > MAX_INLINE_TASK_BODY) {
                break;
            }
            take += 1;
        }
        Some(entry.waiting.drain(..take).collect())
    }

    async fn drive(self: Arc<Self>, lane: (usize, i64)) {
        while let Some(batch) = self.next_batch(lane) {
            let queue = lane.0;
            if let [one] = batch.as_slice() {
                let result = self.tasks.create_on(queue, &one.task.name, one.task.slot, one.task.body.clone()).await;
                let Some(one) = batch.into_iter().next() else { continue };
                let _ = one.reply.send(result.map_err(shared));
                continue;
            }
            let names: Vec<&str> = batch.iter().map(|w| w.task.name.as_str()).collect();
            let bodies: Vec<&[u8]> = batch.iter().map(|w| w.task.body.as_slice()).collect();
            let first = batch.iter().map(|w| w.task.slot).min().unwrap_or_default();
            let (name, body) = (batch_task_id(&names), TaskBatch::encode(&bodies));
            match self.tasks.create_on(queue, &name, first, body).await {
                Ok(created) => {
                    tracing::debug!(task = name, events = batch.len(), "batch task created");
                    for waiting in batch {
                        let _ = waiting.reply.send(Ok(created));
                    }
                }
                // Refused for what it is (its size, its name): each event alone, so that only an
                // event that cannot have a task is refused one.
                Err(error) if error.is_invalid() => {
                    tracing::warn!(task = name, %error, "a batch task was refused: its events get a task each");
                    for waiting in batch {
                        let EventTask { name, slot, body } = waiting.task;
                        let result = self.tasks.create_on(queue, &name, slot, body).await;
                        let _ = waiting.reply.send(result.map_err(shared));
                    }
                }
                Err(error) => {
                    let error = shared(error);
                    for waiting in batch {
                        let _ = waiting.reply.send(Err(error.clone()));
                    }
                }
            }
        }
    }
}
