//! Queues, tasks, dedup tombstones, the dispatch schedule and the record of attempts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub type Millis = i64;

/// Cloud Tasks holds a task at most 30 days ahead.
pub const MAX_SCHEDULE_AHEAD: Millis = 30 * 24 * 3_600 * 1_000;
/// The largest task Drip may create (Cloud Tasks' limit for HTTP target tasks).
/// Cloud Tasks' limit on a task (HTTP targets: 1 MB; the 100 KB sometimes quoted is App Engine's).
pub const MAX_TASK_BYTES: usize = 1_000_000;

pub fn now_millis() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryConfig {
    /// -1: unlimited.
    pub max_attempts: i32,
    pub min_backoff_ms: Millis,
    pub max_backoff_ms: Millis,
    pub max_doublings: u32,
}

impl Default for RetryConfig {
    /// Cloud Tasks' defaults: 100 attempts, 0.1 s to 1 h, 16 doublings.
    fn default() -> Self {
        Self { max_attempts: 100, min_backoff_ms: 100, max_backoff_ms: 3_600_000, max_doublings: 16 }
    }
}

impl RetryConfig {
    /// The wait before retry number `retry` (1 for the first retry).
    pub fn backoff(&self, retry: u32) -> Millis {
        let doublings = (retry.saturating_sub(1)).min(self.max_doublings).min(40);
        (self.min_backoff_ms.saturating_mul(1 << doublings)).min(self.max_backoff_ms)
    }
}

#[derive(Debug, Clone)]
pub struct Queue {
    pub retry: RetryConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Deleted,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpTarget {
    pub url: String,
    pub method: String,
    pub headers: BTreeMap<String, String>,
    #[serde(skip)]
    pub body: Vec<u8>,
    pub oidc_service_account: Option<String>,
    pub oidc_audience: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    pub queue: String,
    pub schedule_time: Millis,
    pub create_time: Millis,
    pub target: HttpTarget,
    pub dispatch_count: u32,
    pub response_count: u32,
    pub state: TaskState,
    pub finished_at: Option<Millis>,
}

/// What tests read back: a task as the stand-in holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskSnapshot {
    pub name: String,
    pub queue: String,
    pub schedule_time: Millis,
    pub create_time: Millis,
    pub url: String,
    pub headers: BTreeMap<String, String>,
    pub body: String,
    pub oidc_service_account: Option<String>,
    pub dispatch_count: u32,
    pub response_count: u32,
    pub state: String,
}

/// One dispatch of a task, as the stand-in made it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    pub task: String,
    pub queue: String,
    pub scheduled_for: Millis,
    pub started_at: Millis,
    pub retry_count: u32,
    /// The HTTP status, or `None` when the target could not be reached or timed out.
    pub status: Option<u16>,
    pub error: Option<String>,
}

/// Faults tests can inject into `CreateTask`, for failures a real service cannot be made to produce here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    #[default]
    None,
    /// Answer 500 INTERNAL.
    Error,
    /// Never answer.
    Hang,
    /// Create the task, then never answer: a create that times out after it took effect.
    AcceptThenHang,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Faults {
    #[serde(default)]
    pub create_task: Fault,
}

/// A `CreateTask` request; `name` is `None` to have one generated.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub queue: String,
    pub name: Option<String>,
    pub schedule_time: Option<Millis>,
    pub target: HttpTarget,
    /// The task's size as sent, for the size limit.
    pub size: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ApiError {
    NotFound(String),
    AlreadyExists(String),
    InvalidArgument(String),
    Internal(String),
}

#[derive(Debug, Default)]
pub struct State {
    pub queues: HashMap<String, Queue>,
    pub tasks: HashMap<String, Task>,
    /// (due time, sequence, task name) of every task waiting to be dispatched.
    pub due: BTreeSet<(Millis, u64, String)>,
    pub attempts: Vec<AttemptRecord>,
    pub faults: Faults,
    pub billing: Billing,
    sequence: u64,
}

/// What Cloud Tasks would bill for the creates so far: a call is at least one operation, and a
/// task counts one per started 32 KB (its dispatch attempts cost as much again each).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Billing {
    pub creates: u64,
    pub create_operations: u64,
    /// Dispatch attempts, and what they are billed (by the task's body).
    pub dispatches: u64,
    pub dispatch_operations: u64,
}

/// Cloud Tasks' billing chunk.
pub const BILLING_CHUNK: usize = 32 * 1024;

pub fn valid_queue_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('/').collect();
    matches!(parts.as_slice(), ["projects", p, "locations", l, "queues", q] if [p, l, q].iter().all(|s| !s.is_empty()))
        && parts[5].chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

fn valid_task_id(id: &str) -> bool {
    (1..=500).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl State {
    pub fn create_queue(&mut self, name: &str, retry: RetryConfig) -> Result<(), ApiError> {
        if !valid_queue_name(name) {
            return Err(ApiError::InvalidArgument(format!("invalid queue name {name}")));
        }
        if self.queues.contains_key(name) {
            return Err(ApiError::AlreadyExists(format!("queue {name} already exists")));
        }
        self.queues.insert(name.to_owned(), Queue { retry });
        Ok(())
    }

    fn next_sequence(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence
    }

    /// Adds a task, as `CreateTask` does.
    pub fn create_task(&mut self, new: NewTask, tombstone: Millis, now: Millis) -> Result<Task, ApiError> {
        let NewTask { queue, name, schedule_time, target, size } = new;
        self.billing.creates += 1;
        self.billing.create_operations += size.div_ceil(BILLING_CHUNK).max(1) as u64;
        let queue = queue.as_str();
        if !self.queues.contains_key(queue) {
            return Err(ApiError::NotFound(format!("Queue does not exist: {queue}")));
        }
        let name = match name {
            Some(name) => {
                let id = name.strip_prefix(queue).and_then(|rest| rest.strip_prefix("/tasks/"));
                match id {
                    Some(id) if valid_task_id(id) => name,
                    _ => {
                        return Err(ApiError::InvalidArgument(format!(
                            "Task name must be {queue}/tasks/TASK_ID with TASK_ID of 1-500 [A-Za-z0-9_-]: {name}"
                        )));
                    }
                }
            }
            None => format!("{queue}/tasks/{}", self.next_sequence() * 7_919 + 1_000_000),
        };
        if size > MAX_TASK_BYTES {
            return Err(ApiError::InvalidArgument(format!(
                "Task size too large: {size} bytes, the limit is {MAX_TASK_BYTES}"
            )));
        }
        // A past (or absent) scheduleTime means: dispatch now.
        let schedule_time = schedule_time.unwrap_or(now);
        if schedule_time > now + MAX_SCHEDULE_AHEAD {
            return Err(ApiError::InvalidArgument(
                "The scheduleTime must not be more than 30 days in the future".into(),
            ));
        }
        if let Some(existing) = self.tasks.get(&name) {
            let expired = existing.finished_at.is_some_and(|finished| now >= finished + tombstone);
            if !expired {
                return Err(ApiError::AlreadyExists(format!("Requested entity already exists: {name}")));
            }
        }
        let task = Task {
            name: name.clone(),
            queue: queue.to_owned(),
            schedule_time,
            create_time: now,
            target,
            dispatch_count: 0,
            response_count: 0,
            state: TaskState::Pending,
            finished_at: None,
        };
        let sequence = self.next_sequence();
        self.due.insert((schedule_time, sequence, name.clone()));
        self.tasks.insert(name, task.clone());
        Ok(task)
    }

    pub fn delete_task(&mut self, name: &str, now: Millis) -> Result<(), ApiError> {
        match self.tasks.get_mut(name) {
            Some(task) if task.finished_at.is_none() => {
                task.state = TaskState::Deleted;
                task.finished_at = Some(now);
                self.due.retain(|(_, _, n)| n != name);
                Ok(())
            }
            _ => Err(ApiError::NotFound(format!("Task does not exist: {name}"))),
        }
    }

    /// The earliest due task, removed from the schedule and marked running, if due by `now`.
    pub fn take_due(&mut self, now: Millis) -> Result<Task, Option<Millis>> {
        let Some((at, _, _)) = self.due.first().cloned() else { return Err(None) };
        if at > now {
            return Err(Some(at));
        }
        let (_, _, name) = self.due.pop_first().expect("checked above");
        let task = self.tasks.get_mut(&name).expect("scheduled tasks exist");
        task.state = TaskState::Running;
        task.dispatch_count += 1;
        self.billing.dispatches += 1;
        self.billing.dispatch_operations += task.target.body.len().div_ceil(BILLING_CHUNK).max(1) as u64;
        Ok(task.clone())
    }

    /// Records an attempt's outcome: done on 2xx, else retried with the queue's backoff or failed.
    pub fn finish_attempt(&mut self, name: &str, attempt: AttemptRecord, now: Millis) {
        let succeeded = attempt.status.is_some_and(|s| (200..300).contains(&s));
        self.attempts.push(attempt);
        let Some(task) = self.tasks.get_mut(name) else { return };
        if task.state != TaskState::Running {
            return;
        }
        if attempt_got_response(self.attempts.last()) {
            task.response_count += 1;
        }
        let retry = self.queues.get(&task.queue).map(|q| q.retry).unwrap_or_default();
        if succeeded {
            task.state = TaskState::Succeeded;
            task.finished_at = Some(now);
        } else if retry.max_attempts >= 0 && task.dispatch_count >= retry.max_attempts as u32 {
            task.state = TaskState::Failed;
            task.finished_at = Some(now);
        } else {
            task.state = TaskState::Pending;
            let at = now + retry.backoff(task.dispatch_count);
            task.schedule_time = at;
            let sequence = self.next_sequence();
            self.due.insert((at, sequence, name.to_owned()));
        }
    }

    pub fn snapshots(&self) -> Vec<TaskSnapshot> {
        use base64::Engine;
        let mut tasks: Vec<TaskSnapshot> = self
            .tasks
            .values()
            .map(|t| TaskSnapshot {
                name: t.name.clone(),
                queue: t.queue.clone(),
                schedule_time: t.schedule_time,
                create_time: t.create_time,
                url: t.target.url.clone(),
                headers: t.target.headers.clone(),
                body: base64::engine::general_purpose::STANDARD.encode(&t.target.body),
                oidc_service_account: t.target.oidc_service_account.clone(),
                dispatch_count: t.dispatch_count,
                response_count: t.response_count,
                state: serde_json::to_value(t.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
            })
            .collect();
        tasks.sort_by(|a, b| (a.create_time, &a.name).cmp(&(b.create_time, &b.name)));
        tasks
    }
}

fn attempt_got_response(attempt: Option<&AttemptRecord>) -> bool {
    attempt.is_some_and(|a| a.status.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUE: &str = "projects/p/locations/l/queues/q";

    fn target() -> HttpTarget {
        HttpTarget {
            url: "http://127.0.0.1:1/x".into(),
            method: "POST".into(),
            headers: BTreeMap::new(),
            body: vec![],
            oidc_service_account: None,
            oidc_audience: None,
        }
    }

    fn new(queue: &str, name: Option<String>, schedule_time: Option<Millis>, size: usize) -> NewTask {
        NewTask { queue: queue.to_owned(), name, schedule_time, target: target(), size }
    }

    fn state() -> State {
        let mut state = State::default();
        state
            .create_queue(
                QUEUE,
                RetryConfig { max_attempts: 3, min_backoff_ms: 100, max_backoff_ms: 250, max_doublings: 4 },
            )
            .unwrap();
        state
    }

    fn attempt(status: Option<u16>) -> AttemptRecord {
        AttemptRecord {
            task: String::new(),
            queue: QUEUE.into(),
            scheduled_for: 0,
            started_at: 0,
            retry_count: 0,
            status,
            error: None,
        }
    }

    #[test]
    fn each_create_is_billed_one_operation_per_started_32_kb() {
        let mut s = state();
        for size in [10, BILLING_CHUNK, BILLING_CHUNK + 1, 70 * 1024] {
            s.create_task(new(QUEUE, None, Some(1_000), size), 500, 0).unwrap();
        }
        assert_eq!(s.billing, Billing { creates: 4, create_operations: 1 + 1 + 2 + 3, ..Billing::default() });
    }

    #[test]
    fn names_are_deduplicated_until_the_tombstone_expires() {
        let mut s = state();
        let name = Some(format!("{QUEUE}/tasks/a"));
        s.create_task(new(QUEUE, name.clone(), Some(1_000), 10), 500, 0).unwrap();
        assert!(matches!(
            s.create_task(new(QUEUE, name.clone(), Some(1_000), 10), 500, 0),
            Err(ApiError::AlreadyExists(_))
        ));
        let task = s.take_due(1_000).unwrap();
        s.finish_attempt(&task.name, attempt(Some(200)), 1_000);
        assert!(matches!(
            s.create_task(new(QUEUE, name.clone(), None, 10), 500, 1_499),
            Err(ApiError::AlreadyExists(_))
        ));
        assert!(s.create_task(new(QUEUE, name, None, 10), 500, 1_500).is_ok());
    }

    #[test]
    fn rejects_bad_names_sizes_horizons_and_unknown_queues() {
        let mut s = state();
        let bad = |r: Result<Task, ApiError>| matches!(r, Err(ApiError::InvalidArgument(_)));
        for name in [
            format!("{QUEUE}/tasks/a.b"),
            "projects/p/locations/l/queues/other/tasks/a".to_owned(),
            format!("{QUEUE}/tasks/{}", "a".repeat(501)),
        ] {
            assert!(bad(s.create_task(new(QUEUE, Some(name), None, 10), 0, 0)));
        }
        assert!(bad(s.create_task(new(QUEUE, None, None, MAX_TASK_BYTES + 1), 0, 0)));
        assert!(bad(s.create_task(new(QUEUE, None, Some(MAX_SCHEDULE_AHEAD + 1), 10), 0, 0)));
        assert!(s.create_task(new(QUEUE, None, Some(MAX_SCHEDULE_AHEAD), MAX_TASK_BYTES), 0, 0).is_ok());
        let missing = s.create_task(new("projects/p/locations/l/queues/nope", None, None, 10), 0, 0);
        assert!(matches!(missing, Err(ApiError::NotFound(_))));
    }

    #[test]
    fn failures_retry_with_backoff_until_max_attempts() {
        let mut s = state();
        s.create_task(new(QUEUE, None, Some(0), 10), 0, 0).unwrap();
        let task = s.take_due(0).unwrap();
        s.finish_attempt(&task.name, attempt(Some(500)), 10);
        assert_eq!(s.take_due(109).unwrap_err(), Some(110), "first retry after min backoff");
        let task = s.take_due(110).unwrap();
        s.finish_attempt(&task.name, attempt(None), 110);
        assert_eq!(s.take_due(0).unwrap_err(), Some(310), "then doubled");
        let task = s.take_due(310).unwrap();
        s.finish_attempt(&task.name, attempt(Some(503)), 310);
        assert_eq!(s.take_due(10_000).unwrap_err(), None, "three attempts, then failed");
        assert_eq!(s.tasks[&task.name].state, TaskState::Failed);
        assert_eq!(s.tasks[&task.name].response_count, 2);
        assert_eq!(
            RetryConfig { max_attempts: -1, min_backoff_ms: 100, max_backoff_ms: 250, max_doublings: 4 }.backoff(5),
            250
        );
    }
}
