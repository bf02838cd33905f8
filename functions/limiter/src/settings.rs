use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use drip_gcp::http_target::IdTokenMode;
use drip_gcp::oidc::{OidcSettings, OidcVerifier};
use drip_service::settings::CommonSettings;
use drip_service::shutdown::Shutdown;
use drip_service::tasks::TaskSettings;
use envconfig::Envconfig;

use crate::console::{ConsoleAuth, DeadLetterSources, Role};

/// The limiter's settings, from the environment (docs/operations.md: "Settings").
#[derive(Debug, Clone, Envconfig)]
pub struct Settings {
    #[envconfig(nested)]
    pub common: CommonSettings,
    #[envconfig(nested)]
    pub tasks: TaskSettings,
    /// Payloads too large for a task wait in Redis up to this size; larger ones are dead-lettered.
    #[envconfig(from = "DRIP_CLAIM_CHECK_MAX_BYTES", default = "1048576")]
    pub claim_check_max_bytes: usize,
    #[envconfig(from = "DRIP_FORWARD_TIMEOUT_MS", default = "2500")]
    pub forward_timeout_ms: u64,
    /// `auto` (a Google ID token for `*.run.app` URLs), `always` or `never`.
    #[envconfig(from = "DRIP_FORWARD_ID_TOKEN", default = "auto")]
    pub forward_id_token: IdTokenMode,
    /// The route classes this instance serves, comma-separated: `push` (`POST /push`), `admin`
    /// (`/v1/rules/...`), `feedback` (`POST /v1/feedback`), `console` (`/console`, the operator
    /// console). The admin service that operators reach from the internet serves `admin,feedback`
    /// and never `push`; the console service behind IAP serves `console` alone.
    #[envconfig(from = "DRIP_ROUTES", default = "push,admin,feedback,console")]
    pub routes: String,
    /// Service accounts that may `POST /push` (the push subscriptions'); required with OIDC on
    /// when `push` is served.
    #[envconfig(from = "DRIP_PUSH_CALLERS", default = "")]
    pub push_callers: String,
    /// Service accounts that may inspect keys and change their limits (`/v1/rules/...`): operators.
    #[envconfig(from = "DRIP_ADMIN_CALLERS", default = "")]
    pub admin_callers: String,
    /// Service accounts that may report a downstream's answers (`POST /v1/feedback`): overflow consumers.
    #[envconfig(from = "DRIP_FEEDBACK_CALLERS", default = "")]
    pub feedback_callers: String,
    #[envconfig(nested)]
    pub console: ConsoleSettings,
}

/// Who may use the operator console (`/console`, served with the admin routes).
#[derive(Debug, Clone, Envconfig)]
pub struct ConsoleSettings {
    /// People (IAP's verified emails) or service accounts who may act: pause, resume, override.
    #[envconfig(from = "DRIP_CONSOLE_OPERATORS", default = "")]
    pub operators: String,
    /// Those who may only look.
    #[envconfig(from = "DRIP_CONSOLE_VIEWERS", default = "")]
    pub viewers: String,
    /// The audience of Identity-Aware Proxy's signed header on this service
    /// (`/projects/<number>/locations/<region>/services/<service>`): with it, the console takes
    /// its callers from IAP and from nothing else.
    #[envconfig(from = "DRIP_IAP_AUDIENCE")]
    pub iap_audience: Option<String>,
    /// Where IAP's signing keys are (tests); Google's by default.
    #[envconfig(from = "DRIP_IAP_JWKS_URL")]
    pub iap_jwks_url: Option<String>,
    /// With `DRIP_AUTH=off` (local runs): the role of every caller, `operator`, `viewer` or `none`.
    #[envconfig(from = "DRIP_CONSOLE_ANONYMOUS", default = "operator")]
    pub anonymous: String,
    /// Dead-letter topics' subscriptions the console may read and replay from (names or full).
    #[envconfig(from = "DRIP_CONSOLE_DLQ_SUBSCRIPTIONS", default = "")]
    pub dlq_subscriptions: String,
    /// Topics the console may replay dead letters' events to (the topics the limiter reads).
    #[envconfig(from = "DRIP_CONSOLE_REPLAY_TOPICS", default = "")]
    pub replay_topics: String,
}

/// As the environment gives it when nothing is set.
impl Default for ConsoleSettings {
    fn default() -> Self {
        Self {
            operators: String::new(),
            viewers: String::new(),
            iap_audience: None,
            iap_jwks_url: None,
            anonymous: "operator".into(),
            dlq_subscriptions: String::new(),
            replay_topics: String::new(),
        }
    }
}

impl ConsoleSettings {
    /// The subscriptions and topics of `project` the console's dead-letters page works with.
    pub fn dead_letters(&self, project: &str, emulator: Option<&str>) -> DeadLetterSources {
        let full = |kind: &str, list: &str| -> Vec<String> {
            let name = |n: &str| {
                if n.starts_with("projects/") { n.to_owned() } else { format!("projects/{project}/{kind}/{n}") }
            };
            drip_service::auth::emails(list).iter().map(|n| name(n)).collect()
        };
        DeadLetterSources {
            subscriptions: full("subscriptions", &self.dlq_subscriptions),
            topics: full("topics", &self.replay_topics),
            emulator: emulator.map(str::to_owned),
        }
    }

    fn auth(&self, auth: drip_service::auth::Auth) -> anyhow::Result<ConsoleAuth> {
        let anonymous = match self.anonymous.trim() {
            "none" => None,
            role => Some(role.parse::<Role>().map_err(|e| anyhow::anyhow!("DRIP_CONSOLE_ANONYMOUS: {e}, or none"))?),
        };
        let iap = self.iap_audience.clone().filter(|a| !a.trim().is_empty()).map(|audience| {
            Arc::new(OidcVerifier::iap(OidcSettings { audience, jwks_url: self.iap_jwks_url.clone() }))
        });
        Ok(ConsoleAuth::new(auth, iap, (&self.operators, &self.viewers), anonymous))
    }
}

/// Which route classes an instance serves (`DRIP_ROUTES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routes {
    pub push: bool,
    pub admin: bool,
    pub feedback: bool,
    pub console: bool,
}

impl Routes {
    pub const ALL: Self = Self { push: true, admin: true, feedback: true, console: true };
    pub const NONE: Self = Self { push: false, admin: false, feedback: false, console: false };

    /// From a comma-separated list of `push`, `admin`, `feedback` and `console`.
    pub fn parse(list: &str) -> anyhow::Result<Self> {
        let mut routes = Self::NONE;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "push" => routes.push = true,
                "admin" => routes.admin = true,
                "feedback" => routes.feedback = true,
                "console" => routes.console = true,
                other => bail!(
                    "DRIP_ROUTES: unknown route class '{other}' in '{list}' (write a comma-separated list of push, admin, feedback and console)"
                ),
            }
        }
        if routes == Self::NONE {
            bail!("DRIP_ROUTES is empty: name the route classes to serve (push, admin, feedback, console)");
        }
        Ok(routes)
    }
}

/// Each route class's callers, and which classes are served.
#[derive(Debug, Clone)]
pub struct LimiterAuth {
    pub routes: Routes,
    pub push: drip_service::auth::RouteAuth,
    pub admin: drip_service::auth::RouteAuth,
    pub feedback: drip_service::auth::RouteAuth,
    pub metrics: drip_service::auth::RouteAuth,
    pub console: ConsoleAuth,
}

impl LimiterAuth {
    /// Every route class served, every caller passes (tests of handlers in process).
    pub fn off() -> Self {
        let off = drip_service::auth::RouteAuth::off;
        let console = ConsoleAuth::anonymous(Role::Operator);
        Self { routes: Routes::ALL, push: off(), admin: off(), feedback: off(), metrics: off(), console }
    }

    /// The same callers, serving only `routes`.
    pub fn serving(self, routes: Routes) -> Self {
        Self { routes, ..self }
    }
}

impl Settings {
    pub fn from_env() -> anyhow::Result<Self> {
        let settings: Self = drip_service::settings::from_env()?;
        // Cloud Tasks and the signing key serve delayed events only: an instance without /push
        // (the admin service) needs neither.
        if settings.route_auth()?.routes.push {
            settings.tasks.check(&settings.common.project)?;
            settings.common.task_signer()?;
        }
        Ok(settings)
    }

    pub fn route_auth(&self) -> anyhow::Result<LimiterAuth> {
        let auth = self.common.auth()?;
        let routes = Routes::parse(&self.routes)?;
        Ok(LimiterAuth {
            routes,
            push: auth.route("DRIP_PUSH_CALLERS", &self.push_callers, routes.push)?,
            admin: auth.route("DRIP_ADMIN_CALLERS", &self.admin_callers, false)?,
            feedback: auth.route("DRIP_FEEDBACK_CALLERS", &self.feedback_callers, false)?,
            metrics: auth.route("DRIP_METRICS_CALLERS", &self.common.metrics_callers, false)?,
            console: self.console.auth(auth)?,
        })
    }

    /// How long an attempt may take to act: the inline wait, the forward or the task's creation
    /// (whichever may take longer), then a dead letter's publish.
    pub fn attempt_deadline(&self, longest_inline_wait: u64) -> Duration {
        let act = self.forward_timeout_ms.max(self.tasks.tasks_timeout_ms).max(self.common.redis_timeout_ms);
        Duration::from_millis(longest_inline_wait + act + self.common.publish_timeout_ms)
    }

    /// The whole attempt must end before SIGKILL follows SIGTERM: its action, and the Redis calls
    /// before it (the previous key's frontier, the reservation) and after it (completion or release).
    pub fn check_shutdown_budget(&self, longest_inline_wait: u64) -> anyhow::Result<()> {
        let common = &self.common;
        let whole = self.attempt_deadline(longest_inline_wait).as_millis() as u64 + 3 * common.redis_timeout_ms;
        if whole >= common.shutdown_grace_ms {
            bail!(
                "a push may take {whole} ms, which must be under DRIP_SHUTDOWN_GRACE_MS ({} ms, Cloud Run's time between \
                 SIGTERM and SIGKILL): the longest inline_wait ({longest_inline_wait} ms), the longest of \
                 DRIP_FORWARD_TIMEOUT_MS ({} ms) and DRIP_TASKS_TIMEOUT_MS ({} ms), DRIP_PUBLISH_TIMEOUT_MS ({} ms) for a \
                 dead letter, and three times DRIP_REDIS_TIMEOUT_MS ({} ms)",
                common.shutdown_grace_ms,
                self.forward_timeout_ms,
                self.tasks.tasks_timeout_ms,
                common.publish_timeout_ms,
                common.redis_timeout_ms,
            );
        }
        Ok(())
    }

    /// After SIGTERM, a request's steps end while a Redis call (releasing its lease) and its
    /// answer still fit before SIGKILL.
    pub fn shutdown(&self) -> Arc<Shutdown> {
        let common = &self.common;
        let reserve = Duration::from_millis(common.redis_timeout_ms + 500);
        Shutdown::new(Duration::from_millis(common.shutdown_grace_ms), reserve)
    }
}

#[cfg(test)]
mod tests {
    use drip_service::tasks::origin;

    use super::Routes;

    #[test]
    fn routes_name_the_classes_served_and_refuse_unknown_ones() {
        assert_eq!(Routes::parse("push,admin,feedback,console").unwrap(), Routes::ALL);
        assert_eq!(
            Routes::parse(" admin , feedback ").unwrap(),
            Routes { admin: true, feedback: true, ..Routes::NONE }
        );
        assert_eq!(Routes::parse("console").unwrap(), Routes { console: true, ..Routes::NONE });
        let error = Routes::parse("admin,pus").unwrap_err().to_string();
        assert!(error.contains("'pus'") && error.contains("push, admin, feedback and console"), "{error}");
        assert!(Routes::parse(" , ").unwrap_err().to_string().contains("empty"));
    }

    #[test]
    fn audience_is_the_url_origin() {
        assert_eq!(origin("https://dispatcher-abc.a.run.app/dispatch"), "https://dispatcher-abc.a.run.app");
        assert_eq!(origin("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }
}
