//! Creating the Cloud Task that carries a delayed event to the dispatcher at its slot.

use std::collections::HashMap;
use std::time::Duration;

use drip_core::time::Millis;
use google_cloud_gax::error::rpc::Code;
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_tasks_v2::client::CloudTasks;
use google_cloud_tasks_v2::model::{HttpMethod, HttpRequest, OidcToken, Task};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    New,
    /// A task of this name exists or existed recently: an earlier attempt created it.
    AlreadyExisted,
}

#[derive(Debug, thiserror::Error)]
#[error("creating task {name}: {source}")]
pub struct CreateTaskError {
    pub name: String,
    #[source]
    pub source: google_cloud_tasks_v2::Error,
}

impl CreateTaskError {
    /// Cloud Tasks refused the task itself (a bad name, size or schedule): no retry can help.
    pub fn is_invalid(&self) -> bool {
        self.source.status().is_some_and(|s| s.code == Code::InvalidArgument)
    }
}

#[derive(Debug, Clone)]
pub struct TaskTarget {
    /// The dispatcher's `/dispatch` URL.
    pub url: String,
    /// Tasks carry an OIDC token for this service account, when set.
    pub service_account: Option<String>,
    pub audience: String,
}

/// Creating one named task: [`TaskCreator`] in production, a recording double in the handlers'
/// in-process tests.
pub trait CreateTask: Send + Sync + std::fmt::Debug {
    fn create<'a>(
        &'a self,
        queue: &'a str,
        task_id: &'a str,
        schedule_time: Millis,
        body: Vec<u8>,
        headers: HashMap<String, String>,
    ) -> crate::GcpFuture<'a, Created, CreateTaskError>;
}

impl CreateTask for TaskCreator {
    fn create<'a>(
        &'a self,
        queue: &'a str,
        task_id: &'a str,
        schedule_time: Millis,
        body: Vec<u8>,
        headers: HashMap<String, String>,
    ) -> crate::GcpFuture<'a, Created, CreateTaskError> {
        Box::pin(TaskCreator::create(self, queue, task_id, schedule_time, body, headers))
    }
}

#[derive(Debug, Clone)]
pub struct TaskCreator {
    client: CloudTasks,
    target: TaskTarget,
    timeout: Duration,
}

impl TaskCreator {
    /// `endpoint`: the stand-in's URL; `None` for the real service.
    pub async fn connect(
        endpoint: Option<&str>,
        target: TaskTarget,
        timeout: Duration,
    ) -> Result<Self, google_cloud_gax::client_builder::Error> {
        let mut builder = CloudTasks::builder();
        if let Some(endpoint) = endpoint {
            builder = builder.with_endpoint(crate::endpoint_url(endpoint));
        }
        if let Some(credentials) = crate::emulator_credentials(endpoint) {
            builder = builder.with_credentials(credentials);
        }
        Ok(Self { client: builder.build().await?, target, timeout })
    }

    /// Creates `queue/tasks/task_id` to POST `body` at `schedule_time`. The client does not retry
    /// CreateTask by itself, and neither does this: the caller answers 5xx and Pub/Sub redelivers.
    pub async fn create(
        &self,
        queue: &str,
        task_id: &str,
        schedule_time: Millis,
        body: Vec<u8>,
        headers: HashMap<String, String>,
    ) -> Result<Created, CreateTaskError> {
        let name = format!("{queue}/tasks/{task_id}");
        let mut request = HttpRequest::new()
            .set_url(&self.target.url)
            .set_http_method(HttpMethod::Post)
            .set_headers(headers)
            .set_body(body);
        if let Some(account) = &self.target.service_account {
            request = request.set_oidc_token(
                OidcToken::new().set_service_account_email(account).set_audience(&self.target.audience),
            );
        }
        let schedule = google_cloud_wkt::Timestamp::clamp(
            schedule_time.div_euclid(1_000),
            (schedule_time.rem_euclid(1_000) * 1_000_000) as i32,
        );
        let task = Task::new().set_name(&name).set_schedule_time(schedule).set_http_request(request);
        let result = self
            .client
            .create_task()
            .set_parent(queue)
            .set_task(task)
            .with_attempt_timeout(self.timeout)
            .with_retry_policy(NeverRetry)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Created::New),
            Err(e) if e.status().is_some_and(|s| s.code == Code::AlreadyExists) => Ok(Created::AlreadyExisted),
            Err(source) => Err(CreateTaskError { name, source }),
        }
    }
}
