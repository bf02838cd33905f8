//! Who may call what. With OIDC on (the default), every route class has its own callers: a
//! Google-signed token whose verified email is on that class's list, and no other. A push
//! subscription cannot change limits, an operator cannot push events, a consumer reporting
//! feedback can do only that. The services refuse to start with OIDC on and no audience, or with
//! no caller for their main route; `DRIP_AUTH=off` (local runs, tests, an ingress that
//! authenticates) is the only way to turn it off, and it must be said.

use std::sync::Arc;

use anyhow::bail;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use drip_gcp::oidc::{AuthError, OidcVerifier};

/// Who called, as the verified token says (its email); absent when authentication is off.
#[derive(Debug, Clone)]
pub struct Caller(pub String);

/// A comma-separated list of service-account emails, as the settings give it.
pub fn emails(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect()
}

/// How a service authenticates its callers: one verifier (one key cache) for every route class.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `DRIP_AUTH=off`: every caller passes.
    Off,
    Oidc(Arc<OidcVerifier>),
}

impl Auth {
    /// From `DRIP_AUTH` (`oidc` or `off`) and the verifier the OIDC settings make (`None` when
    /// they are missing, which `oidc` refuses).
    pub fn from_settings(mode: &str, verifier: Option<Arc<OidcVerifier>>) -> anyhow::Result<Self> {
        match (mode.trim(), verifier) {
            ("off", _) => Ok(Self::Off),
            ("oidc" | "", Some(verifier)) => Ok(Self::Oidc(verifier)),
            ("oidc" | "", None) => bail!(
                "DRIP_OIDC_AUDIENCE is not set: callers cannot be authenticated (set it to the service's URL, or DRIP_AUTH=off to accept every caller)"
            ),
            (other, _) => bail!("DRIP_AUTH must be oidc or off, got '{other}'"),
        }
    }

    /// The check of one route class, whose callers are `setting`'s `list`. With OIDC on, a main
    /// route (`required`) with no caller stops start-up rather than accept any Google token.
    pub fn route(&self, setting: &'static str, list: &str, required: bool) -> anyhow::Result<RouteAuth> {
        let callers = emails(list);
        if required && callers.is_empty() && matches!(self, Self::Oidc(_)) {
            bail!("{setting} names no caller: with OIDC on, no token could be accepted (list the service accounts)");
        }
        Ok(RouteAuth { auth: self.clone(), setting, callers: Arc::new(callers) })
    }
}

/// The check of one route class: the service's verifier and the callers allowed on it.
#[derive(Debug, Clone)]
pub struct RouteAuth {
    auth: Auth,
    setting: &'static str,
    callers: Arc<Vec<String>>,
}

impl RouteAuth {
    /// Every caller passes (tests of handlers in process).
    pub fn off() -> Self {
        Self { auth: Auth::Off, setting: "-", callers: Arc::new(Vec::new()) }
    }

    /// How many times the route's verifier fetched its signing keys (0 with authentication off).
    pub fn key_fetches(&self) -> u64 {
        match &self.auth {
            Auth::Off => 0,
            Auth::Oidc(verifier) => verifier.fetches(),
        }
    }

    async fn check(&self, authorization: Option<&str>) -> Result<Option<String>, AuthError> {
        let Auth::Oidc(verifier) = &self.auth else { return Ok(None) };
        let email = verifier.verify(authorization).await?;
        if !self.callers.contains(&email) {
            return Err(AuthError::Forbidden(format!("caller '{email}' is not in {}", self.setting)));
        }
        Ok(Some(email))
    }

    /// `router`'s routes behind this check.
    pub fn protect<S: Clone + Send + Sync + 'static>(&self, router: axum::Router<S>) -> axum::Router<S> {
        router.route_layer(axum::middleware::from_fn_with_state(self.clone(), require))
    }
}

/// Middleware: 401 for a missing or invalid token, 403 for a caller not on the route's list.
async fn require(State(route): State<RouteAuth>, mut request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match route.check(authorization).await {
        Ok(Some(email)) => {
            request.extensions_mut().insert(Caller(email));
            next.run(request).await
        }
        Ok(None) => next.run(request).await,
        Err(error) => {
            tracing::warn!(%error, path = %request.uri().path(), "rejected a caller");
            let status = match error {
                AuthError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
                AuthError::Forbidden(_) => StatusCode::FORBIDDEN,
            };
            // The reason stays in the log: a caller learns only which of the two it was.
            crate::api_error::api_error(status, status.canonical_reason().unwrap_or_default())
        }
    }
}
