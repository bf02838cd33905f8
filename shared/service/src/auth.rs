//! Callers (Pub/Sub push, Cloud Tasks) must present a Google-signed OIDC token, when enabled.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use drip_gcp::oidc::{AuthError, OidcVerifier};

/// Who called, as the verified token says (its email); absent when no verifier is configured.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

/// Middleware: with no verifier configured every caller passes (local runs, or an ingress that
/// already authenticates); otherwise 401 for a missing or invalid token, 403 for a caller not allowed.
pub async fn require_oidc(
    State(verifier): State<Option<Arc<OidcVerifier>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(verifier) = verifier else {
        return next.run(request).await;
    };
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match verifier.verify(authorization).await {
        Ok(email) => {
            request.extensions_mut().insert(Caller(email));
            next.run(request).await
        }
        Err(error) => {
            tracing::warn!(%error, path = %request.uri().path(), "rejected a caller");
            let status = match error {
                AuthError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
                AuthError::Forbidden(_) => StatusCode::FORBIDDEN,
            };
            (status, status.canonical_reason().unwrap_or_default()).into_response()
        }
    }
}
