//! Google Cloud adapters, all on the official clients and one auth stack (`google-cloud-auth`).
//! Pointed at an emulator (an `http://` endpoint), every client uses anonymous credentials, since
//! without them it would spend a minute looking for default credentials.

pub mod access_tokens;
#[cfg(feature = "doubles")]
pub mod doubles;
pub mod http_target;
pub mod oidc;
pub mod pubsub;
pub mod pull;
pub mod tasks;

use std::future::Future;
use std::pin::Pin;

use google_cloud_auth::credentials::Credentials;

pub use pubsub::Publish;
pub use tasks::CreateTask;

/// What the object-safe client traits return.
pub type GcpFuture<'a, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'a>>;

/// Credentials for a local emulator endpoint; `None` means Application Default Credentials.
pub fn emulator_credentials(endpoint: Option<&str>) -> Option<Credentials> {
    endpoint.map(|_| google_cloud_auth::credentials::anonymous::Builder::new().build())
}

/// `host:port` (as in `PUBSUB_EMULATOR_HOST`) or a full URL, as the URL the clients take.
pub fn endpoint_url(host_or_url: &str) -> String {
    if host_or_url.starts_with("http://") || host_or_url.starts_with("https://") {
        host_or_url.trim_end_matches('/').to_owned()
    } else {
        format!("http://{host_or_url}")
    }
}
