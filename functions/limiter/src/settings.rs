use anyhow::{Context, bail};
use drip_gcp::http_target::IdTokenMode;
use drip_service::settings::CommonSettings;
use drip_service::tasks::TaskSettings;
use envconfig::Envconfig;

/// The limiter's settings, from the environment (README: "Limiter settings").
#[derive(Debug, Clone, Envconfig)]
pub struct Settings {
    #[envconfig(nested)]
    pub common: CommonSettings,
    #[envconfig(nested)]
    pub tasks: TaskSettings,
    /// Payloads too large for a task wait in Redis up to this size; larger ones are dead-lettered.
    #[envconfig(from = "DRIP_CLAIM_CHECK_MAX_BYTES", default = "1048576")]
    pub claim_check_max_bytes: usize,
    #[envconfig(from = "DRIP_FORWARD_TIMEOUT_MS", default = "5000")]
    pub forward_timeout_ms: u64,
    /// `auto` (a Google ID token for `*.run.app` URLs), `always` or `never`.
    #[envconfig(from = "DRIP_FORWARD_ID_TOKEN", default = "auto")]
    pub forward_id_token: IdTokenMode,
    /// The time between SIGTERM and SIGKILL (Cloud Run: 10 s): the longest inline wait plus the
    /// forward timeout must fit in it, so no request is cut off in the middle.
    #[envconfig(from = "DRIP_SHUTDOWN_GRACE_MS", default = "10000")]
    pub shutdown_grace_ms: u64,
}

impl Settings {
    pub fn from_env() -> anyhow::Result<Self> {
        let settings = Self::init_from_env().context("reading settings from the environment")?;
        settings.tasks.check(&settings.common.project)?;
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
}

#[cfg(test)]
mod tests {
    use drip_service::tasks::origin;

    #[test]
    fn audience_is_the_url_origin() {
        assert_eq!(origin("https://dispatcher-abc.a.run.app/dispatch"), "https://dispatcher-abc.a.run.app");
        assert_eq!(origin("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }
}
