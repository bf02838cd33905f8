//! One shape for every error a route answers, the JSON Google's APIs answer with (`google.rpc.Status`
//! as JSON): `{"error": {"code": 404, "status": "NOT_FOUND", "message": "no such rule"}}`. Handlers
//! answer [`api_error`]; a body or query the framework cannot read ([`ApiJson`], [`ApiQuery`]), a
//! route that does not exist and an authentication refusal answer it too, so a client (the CLI)
//! reads every refusal the same way and shows its message.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

/// The error answer: `status`, and the message a person reads (`drip_core::api_error`).
pub fn api_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(drip_core::api_error::body(status.as_u16(), &message.into()))).into_response()
}

/// `axum::Json` whose refusal (an unknown field, a missing one, not JSON) is an [`api_error`]
/// naming what was wrong.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_refused(rejection)),
        }
    }
}

fn json_refused(rejection: JsonRejection) -> Response {
    api_error(rejection.status(), rejection.body_text())
}

/// `axum::extract::Query` whose refusal is an [`api_error`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(query_refused(rejection)),
        }
    }
}

fn query_refused(rejection: QueryRejection) -> Response {
    api_error(rejection.status(), rejection.body_text())
}

/// What a route that does not exist answers.
pub async fn no_such_route(request: Request) -> Response {
    api_error(StatusCode::NOT_FOUND, format!("no route {} {}", request.method(), request.uri().path()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_error_answer_has_the_shape_and_status() {
        let response = api_error(StatusCode::NOT_FOUND, "no such rule");
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body, drip_core::api_error::body(404, "no such rule"));
    }
}
