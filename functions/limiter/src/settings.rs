use anyhow::{Context, bail};
use drip_service::settings::CommonSettings;
use envconfig::Envconfig;

/// The limiter's settings, from the environment (README: "Limiter settings").
#[derive(Debug, Clone, Envconfig)]
pub struct Settings {
    #[envconfig(nested)]
    pub common: CommonSettings,
    /// The Cloud Tasks stand-in's URL; unset for the real service.
    #[envconfig(from = "CLOUD_TASKS_ENDPOINT")]
    pub cloud_tasks_endpoint: Option<String>,
    /// Comma-separated queues, as ids (in DRIP_TASKS_LOCATION) or full names. A key's tasks always
    /// go to the same queue; more queues lift Cloud Tasks' 500 dispatches/s per queue.
    #[envconfig(from = "DRIP_TASKS_QUEUES")]
    pub tasks_queues: String,
    #[envconfig(from = "DRIP_TASKS_LOCATION", default = "us-central1")]
    pub tasks_location: String,
    /// The dispatcher's `/dispatch` URL that tasks call.
    #[envconfig(from = "DRIP_DISPATCHER_URL")]
    pub dispatcher_url: String,
    /// The service account whose OIDC token tasks carry to the dispatcher.
    #[envconfig(from = "DRIP_TASKS_SERVICE_ACCOUNT")]
    pub tasks_service_account: Option<String>,
    /// The audience of that token; defaults to the dispatcher URL's origin.
    #[envconfig(from = "DRIP_TASKS_AUDIENCE")]
    pub tasks_audience: Option<String>,
    #[envconfig(from = "DRIP_TASKS_TIMEOUT_MS", default = "10000")]
    pub tasks_timeout_ms: u64,
    /// Payloads too large for a task wait in Redis up to this size; larger ones are dead-lettered.
    #[envconfig(from = "DRIP_CLAIM_CHECK_MAX_BYTES", default = "1048576")]
    pub claim_check_max_bytes: usize,
    #[envconfig(from = "DRIP_FORWARD_TIMEOUT_MS", default = "5000")]
    pub forward_timeout_ms: u64,
    /// `auto` (a Google ID token for `*.run.app` URLs), `always` or `never`.
    #[envconfig(from = "DRIP_FORWARD_ID_TOKEN", default = "auto")]
    pub forward_id_token: ForwardIdTokenMode,
    /// The time between SIGTERM and SIGKILL (Cloud Run: 10 s): the longest inline wait plus the
    /// forward timeout must fit in it, so no request is cut off in the middle.
    #[envconfig(from = "DRIP_SHUTDOWN_GRACE_MS", default = "10000")]
    pub shutdown_grace_ms: u64,
}

/// When forwards to URLs carry a Google ID token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardIdTokenMode {
    /// For `*.run.app` URLs only.
    Auto,
    Always,
    Never,
}

impl std::str::FromStr for ForwardIdTokenMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(format!("DRIP_FORWARD_ID_TOKEN must be auto, always or never, got '{other}'")),
        }
    }
}

impl Settings {
    pub fn from_env() -> anyhow::Result<Self> {
        let settings = Self::init_from_env().context("reading settings from the environment")?;
        settings.queues()?;
        if !(settings.dispatcher_url.starts_with("https://") || settings.dispatcher_url.starts_with("http://")) {
            bail!("DRIP_DISPATCHER_URL must be an http(s) URL, got '{}'", settings.dispatcher_url);
        }
        Ok(settings)
    }

    /// The longest inline wait plus the forward timeout must end before SIGKILL follows SIGTERM.
    pub fn check_shutdown_budget(&self, longest_inline_wait: u64) -> anyhow::Result<()> {
        let needed = longest_inline_wait + self.forward_timeout_ms;
        if needed >= self.shutdown_grace_ms {
            bail!(
                "the longest inline_wait ({longest_inline_wait} ms) plus DRIP_FORWARD_TIMEOUT_MS ({} ms) must be under \
                 DRIP_SHUTDOWN_GRACE_MS ({} ms, Cloud Run's time between SIGTERM and SIGKILL)",
                self.forward_timeout_ms,
                self.shutdown_grace_ms
            );
        }
        Ok(())
    }

    /// Full queue names.
    pub fn queues(&self) -> anyhow::Result<Vec<String>> {
        let queues: Vec<String> = self
            .tasks_queues
            .split(',')
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .map(|q| {
                if q.starts_with("projects/") {
                    q.to_owned()
                } else {
                    format!("projects/{}/locations/{}/queues/{q}", self.common.project, self.tasks_location)
                }
            })
            .collect();
        if queues.is_empty() {
            bail!("DRIP_TASKS_QUEUES names no queue");
        }
        Ok(queues)
    }

    pub fn tasks_audience(&self) -> String {
        self.tasks_audience.clone().unwrap_or_else(|| origin(&self.dispatcher_url))
    }
}

/// `https://host/path` → `https://host`.
fn origin(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(slash) => url[..after_scheme + slash].to_owned(),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::origin;

    #[test]
    fn audience_is_the_url_origin() {
        assert_eq!(origin("https://dispatcher-abc.a.run.app/dispatch"), "https://dispatcher-abc.a.run.app");
        assert_eq!(origin("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }
}
