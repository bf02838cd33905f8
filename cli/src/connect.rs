//! How the CLI reaches Redis: the services' own connection code and settings (TLS with a private
//! CA, AUTH in the URL, Redis Cluster), so it reaches whatever Terraform deploys.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use drip_store::{AnyConnection, RedisSettings};

#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    /// The CA certificate (PEM) that signs the Redis server's TLS certificate (REDIS_CA_CERT).
    #[arg(long)]
    pub redis_ca_cert: Option<PathBuf>,
    /// Redis is a Redis Cluster (REDIS_CLUSTER=true).
    #[arg(long)]
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
        AnyConnection::connect(&settings).await.with_context(|| format!("connecting to {url}"))
    }
}
