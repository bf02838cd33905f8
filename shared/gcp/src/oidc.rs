//! Verifying the Google-signed OIDC tokens that Pub/Sub push and Cloud Tasks send.

use google_cloud_auth::credentials::idtoken::verifier::{Builder, Verifier};
use tokio::sync::Mutex;

#[derive(Debug, Clone)]
pub struct OidcSettings {
    /// The `aud` claim every token must carry (the service URL, or the audience set on the push
    /// subscription or task).
    pub audience: String,
    /// Service accounts allowed to call; empty allows any verified Google-signed token.
    pub allowed_emails: Vec<String>,
    /// Where the signing keys are; `None` for Google's.
    pub jwks_url: Option<String>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401: no token, or one that does not verify (signature, issuer, audience, expiry).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// 403: a valid token of a caller not allowed here.
    #[error("forbidden: {0}")]
    Forbidden(String),
}

#[derive(Debug)]
pub struct OidcVerifier {
    settings: OidcSettings,
    // google-cloud-auth's key cache takes its lock with `try_write` and fails a verification that
    // finds it taken, so concurrent requests would get spurious 401s: verify one at a time.
    verifier: Mutex<Verifier>,
}

impl OidcVerifier {
    pub fn new(settings: OidcSettings) -> Self {
        let mut builder = Builder::new([settings.audience.clone()]);
        if let Some(url) = &settings.jwks_url {
            builder = builder.with_jwks_url(url);
        }
        Self { verifier: Mutex::new(builder.build()), settings }
    }

    /// Checks an `Authorization` header value; returns the caller's email.
    pub async fn verify(&self, authorization: Option<&str>) -> Result<String, AuthError> {
        let token = authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or_else(|| AuthError::Unauthenticated("no bearer token".into()))?;
        let claims =
            self.verifier.lock().await.verify(token).await.map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
        let email = claims.get("email").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let verified = claims.get("email_verified").and_then(|v| v.as_bool()).unwrap_or(false);
        if self.settings.allowed_emails.is_empty() {
            return Ok(email);
        }
        if !verified || !self.settings.allowed_emails.contains(&email) {
            return Err(AuthError::Forbidden(format!("caller '{email}' is not allowed")));
        }
        Ok(email)
    }
}
