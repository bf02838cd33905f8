//! Verifying the Google-signed OIDC tokens that Pub/Sub push and Cloud Tasks send.
//!
//! jsonwebtoken checks each token against Google's published keys (JWKS), which are cached and
//! fetched with a timeout and without holding any lock across the fetch, so a slow key endpoint
//! never stalls requests whose key is cached. (google-cloud-auth's `Verifier` takes a write lock
//! for every verification, cache hits included, and holds it across an untimed fetch.)

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

const GOOGLE_JWKS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";
const GOOGLE_ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];
/// Google rotates its keys over days; an unknown `kid` refetches at once.
const KEYS_TTL: Duration = Duration::from_secs(3600);
const JWKS_TIMEOUT: Duration = Duration::from_secs(5);

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

struct CachedKeys {
    by_kid: HashMap<String, DecodingKey>,
    fetched_at: Instant,
}

pub struct OidcVerifier {
    settings: OidcSettings,
    validation: Validation,
    http: reqwest::Client,
    keys: RwLock<Option<CachedKeys>>,
}

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl OidcVerifier {
    pub fn new(settings: OidcSettings) -> Self {
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_audience(&[settings.audience.as_str()]);
        validation.set_issuer(&GOOGLE_ISSUERS);
        validation.set_required_spec_claims(&["exp", "aud", "iss"]);
        let http = reqwest::Client::builder().timeout(JWKS_TIMEOUT).build().unwrap_or_default();
        Self { settings, validation, http, keys: RwLock::new(None) }
    }

    fn cached(&self, kid: &str) -> Option<DecodingKey> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.as_ref().filter(|k| k.fetched_at.elapsed() < KEYS_TTL).and_then(|k| k.by_kid.get(kid).cloned())
    }

    /// Fetches the key set (no lock held meanwhile; concurrent fetches are harmless) and caches it.
    async fn fetch(&self, kid: &str) -> Result<DecodingKey, AuthError> {
        let url = self.settings.jwks_url.as_deref().unwrap_or(GOOGLE_JWKS_URL);
        let unauthenticated = |what: String| AuthError::Unauthenticated(format!("signing keys from {url}: {what}"));
        let response = self.http.get(url).send().await.map_err(|e| unauthenticated(e.to_string()))?;
        let set: JwkSet = response
            .error_for_status()
            .map_err(|e| unauthenticated(e.to_string()))?
            .json()
            .await
            .map_err(|e| unauthenticated(e.to_string()))?;
        let by_kid: HashMap<String, DecodingKey> = set
            .keys
            .iter()
            .filter_map(|jwk| Some((jwk.common.key_id.clone()?, DecodingKey::from_jwk(jwk).ok()?)))
            .collect();
        let key = by_kid.get(kid).cloned();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Some(CachedKeys { by_kid, fetched_at: Instant::now() });
        key.ok_or_else(|| AuthError::Unauthenticated(format!("no signing key '{kid}'")))
    }

    /// Checks an `Authorization` header value; returns the caller's email.
    pub async fn verify(&self, authorization: Option<&str>) -> Result<String, AuthError> {
        let token = authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or_else(|| AuthError::Unauthenticated("no bearer token".into()))?;
        let header = jsonwebtoken::decode_header(token).map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
        let kid = header.kid.ok_or_else(|| AuthError::Unauthenticated("the token names no key (kid)".into()))?;
        let key = match self.cached(&kid) {
            Some(key) => key,
            None => self.fetch(&kid).await?,
        };
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &self.validation)
            .map_err(|e| AuthError::Unauthenticated(e.to_string()))?
            .claims;
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
