//! Dispatches each task when due, as Cloud Tasks does: an HTTP request with the task's body and
//! headers, the `X-CloudTasks-*` headers and an OIDC token; retries follow the queue's backoff.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;

use crate::Shared;
use crate::model::{AttemptRecord, Task, now_millis};

pub(crate) async fn run(shared: Arc<Shared>) {
    // A queue's rate limits: a started dispatch waits for a permit, and starts are spaced.
    let spacing = shared.settings.max_dispatches_per_second.map(|rate| Duration::from_secs(1) / rate.max(1));
    let mut next_start = tokio::time::Instant::now();
    loop {
        let Ok(permit) = shared.in_flight.clone().acquire_owned().await else { return };
        if let Some(spacing) = spacing {
            tokio::time::sleep_until(next_start).await;
            next_start = tokio::time::Instant::now() + spacing;
        }
        let notified = shared.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = shared.lock().take_due(now_millis());
        match next {
            Ok(task) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    attempt(shared, task).await;
                    drop(permit);
                });
            }
            Err(Some(at)) => {
                let wait = Duration::from_millis((at - now_millis()).max(0) as u64);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = notified => {}
                }
            }
            Err(None) => notified.await,
        }
    }
}

fn last_segment(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

async fn attempt(shared: Arc<Shared>, task: Task) {
    let started_at = now_millis();
    let retry_count = task.dispatch_count - 1;
    let method = Method::from_bytes(task.target.method.as_bytes()).unwrap_or(Method::POST);
    let mut request = shared
        .http
        .request(method, &task.target.url)
        .header("X-CloudTasks-QueueName", last_segment(&task.queue))
        .header("X-CloudTasks-TaskName", last_segment(&task.name))
        .header("X-CloudTasks-TaskRetryCount", retry_count.to_string())
        .header("X-CloudTasks-TaskExecutionCount", task.response_count.to_string())
        .header("X-CloudTasks-TaskETA", format!("{:.6}", task.schedule_time as f64 / 1_000.0))
        .body(task.target.body.clone());
    for (name, value) in &task.target.headers {
        request = request.header(name, value);
    }
    if let Some(account) = &task.target.oidc_service_account {
        let audience =
            task.target.oidc_audience.clone().filter(|a| !a.is_empty()).unwrap_or_else(|| task.target.url.clone());
        let token = shared.signer.sign(account, &audience, started_at / 1_000, 3_600);
        request = request.bearer_auth(token);
    }
    let (status, error) = match request.send().await {
        Ok(response) => (Some(response.status().as_u16()), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let record = AttemptRecord {
        task: task.name.clone(),
        queue: task.queue.clone(),
        scheduled_for: task.schedule_time,
        started_at,
        retry_count,
        status,
        error,
    };
    shared.lock().finish_attempt(&task.name, record, now_millis());
    shared.wake.notify_one();
}
