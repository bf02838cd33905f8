//! One connection type for a single Redis (Memorystore for Redis) or a cluster (Memorystore for
//! Redis Cluster), so the services need not be generic over it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::auth::{BasicAuth, StreamingCredentialsProvider};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[derive(Clone)]
pub enum AnyConnection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for AnyConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AnyConnection::Single(_) => "AnyConnection::Single",
            AnyConnection::Cluster(_) => "AnyConnection::Cluster",
        })
    }
}

/// What a connection reports of each request it sends (a command or a pipeline): how long its
/// answer took, and whether it failed. The services time Redis here, below the `Store` trait, so
/// a store operation is written once per store and never again to be timed.
pub trait CallObserver: Send + Sync {
    fn observe(&self, took: Duration, ok: bool);
}

/// `inner`, each request it sends reported to `observer`.
#[derive(Clone)]
pub struct Observed<C> {
    inner: C,
    observer: Arc<dyn CallObserver>,
}

impl<C> Observed<C> {
    pub fn new(inner: C, observer: Arc<dyn CallObserver>) -> Self {
        Self { inner, observer }
    }
}

impl<C: std::fmt::Debug> std::fmt::Debug for Observed<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed").field("inner", &self.inner).finish_non_exhaustive()
    }
}

/// `call`, reporting how long it took (from now) and whether it succeeded to `observer`.
fn observed<'a, T: Send + 'a>(observer: Arc<dyn CallObserver>, call: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
    let started = Instant::now();
    Box::pin(async move {
        let result = call.await;
        observer.observe(started.elapsed(), result.is_ok());
        result
    })
}

impl<C: ConnectionLike + Send> ConnectionLike for Observed<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        observed(self.observer.clone(), self.inner.req_packed_command(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        observed(self.observer.clone(), self.inner.req_packed_commands(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// How to reach Redis: `redis://` or `rediss://` (TLS) URLs with an optional password
/// (`rediss://:PASSWORD@HOST:PORT`), an optional CA in PEM for TLS, whether it is a cluster, and
/// where short-lived passwords come from when it authenticates with tokens (Memorystore for Redis
/// Cluster's IAM authentication).
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub url: String,
    pub ca_cert_pem: Option<Vec<u8>>,
    pub cluster: bool,
    /// Each command fails after this long, so a stuck Redis means a 5xx and a redelivery, not a hang.
    pub response_timeout: Duration,
    pub tokens: Option<TokenAuth>,
}

/// A password that expires: each connection authenticates with the current token when it opens
/// and again every `refresh`, so reconnections never present an expired one.
#[derive(Clone)]
pub struct TokenAuth {
    pub source: Arc<dyn TokenSource>,
    pub refresh: Duration,
}

impl std::fmt::Debug for TokenAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuth").field("refresh", &self.refresh).finish_non_exhaustive()
    }
}

pub type TokenFuture = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// Where tokens come from (for Memorystore: OAuth access tokens of the service account).
pub trait TokenSource: Send + Sync {
    fn token(&self) -> TokenFuture;
}

impl StreamingCredentialsProvider for TokenAuth {
    fn subscribe(&self) -> Pin<Box<dyn futures_util::Stream<Item = redis::RedisResult<BasicAuth>> + Send + 'static>> {
        let (source, refresh) = (self.source.clone(), self.refresh);
        Box::pin(futures_util::stream::unfold(true, move |first| {
            let source = source.clone();
            async move {
                if !first {
                    tokio::time::sleep(refresh).await;
                }
                let credentials =
                    source.token().await.map(|token| BasicAuth::new("default".into(), token)).map_err(|e| {
                        redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "no token for Redis", e))
                    });
                Some((credentials, false))
            }
        }))
    }
}

/// Why Redis could not be reached, said once and with what to write: the redis crate's own text
/// repeats an I/O error's cause (`Connection refused (os error 111): Connection refused (os
/// error 111)`) and names no fix for a URL without a scheme.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("'{0}' is not a Redis URL: write redis://HOST:PORT/ (rediss:// with TLS), e.g. redis://{0}/")]
    NoScheme(String),
    #[error("'{url}' is not a Redis URL ({detail}): write redis://HOST:PORT/ (rediss:// with TLS)")]
    BadUrl { url: String, detail: String },
    #[error("cannot reach Redis at {url}: {cause} (is Redis listening there, and is the host and port right?)")]
    Unreachable { url: String, cause: String },
    #[error("Redis at {url} refused the connection: {cause}")]
    Refused { url: String, cause: String },
}

impl ConnectError {
    fn from_redis(url: &str, error: redis::RedisError) -> Self {
        let url = redacted(url);
        if error.kind() == redis::ErrorKind::InvalidClientConfig {
            return Self::BadUrl { url, detail: error.detail().unwrap_or("not understood").to_owned() };
        }
        if error.is_io_error() || error.is_timeout() || error.is_connection_refusal() {
            let cause = std::error::Error::source(&error).map_or_else(|| error.to_string(), ToString::to_string);
            return Self::Unreachable { url, cause: first_of_repeated(&cause) };
        }
        Self::Refused { url, cause: first_of_repeated(&error.to_string()) }
    }
}

/// `redis://:secret@host` shown as `redis://:***@host`: a connect error may be logged.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &url[..scheme + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

/// `A: A` as `A`.
fn first_of_repeated(text: &str) -> String {
    match text.split_once(": ") {
        Some((first, rest)) if first == rest => first.to_owned(),
        _ => text.to_owned(),
    }
}

impl AnyConnection {
    /// Connects as `settings` say; the error says what was wrong and what to write.
    pub async fn connect(settings: &RedisSettings) -> Result<Self, ConnectError> {
        let url = settings.url.as_str();
        if !url.contains("://") {
            return Err(ConnectError::NoScheme(url.to_owned()));
        }
        Self::open(settings).await.map_err(|e| ConnectError::from_redis(url, e))
    }

    async fn open(settings: &RedisSettings) -> redis::RedisResult<Self> {
        if settings.cluster {
            let mut builder = redis::cluster::ClusterClientBuilder::new(vec![settings.url.as_str()])
                .connection_timeout(settings.response_timeout)
                .response_timeout(settings.response_timeout);
            if let Some(tokens) = &settings.tokens {
                builder = builder.set_credentials_provider(tokens.clone());
            }
            if let Some(ca) = &settings.ca_cert_pem {
                builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) });
            }
            return Ok(Self::Cluster(builder.build()?.get_async_connection().await?));
        }
        let client = match &settings.ca_cert_pem {
            Some(ca) => redis::Client::build_with_tls(
                settings.url.as_str(),
                redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) },
            )?,
            None => redis::Client::open(settings.url.as_str())?,
        };
        let mut config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.response_timeout))
            .set_response_timeout(Some(settings.response_timeout))
            .set_number_of_retries(1);
        if let Some(tokens) = &settings.tokens {
            config = config.set_credentials_provider(tokens.clone());
        }
        Ok(Self::Single(ConnectionManager::new_with_config(client, config).await?))
    }
}

impl ConnectionLike for AnyConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            AnyConnection::Single(c) => c.req_packed_command(cmd),
            AnyConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            AnyConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            AnyConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AnyConnection::Single(c) => c.get_db(),
            AnyConnection::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn settings(url: &str) -> RedisSettings {
        RedisSettings {
            url: url.to_owned(),
            ca_cert_pem: None,
            cluster: false,
            response_timeout: Duration::from_secs(1),
            tokens: None,
        }
    }

    #[tokio::test]
    async fn a_connect_error_says_what_was_wrong_and_what_to_write() {
        let error = AnyConnection::connect(&settings("localhost:46379")).await.unwrap_err().to_string();
        assert_eq!(
            error,
            "'localhost:46379' is not a Redis URL: write redis://HOST:PORT/ (rediss:// with TLS), e.g. redis://localhost:46379/"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let error = AnyConnection::connect(&settings(&format!("redis://:s3cret@127.0.0.1:{port}/")))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(&format!("cannot reach Redis at redis://***@127.0.0.1:{port}/: ")), "{error}");
        assert!(!error.contains("s3cret"), "the password is not shown: {error}");
        let cause = error.split(": ").nth(1).unwrap();
        assert_eq!(error.matches(cause).count(), 1, "said once: {error}");
        let error = AnyConnection::connect(&settings("redis://127.0.0.1:notaport/")).await.unwrap_err().to_string();
        assert!(error.contains("is not a Redis URL"), "{error}");
    }
}
