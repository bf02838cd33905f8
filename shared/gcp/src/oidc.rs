//! Verifying the Google-signed OIDC tokens that Pub/Sub push and Cloud Tasks send.
//!
//! jsonwebtoken checks each token against Google's published keys (JWKS), which are cached and
//! fetched with a timeout, so a slow key endpoint never stalls requests whose key is cached.
//! (google-cloud-auth's `Verifier` takes a write lock for every verification, cache hits
//! included, and holds it across an untimed fetch.) A token naming a key not in the cache causes
//! at most one fetch at a time (single-flight), and at most one a minute while the cache is fresh
//! (a negative cache): a storm of tokens with invented `kid`s cannot make the service hammer the
//! key endpoint. Who may call which route is the caller's business (`drip_service::auth`).

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

const GOOGLE_JWKS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";
const GOOGLE_ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];
/// Identity-Aware Proxy signs the `x-goog-iap-jwt-assertion` header with ES256 keys published here
/// (docs.cloud.google.com/iap/docs/signed-headers-howto).
const IAP_JWKS_URL: &str = "https://www.gstatic.com/iap/verify/public_key-jwk";
const IAP_ISSUER: &str = "https://cloud.google.com/iap";
/// The header IAP puts its signed assertion in.
pub const IAP_ASSERTION_HEADER: &str = "x-goog-iap-jwt-assertion";
/// Google rotates its keys over days and publishes a new one well before it signs with it.
const KEYS_TTL: Duration = Duration::from_secs(3600);
/// An unknown `kid` refetches the keys at most this often.
const UNKNOWN_KID_REFETCH: Duration = Duration::from_secs(60);
const JWKS_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct OidcSettings {
    /// The `aud` claim every token must carry (the service URL, or the audience set on the push
    /// subscription or task).
    pub audience: String,
    /// Where the signing keys are; `None` for Google's.
    pub jwks_url: Option<String>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401: no token, or one that does not verify (signature, issuer, audience, expiry).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// 403: a valid token of a caller not allowed on the route.
    #[error("forbidden: {0}")]
    Forbidden(String),
}

struct CachedKeys {
    by_kid: HashMap<String, DecodingKey>,
    fetched_at: Instant,
}

pub struct OidcVerifier {
    settings: OidcSettings,
    /// Whose tokens: Google's ID tokens, or IAP's assertions.
    iap: bool,
    validation: Validation,
    http: reqwest::Client,
    keys: RwLock<Option<CachedKeys>>,
    /// Held across a fetch: one at a time.
    fetching: tokio::sync::Mutex<()>,
    /// Key fetches ended, whether they brought keys or failed (what a waiting request compares).
    fetches: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl OidcVerifier {
    /// Google-signed ID tokens (Pub/Sub push, Cloud Tasks, service accounts) for the audience.
    pub fn new(settings: OidcSettings) -> Self {
        Self::of(settings, false)
    }

    /// Identity-Aware Proxy's signed assertions for the audience (on Cloud Run,
    /// `/projects/<number>/locations/<region>/services/<service>`).
    pub fn iap(settings: OidcSettings) -> Self {
        Self::of(settings, true)
    }

    fn of(settings: OidcSettings, iap: bool) -> Self {
        let mut validation = Validation::new(if iap { Algorithm::ES256 } else { Algorithm::RS256 });
        validation.set_audience(&[settings.audience.as_str()]);
        if iap {
            validation.set_issuer(&[IAP_ISSUER]);
        } else {
            validation.set_issuer(&GOOGLE_ISSUERS);
        }
        validation.set_required_spec_claims(&["exp", "aud", "iss"]);
        let http = reqwest::Client::builder().timeout(JWKS_TIMEOUT).build().unwrap_or_default();
        Self {
            settings,
            iap,
            validation,
            http,
            keys: RwLock::new(None),
            fetching: tokio::sync::Mutex::new(()),
            fetches: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many times the key set was fetched (or a fetch failed).
    pub fn fetches(&self) -> u64 {
        self.fetches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The key from a fresh cache; `Err` when the cache is fresh, lacks it and was fetched less than
    /// a minute ago (the negative cache); `Ok(None)` when a fetch may help.
    fn cached(&self, kid: &str) -> Result<Option<DecodingKey>, AuthError> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let Some(keys) = keys.as_ref().filter(|k| k.fetched_at.elapsed() < KEYS_TTL) else { return Ok(None) };
        match keys.by_kid.get(kid) {
            Some(key) => Ok(Some(key.clone())),
            None if keys.fetched_at.elapsed() < UNKNOWN_KID_REFETCH => {
                Err(AuthError::Unauthenticated(format!("no signing key '{kid}'")))
            }
            None => Ok(None),
        }
    }

    /// The key for `kid`: from the cache, or from one fetch at a time (a request that waited for
    /// another's fetch reads its result instead of fetching again).
    async fn key(&self, kid: &str) -> Result<DecodingKey, AuthError> {
        if let Some(key) = self.cached(kid)? {
            return Ok(key);
        }
        let fetches_before = self.fetches();
        let _one_at_a_time = self.fetching.lock().await;
        if let Some(key) = self.cached(kid)? {
            return Ok(key);
        }
        // A fetch ended while this request waited and did not bring the key (the endpoint failed):
        // the requests that waited for it share its failure instead of each trying again in turn.
        if self.fetches() != fetches_before {
            return Err(AuthError::Unauthenticated(format!("no signing key '{kid}': the key fetch just made failed")));
        }
        let fetched = self.fetch(kid).await;
        self.fetches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        fetched
    }

    /// Fetches the key set and caches it.
    async fn fetch(&self, kid: &str) -> Result<DecodingKey, AuthError> {
        let google = if self.iap { IAP_JWKS_URL } else { GOOGLE_JWKS_URL };
        let url = self.settings.jwks_url.as_deref().unwrap_or(google);
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

    /// Checks an `Authorization` header value; returns the caller's verified email.
    pub async fn verify(&self, authorization: Option<&str>) -> Result<String, AuthError> {
        let token = authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or_else(|| AuthError::Unauthenticated("no bearer token".into()))?;
        self.verify_token(token).await
    }

    /// Checks a token (an IAP assertion as its header carries it); returns the verified email.
    pub async fn verify_token(&self, token: &str) -> Result<String, AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
        let kid = header.kid.ok_or_else(|| AuthError::Unauthenticated("the token names no key (kid)".into()))?;
        let key = self.key(&kid).await?;
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &self.validation)
            .map_err(|e| AuthError::Unauthenticated(e.to_string()))?
            .claims;
        let email = claims.get("email").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        // IAP asserts the identity it checked itself; its tokens carry no `email_verified`.
        let verified = self.iap || claims.get("email_verified").and_then(|v| v.as_bool()).unwrap_or(false);
        if email.is_empty() || !verified {
            return Err(AuthError::Forbidden(format!("the token carries no verified email ('{email}')")));
        }
        Ok(email)
    }
}
