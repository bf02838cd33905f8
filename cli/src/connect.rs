//! How the CLI reaches Redis: the services' own connection code and settings (TLS with a private
//! CA, AUTH in the URL, Redis Cluster), so it reaches whatever Terraform deploys.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use drip_store::{AnyConnection, RedisSettings, RedisStore};

/// Where the limiter's state is and what its rules are, for `inspect` and `limits` without
/// `--api`. Each flag falls back on the services' own variable, so the CLI run with a service's
/// environment (a Cloud Run job on its service account and secrets) needs none of them.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// `redis://HOST:PORT/DB` (or `rediss://` with TLS): Redis itself, from inside its VPC (with
    /// --rules); from a laptop, give --api instead.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis: Option<String>,
    /// The rules file the limiter runs with (with --redis).
    #[arg(long, env = "DRIP_RULES")]
    pub rules: Option<PathBuf>,
    /// The limiter's DRIP_REDIS_NAMESPACE.
    #[arg(long, env = "DRIP_REDIS_NAMESPACE", default_value = "drip")]
    pub namespace: String,
    #[command(flatten)]
    pub connection: RedisArgs,
}

/// What to give when neither the API nor Redis is named.
pub const WHERE: &str = "say where the limiter is: --api URL (its admin service, from a laptop: `terraform output admin_url`, \
     with a token as docs/operations.md says) or --redis URL and --rules FILE (inside its VPC); DRIP_API, or REDIS_URL and \
     DRIP_RULES, do the same";

impl StoreArgs {
    pub async fn store(&self) -> anyhow::Result<RedisStore<AnyConnection>> {
        let url = self.redis.as_deref().context(WHERE)?;
        Ok(RedisStore::new(self.connection.connect(url).await?, self.namespace.clone()))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    /// The CA certificate (PEM) that signs the Redis server's TLS certificate.
    #[arg(long, env = "REDIS_CA_CERT")]
    pub redis_ca_cert: Option<PathBuf>,
    /// Redis is a Redis Cluster.
    #[arg(long, env = "REDIS_CLUSTER")]
    pub redis_cluster: bool,
}

impl RedisArgs {
    pub async fn connect(&self, url: &str) -> anyhow::Result<AnyConnection> {
        let ca_cert_pem = match &self.redis_ca_cert {
            Some(path) => {
                Some(std::fs::read(path).with_context(|| format!("--redis-ca-cert: reading {}", path.display()))?)
            }
            None => None,
        };
        let settings = RedisSettings {
            url: url.to_owned(),
            ca_cert_pem,
            cluster: self.redis_cluster,
            response_timeout: Duration::from_secs(5),
            tokens: None,
        };
        Ok(AnyConnection::connect(&settings).await?)
    }
}
