//! The CLI's second transport: a deployed limiter's own API (`/v1/rules/...`, `/v1/feedback`),
//! so an operator on a laptop needs no route into Memorystore. Requests carry a Google ID token
//! for the limiter's audience: the one given (`--api-token`, e.g. `gcloud auth
//! print-identity-token`), or one from Application Default Credentials.

use anyhow::{Context, bail};
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;

/// Where the limiter's API is and how to prove who is calling.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The admin service's URL (`terraform output admin_url`, e.g. `https://drip-admin-123.europe-west1.run.app`;
    /// or a limiter serving the admin routes): go through its API instead of Redis (then neither
    /// --redis nor --rules is needed).
    #[arg(long, env = "DRIP_API")]
    pub api: Option<String>,
    /// A Google ID token for the service's audience, of an account on its DRIP_ADMIN_CALLERS (or
    /// DRIP_FEEDBACK_CALLERS), e.g. `$(gcloud auth print-identity-token
    /// --impersonate-service-account=OPERATOR_SA --audiences=ADMIN_URL --include-email)`.
    /// Without it, Application Default Credentials make one: a service account key's, an
    /// impersonated account's or the metadata server's (a plain user login cannot).
    #[arg(long, env = "DRIP_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The token's audience, the limiter's DRIP_OIDC_AUDIENCE (default: the --api URL).
    #[arg(long, env = "DRIP_API_AUDIENCE")]
    pub api_audience: Option<String>,
}

/// A client of one limiter's API.
#[derive(Debug)]
pub struct Api {
    base: Url,
    token: Option<String>,
    http: reqwest::Client,
}

impl Api {
    pub async fn connect(args: &ApiArgs, url: &str) -> anyhow::Result<Self> {
        let base = Url::parse(url).with_context(|| format!("--api {url}: not a URL"))?;
        if !matches!(base.scheme(), "http" | "https") {
            bail!("--api {url}: give an http(s) URL");
        }
        let token = match &args.api_token {
            Some(token) => Some(token.trim().to_owned()),
            None => adc_token(args.api_audience.as_deref().unwrap_or(url.trim_end_matches('/')), &base).await?,
        };
        let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30)).build()?;
        Ok(Self { base, token, http })
    }

    /// `GET` of the path made of `segments` (each percent-encoded: keys may hold `/`).
    pub async fn get<T: DeserializeOwned>(&self, segments: &[&str], query: &[(&str, String)]) -> anyhow::Result<T> {
        self.call(Method::GET, segments, query, None).await
    }

    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<T> {
        let mut url = self.base.clone();
        url.path_segments_mut().map_err(|()| anyhow::anyhow!("--api {}: not a base URL", self.base))?.extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut request = self.http.request(method.clone(), url.clone());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let text = response.text().await.with_context(|| format!("{method} {url}: reading the answer"))?;
        if !status.is_success() {
            let hint = match status.as_u16() {
                401 => " (no valid token: see --api-token)",
                403 => {
                    " (the token's account is not on the limiter's list for this route: DRIP_ADMIN_CALLERS or DRIP_FEEDBACK_CALLERS)"
                }
                _ => "",
            };
            bail!("{method} {url}: {status}{hint}: {}", drip_core::api_error::message_of(&text));
        }
        // A 204 (feedback that changed nothing) has no body: JSON null.
        let text = if text.trim().is_empty() { "null" } else { &text };
        serde_json::from_str(text).with_context(|| format!("{method} {url}: the answer is not what the CLI expects"))
    }
}

/// An ID token from Application Default Credentials, or none for a limiter on this machine
/// (`DRIP_AUTH=off` in local runs) when ADC has none to give.
async fn adc_token(audience: &str, base: &Url) -> anyhow::Result<Option<String>> {
    let local = matches!(base.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
    let made = match google_cloud_auth::credentials::idtoken::Builder::new(audience).build() {
        Ok(credentials) => credentials.id_token().await.map_err(anyhow::Error::from),
        Err(error) => Err(anyhow::Error::from(error)),
    };
    match made {
        Ok(token) => Ok(Some(token)),
        Err(_) if local => Ok(None),
        Err(error) => Err(error.context(format!(
            "no ID token for {audience} from Application Default Credentials: pass --api-token (see drip inspect --help)"
        ))),
    }
}
