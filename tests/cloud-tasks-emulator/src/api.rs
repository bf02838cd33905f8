//! The REST surface: what `google-cloud-tasks-v2` sends (`$alt=json;enum-encoding=int`, camelCase
//! JSON, RFC 3339 timestamps with nanoseconds, bytes in base64), and Google's error JSON.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine;
use serde_json::{Value, json};

use crate::Shared;
use crate::model::{ApiError, Fault, Faults, HttpTarget, Millis, NewTask, RetryConfig, Task, now_millis};

type Shared_ = State<Arc<Shared>>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v2/projects/{project}/locations/{location}/queues", post(create_queue))
        .route("/v2/projects/{project}/locations/{location}/queues/{queue}", get(get_queue).delete(delete_queue))
        .route("/v2/projects/{project}/locations/{location}/queues/{queue}/tasks", post(create_task))
        .route(
            "/v2/projects/{project}/locations/{location}/queues/{queue}/tasks/{task}",
            get(get_task).delete(delete_task),
        )
        .route("/_emulator/tasks", get(list_tasks))
        .route("/_emulator/attempts", get(list_attempts))
        .route("/_emulator/billing", get(billing))
        .route("/_emulator/faults", put(set_faults))
        .route("/_emulator/jwks.json", get(jwks))
        .with_state(shared)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, "NOT_FOUND", m),
            ApiError::AlreadyExists(m) => (StatusCode::CONFLICT, "ALREADY_EXISTS", m),
            ApiError::InvalidArgument(m) => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", m),
            ApiError::Internal(m) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", m),
        };
        let body = json!({"error": {"code": status.as_u16(), "message": message, "status": code}});
        (status, Json(body)).into_response()
    }
}

fn queue_name(project: &str, location: &str, queue: &str) -> String {
    format!("projects/{project}/locations/{location}/queues/{queue}")
}

/// Enums as integers when the client asks (`$alt=json;enum-encoding=int`), else as names.
fn int_enums(query: &HashMap<String, String>) -> bool {
    query.get("$alt").is_some_and(|alt| alt.contains("enum-encoding=int"))
}

fn timestamp(at: Millis) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at.max(0) as u64);
    humantime::format_rfc3339_nanos(at).to_string()
}

fn parse_timestamp(text: &str) -> Result<Millis, ApiError> {
    let at =
        humantime::parse_rfc3339(text).map_err(|e| ApiError::InvalidArgument(format!("bad timestamp {text}: {e}")))?;
    Ok(at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0))
}

/// `"0.100s"` → 100.
fn parse_duration_ms(text: &str) -> Option<Millis> {
    text.strip_suffix('s')?.parse::<f64>().ok().map(|s| (s * 1_000.0).round() as Millis)
}

const METHODS: [&str; 8] = ["HTTP_METHOD_UNSPECIFIED", "POST", "GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"];

fn parse_method(value: Option<&Value>) -> Result<String, ApiError> {
    let method = match value {
        None => "POST",
        Some(Value::Number(n)) => METHODS.get(n.as_u64().unwrap_or(99) as usize).copied().unwrap_or(""),
        Some(Value::String(s)) => METHODS.iter().find(|m| **m == s).copied().unwrap_or(""),
        Some(_) => "",
    };
    match method {
        "" => Err(ApiError::InvalidArgument(format!("bad httpMethod {value:?}"))),
        "HTTP_METHOD_UNSPECIFIED" => Ok("POST".into()),
        m => Ok(m.into()),
    }
}

fn task_json(task: &Task, int_enums: bool, full: bool) -> Value {
    let method = METHODS.iter().position(|m| *m == task.target.method).unwrap_or(1);
    let mut http = json!({"url": task.target.url, "httpMethod": if int_enums { json!(method) } else { json!(task.target.method) }});
    if full {
        http["headers"] = json!(task.target.headers);
        http["body"] = json!(base64::engine::general_purpose::STANDARD.encode(&task.target.body));
        if let Some(account) = &task.target.oidc_service_account {
            http["oidcToken"] = json!({"serviceAccountEmail": account, "audience": task.target.oidc_audience});
        }
    }
    let view = match (full, int_enums) {
        (true, true) => json!(2),
        (false, true) => json!(1),
        (true, false) => json!("FULL"),
        (false, false) => json!("BASIC"),
    };
    json!({
        "name": task.name,
        "scheduleTime": timestamp(task.schedule_time),
        "createTime": timestamp(task.create_time),
        "dispatchCount": task.dispatch_count,
        "responseCount": task.response_count,
        "view": view,
        "httpRequest": http,
    })
}

fn queue_json(name: &str, retry: &RetryConfig) -> Value {
    let seconds = |ms: Millis| format!("{:.3}s", ms as f64 / 1_000.0);
    json!({
        "name": name,
        "state": "RUNNING",
        "retryConfig": {
            "maxAttempts": retry.max_attempts,
            "minBackoff": seconds(retry.min_backoff_ms),
            "maxBackoff": seconds(retry.max_backoff_ms),
            "maxDoublings": retry.max_doublings,
        },
    })
}

async fn create_queue(
    State(shared): Shared_,
    Path((project, location)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Result<Json<Value>, ApiError> {
    let name = body["name"].as_str().ok_or_else(|| ApiError::InvalidArgument("queue.name is required".into()))?;
    if !name.starts_with(&format!("projects/{project}/locations/{location}/queues/")) {
        return Err(ApiError::InvalidArgument(format!(
            "queue {name} is not under projects/{project}/locations/{location}"
        )));
    }
    let config = &body["retryConfig"];
    let defaults = RetryConfig::default();
    let retry = RetryConfig {
        max_attempts: config["maxAttempts"].as_i64().map_or(defaults.max_attempts, |n| n as i32),
        min_backoff_ms: config["minBackoff"].as_str().and_then(parse_duration_ms).unwrap_or(defaults.min_backoff_ms),
        max_backoff_ms: config["maxBackoff"].as_str().and_then(parse_duration_ms).unwrap_or(defaults.max_backoff_ms),
        max_doublings: config["maxDoublings"].as_u64().map_or(defaults.max_doublings, |n| n as u32),
    };
    shared.lock().create_queue(name, retry)?;
    Ok(Json(queue_json(name, &retry)))
}

async fn get_queue(
    State(shared): Shared_,
    Path((p, l, q)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let name = queue_name(&p, &l, &q);
    let state = shared.lock();
    let queue = state.queues.get(&name).ok_or_else(|| ApiError::NotFound(format!("Queue does not exist: {name}")))?;
    Ok(Json(queue_json(&name, &queue.retry)))
}

async fn delete_queue(
    State(shared): Shared_,
    Path((p, l, q)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let name = queue_name(&p, &l, &q);
    let mut state = shared.lock();
    state.queues.remove(&name).ok_or_else(|| ApiError::NotFound(format!("Queue does not exist: {name}")))?;
    let now = now_millis();
    let tasks: Vec<String> =
        state.tasks.values().filter(|t| t.queue == name && t.finished_at.is_none()).map(|t| t.name.clone()).collect();
    for task in tasks {
        let _ = state.delete_task(&task, now);
    }
    Ok(Json(json!({})))
}

async fn create_task(
    State(shared): Shared_,
    Path((p, l, q)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    if !shared.settings.create_latency.is_zero() {
        tokio::time::sleep(shared.settings.create_latency).await;
    }
    let fault = shared.lock().faults.create_task;
    match fault {
        Fault::None | Fault::AcceptThenHang => {}
        Fault::Error => return Err(ApiError::Internal("injected fault".into())),
        Fault::Hang => std::future::pending::<()>().await,
    }
    let request: Value =
        serde_json::from_slice(&body).map_err(|e| ApiError::InvalidArgument(format!("bad JSON: {e}")))?;
    let queue = queue_name(&p, &l, &q);
    let task = &request["task"];
    let http = &task["httpRequest"];
    let url =
        http["url"].as_str().ok_or_else(|| ApiError::InvalidArgument("task.httpRequest.url is required".into()))?;
    let body = match http["body"].as_str() {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| ApiError::InvalidArgument(format!("httpRequest.body is not base64: {e}")))?,
        None => Vec::new(),
    };
    let headers: BTreeMap<String, String> = serde_json::from_value(http["headers"].clone()).unwrap_or_default();
    let target = HttpTarget {
        url: url.to_owned(),
        method: parse_method(http.get("httpMethod"))?,
        headers,
        body,
        oidc_service_account: http["oidcToken"]["serviceAccountEmail"].as_str().map(str::to_owned),
        oidc_audience: http["oidcToken"]["audience"].as_str().map(str::to_owned),
    };
    let schedule_time = task["scheduleTime"].as_str().map(parse_timestamp).transpose()?;
    let name = task["name"].as_str().filter(|n| !n.is_empty()).map(str::to_owned);
    // The body counts as bytes, as in the task's protobuf, not as the base64 that carries it in JSON.
    let encoded_body = http["body"].as_str().map_or(0, str::len);
    let size = task.to_string().len() - encoded_body + target.body.len();
    let full = matches!(request["responseView"].as_i64(), Some(2)) || request["responseView"] == "FULL";
    let tombstone = shared.settings.tombstone.as_millis() as Millis;
    let new = NewTask { queue, name, schedule_time, target, size };
    let created = shared.lock().create_task(new, tombstone, now_millis())?;
    shared.wake.notify_one();
    if fault == Fault::AcceptThenHang {
        std::future::pending::<()>().await;
    }
    Ok(Json(task_json(&created, int_enums(&query), full)))
}

async fn get_task(
    State(shared): Shared_,
    Path((p, l, q, t)): Path<(String, String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let name = format!("{}/tasks/{t}", queue_name(&p, &l, &q));
    let state = shared.lock();
    match state.tasks.get(&name) {
        Some(task) if task.finished_at.is_none() => Ok(Json(task_json(task, int_enums(&query), false))),
        _ => Err(ApiError::NotFound(format!("Task does not exist: {name}"))),
    }
}

async fn delete_task(
    State(shared): Shared_,
    Path((p, l, q, t)): Path<(String, String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let name = format!("{}/tasks/{t}", queue_name(&p, &l, &q));
    shared.lock().delete_task(&name, now_millis())?;
    Ok(Json(json!({})))
}

async fn list_tasks(State(shared): Shared_) -> Json<Value> {
    Json(json!(shared.lock().snapshots()))
}

async fn billing(State(shared): Shared_) -> Json<Value> {
    Json(json!(shared.lock().billing))
}

async fn list_attempts(State(shared): Shared_) -> Json<Value> {
    Json(json!(shared.lock().attempts))
}

async fn set_faults(State(shared): Shared_, Json(faults): Json<Faults>) -> Json<Value> {
    shared.lock().faults = faults;
    Json(json!(faults))
}

async fn jwks() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], crate::signer::TEST_JWKS).into_response()
}
