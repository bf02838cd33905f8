//! Settings both services read from the environment, and what they build from them at start-up.
//! A bad setting stops start-up with a message that names it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Auth;
use crate::live_rules::{Acceptance, LiveRules};
use crate::metrics::Metrics;
use anyhow::{Context, bail};
use drip_gcp::Publish;
use drip_gcp::access_tokens::AccessTokens;
use drip_gcp::oidc::{OidcSettings, OidcVerifier};
use drip_gcp::pubsub::{BatchedPublishes, Publishers};
use drip_store::{AnyConnection, Batching, Observed, RedisSettings, RedisStore, TokenAuth, TokenFuture, TokenSource};

/// Access tokens live an hour; connections re-authenticate well before.
const IAM_TOKEN_REFRESH: Duration = Duration::from_secs(20 * 60);

struct GoogleTokens(AccessTokens);

impl TokenSource for GoogleTokens {
    fn token(&self) -> TokenFuture {
        let tokens = self.0.clone();
        Box::pin(async move { tokens.token().await })
    }
}
use envconfig::Envconfig;

#[derive(Debug, Clone, Envconfig)]
pub struct CommonSettings {
    #[envconfig(from = "PORT", default = "8080")]
    pub port: u16,
    /// `redis://HOST:PORT/DB`, or `rediss://:PASSWORD@HOST:PORT` for TLS with AUTH.
    #[envconfig(from = "REDIS_URL")]
    pub redis_url: String,
    /// Path of the CA certificate (PEM) that signs the Redis server's TLS certificate.
    #[envconfig(from = "REDIS_CA_CERT")]
    pub redis_ca_cert: Option<String>,
    /// `true` for Memorystore for Redis Cluster.
    #[envconfig(from = "REDIS_CLUSTER", default = "false")]
    pub redis_cluster: bool,
    #[envconfig(from = "DRIP_REDIS_NAMESPACE", default = "drip")]
    pub redis_namespace: String,
    #[envconfig(from = "DRIP_REDIS_TIMEOUT_MS", default = "1000")]
    pub redis_timeout_ms: u64,
    /// The most reservations one reserve.lua call carries: those that arrive while a call is in
    /// flight go together in the next (1: one call per reservation).
    #[envconfig(from = "DRIP_RESERVE_BATCH_MAX", default = "64")]
    pub reserve_batch_max: usize,
    /// The most messages one Pub/Sub publish request carries: the publishes to one topic that
    /// arrive while its requests are in flight go together in the next (1: a request each).
    #[envconfig(from = "DRIP_PUBLISH_BATCH_MAX", default = "100")]
    pub publish_batch_max: usize,
    /// Authenticate to Redis with the service account's access tokens (Memorystore for Redis
    /// Cluster's IAM authentication) instead of a password in REDIS_URL.
    #[envconfig(from = "REDIS_IAM_AUTH", default = "false")]
    pub redis_iam_auth: bool,
    #[envconfig(from = "GOOGLE_CLOUD_PROJECT")]
    pub project: String,
    /// Path of the rules file.
    #[envconfig(from = "DRIP_RULES")]
    pub rules: String,
    /// How often the rules file is checked for a new version (0: only on SIGHUP).
    #[envconfig(from = "DRIP_RULES_POLL_MS", default = "10000")]
    pub rules_poll_ms: u64,
    /// `host:port` of the Pub/Sub emulator; unset for the real service.
    #[envconfig(from = "PUBSUB_EMULATOR_HOST")]
    pub pubsub_emulator_host: Option<String>,
    #[envconfig(from = "DRIP_PUBLISH_TIMEOUT_MS", default = "2500")]
    pub publish_timeout_ms: u64,
    /// The time between SIGTERM and SIGKILL (Cloud Run: 10 s). The limiter's whole attempt must
    /// fit in it; after SIGTERM, what is left of a request is bounded by what is left of it.
    #[envconfig(from = "DRIP_SHUTDOWN_GRACE_MS", default = "10000")]
    pub shutdown_grace_ms: u64,
    /// `oidc` (the default): every route but the probes takes only a Google-signed token of one of
    /// its own callers; `off`: every caller passes (local runs, tests).
    #[envconfig(from = "DRIP_AUTH", default = "oidc")]
    pub auth: String,
    /// The `aud` callers' tokens must carry (the service's URL); required with DRIP_AUTH=oidc.
    #[envconfig(from = "DRIP_OIDC_AUDIENCE")]
    pub oidc_audience: Option<String>,
    /// Replaced by one list per route class; refused at start-up so that nobody keeps a list that
    /// no longer means what it did.
    #[envconfig(from = "DRIP_OIDC_ALLOWED_EMAILS")]
    pub oidc_allowed_emails: Option<String>,
    /// Comma-separated service accounts that may read `/metrics` (the collector).
    /// A second listener on 127.0.0.1 serving only `/metrics`, without authentication, for a
    /// collector in the same instance (Cloud Run's Managed Service for Prometheus sidecar); unset:
    /// none (`/metrics` on the main port, behind DRIP_METRICS_CALLERS, either way).
    #[envconfig(from = "DRIP_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    #[envconfig(from = "DRIP_METRICS_CALLERS", default = "")]
    pub metrics_callers: String,
    /// JWKS of the token signer; unset for Google's.
    #[envconfig(from = "DRIP_OIDC_JWKS_URL")]
    pub oidc_jwks_url: Option<String>,
    /// The secret both services hold (Secret Manager): the limiter signs each task body with it and
    /// the dispatcher publishes only what it signed (docs/design.md: "How the dispatcher trusts a task").
    /// Required wherever tasks are made or run; an instance serving no `/push` needs none.
    #[envconfig(from = "DRIP_TASK_SIGNING_KEY", default = "")]
    pub task_signing_key: String,
    /// The key before a rotation, still accepted (never used to sign): set it to the old key and
    /// DRIP_TASK_SIGNING_KEY to the new one, roll out, and drop it once the old tasks are gone
    /// (docs/operations.md: "Rotating the task signing key").
    #[envconfig(from = "DRIP_TASK_SIGNING_KEY_PREVIOUS")]
    pub task_signing_key_previous: Option<String>,
}

/// Reads a service's settings from the environment. Every setting that is missing or does not
/// parse is named in one error, with what was given and what is expected (envconfig stops at the
/// first and names only the variable).
pub fn from_env<T: Envconfig>() -> anyhow::Result<T> {
    from_map(std::env::vars().collect())
}

fn from_map<T: Envconfig>(mut env: HashMap<String, String>) -> anyhow::Result<T> {
    // A value that parses stands in for each bad one so that the next one shows.
    const STAND_INS: [&str; 4] = ["0", "false", "never", "x"];
    let mut problems: Vec<String> = Vec::new();
    let name_of = |error: &envconfig::Error| match error {
        envconfig::Error::ParseError { name } | envconfig::Error::EnvVarMissing { name } => *name,
    };
    loop {
        let error = match T::init_from_hashmap(&env) {
            Ok(settings) if problems.is_empty() => return Ok(settings),
            Ok(_) => break,
            Err(error) => error,
        };
        let name = name_of(&error);
        problems.push(match error {
            envconfig::Error::ParseError { .. } => {
                let given = env.get(name).cloned().unwrap_or_default();
                format!("{name}='{given}' is not valid: expected {}", expected_value(name))
            }
            envconfig::Error::EnvVarMissing { .. } => format!("{name} is not set"),
        });
        let moved_on = STAND_INS.iter().any(|stand_in| {
            env.insert(name.to_owned(), (*stand_in).to_owned());
            T::init_from_hashmap(&env).map_or_else(|e| name_of(&e) != name, |_| true)
        });
        if !moved_on {
            break;
        }
    }
    anyhow::bail!("{} (docs/operations.md: \"Settings\")", problems.join("; "))
}

/// What a setting takes, from its name's convention.
fn expected_value(name: &str) -> &'static str {
    match name {
        "REDIS_CLUSTER" | "REDIS_IAM_AUTH" => "true or false",
        "DRIP_FORWARD_ID_TOKEN" => "auto, always or never",
        _ if name.ends_with("_MS") => "a whole number of milliseconds, e.g. 10000",
        _ if ["PORT", "_BYTES", "_MAX", "_ATTEMPTS", "_IN_FLIGHT"].iter().any(|end| name.ends_with(end)) => {
            "a whole number"
        }
        _ => "a value of the kind docs/operations.md (\"Settings\") gives",
    }
}

impl CommonSettings {
    pub fn from_env() -> anyhow::Result<Self> {
        let settings: Self = from_env()?;
        if settings.project.trim().is_empty() {
            bail!("GOOGLE_CLOUD_PROJECT is empty");
        }
        settings.task_signer()?;
        Ok(settings)
    }

    /// Signs and checks task bodies; a short key is refused, since it is all that stands between
    /// whoever can create tasks and the overflow and dead-letter topics.
    pub fn task_signer(&self) -> anyhow::Result<drip_core::overflow::TaskSigner> {
        if self.task_signing_key.is_empty() {
            bail!(
                "DRIP_TASK_SIGNING_KEY is not set: give the task signing key (at least 32 characters, e.g. `openssl rand -hex 32`; Terraform reads it from task_signing_key_secret)"
            );
        }
        if self.task_signing_key.len() < 32 {
            bail!("DRIP_TASK_SIGNING_KEY must be at least 32 characters (e.g. `openssl rand -hex 32`)");
        }
        let signer = drip_core::overflow::TaskSigner::new(&self.task_signing_key);
        match self.task_signing_key_previous.as_deref().filter(|k| !k.is_empty()) {
            None => Ok(signer),
            Some(previous) if previous.len() < 32 => {
                bail!("DRIP_TASK_SIGNING_KEY_PREVIOUS must be at least 32 characters, as the key it was")
            }
            Some(previous) => Ok(signer.with_previous(previous)),
        }
    }

    /// The rules file, validated, with somewhere to dead-letter what no rule can take (both
    /// services dead-letter: the limiter unmatched messages, the dispatcher tasks of retired rules).
    /// They are re-read when the file changes and on SIGHUP (see [`LiveRules`]); `accept` is the
    /// service's own check of every version.
    pub fn load_rules(&self, accept: Acceptance, metrics: Arc<Metrics>) -> anyhow::Result<Arc<LiveRules>> {
        let rules = LiveRules::load(&self.rules, accept, metrics)
            .map_err(|errors| anyhow::anyhow!("invalid rules (DRIP_RULES):\n{errors}"))?;
        rules.watch(Duration::from_millis(self.rules_poll_ms));
        Ok(rules)
    }

    pub fn redis_settings(&self) -> anyhow::Result<RedisSettings> {
        let ca_cert_pem = match &self.redis_ca_cert {
            Some(path) => Some(std::fs::read(path).with_context(|| format!("REDIS_CA_CERT: reading {path}"))?),
            None => None,
        };
        let tokens = if self.redis_iam_auth {
            let tokens =
                AccessTokens::from_environment().context("REDIS_IAM_AUTH: loading the service's credentials")?;
            Some(TokenAuth { source: Arc::new(GoogleTokens(tokens)), refresh: IAM_TOKEN_REFRESH })
        } else {
            None
        };
        Ok(RedisSettings {
            url: self.redis_url.clone(),
            ca_cert_pem,
            cluster: self.redis_cluster,
            response_timeout: Duration::from_millis(self.redis_timeout_ms),
            tokens,
        })
    }

    pub async fn connect_redis(&self) -> anyhow::Result<AnyConnection> {
        AnyConnection::connect(&self.redis_settings()?).await.context("REDIS_URL")
    }

    /// The services' store: Redis, reservations grouped per connection (per hash tag on a Cluster),
    /// every request timed into `drip_dependency_call_seconds{dependency="redis"}` by the connection
    /// itself (below the store, so no store operation is written again to be timed).
    pub async fn redis_store(
        &self,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<RedisStore<Observed<AnyConnection>>> {
        let batching = Batching::new(self.reserve_batch_max, self.redis_cluster);
        let connection =
            Observed::new(self.connect_redis().await?, Arc::new(crate::metrics::RedisCalls(metrics.clone())));
        Ok(RedisStore::new(connection, self.redis_namespace.clone())
            .with_lease_observer(Arc::new(crate::metrics::RedisCalls(metrics)))
            .with_batching(batching))
    }

    /// Pub/Sub, the publishes to one topic that arrive together sent together.
    pub async fn connect_pubsub(&self, metrics: Arc<crate::metrics::Metrics>) -> anyhow::Result<Arc<dyn Publish>> {
        let timeout = Duration::from_millis(self.publish_timeout_ms);
        let publishers = Publishers::connect(&self.project, self.pubsub_emulator_host.as_deref(), timeout)
            .await
            .context("creating the Pub/Sub client (PUBSUB_EMULATOR_HOST / credentials)")?;
        // Counted inside the group commit: each request the client is asked to send.
        let counted = crate::counted_publish::CountedPublish::new(Arc::new(publishers), metrics);
        Ok(Arc::new(BatchedPublishes::new(counted, self.publish_batch_max)))
    }

    /// How callers are authenticated (fails closed: OIDC unless DRIP_AUTH=off says otherwise).
    pub fn auth(&self) -> anyhow::Result<Auth> {
        if self.oidc_allowed_emails.as_deref().is_some_and(|list| !list.trim().is_empty()) {
            bail!(
                "DRIP_OIDC_ALLOWED_EMAILS allowed its callers on every route and is no longer read: list them per route instead (DRIP_PUSH_CALLERS, DRIP_ADMIN_CALLERS, DRIP_FEEDBACK_CALLERS, DRIP_TASK_CALLERS, DRIP_METRICS_CALLERS)"
            );
        }
        let verifier = self.oidc_audience.clone().filter(|a| !a.is_empty()).map(|audience| {
            Arc::new(OidcVerifier::new(OidcSettings { audience, jwks_url: self.oidc_jwks_url.clone() }))
        });
        Auth::from_settings(&self.auth, verifier)
    }
}

#[cfg(test)]
mod every_bad_setting {
    use super::*;

    /// One start names every setting that is missing or does not parse, not the first alone.
    #[test]
    fn is_named_in_one_error() {
        let env = HashMap::from([("PORT".to_owned(), "eighty".to_owned())]);
        let error = from_map::<CommonSettings>(env).unwrap_err().to_string();
        for named in [
            "PORT='eighty' is not valid",
            "REDIS_URL is not set",
            "GOOGLE_CLOUD_PROJECT is not set",
            "DRIP_RULES is not set",
        ] {
            assert!(error.contains(named), "{named}: {error}");
        }
    }
}
