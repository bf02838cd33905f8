//! OAuth access tokens of the service's own identity (Application Default Credentials), as the
//! password of Memorystore for Redis Cluster's IAM authentication.

use google_cloud_auth::credentials::{AccessTokenCredentials, Builder};

#[derive(Debug, Clone)]
pub struct AccessTokens {
    credentials: AccessTokenCredentials,
}

impl AccessTokens {
    pub fn from_environment() -> Result<Self, google_cloud_auth::build_errors::Error> {
        Ok(Self { credentials: Builder::default().build_access_token_credentials()? })
    }

    /// A current token (the credentials cache it and refresh it before it expires).
    pub async fn token(&self) -> Result<String, String> {
        self.credentials.access_token().await.map(|t| t.token).map_err(|e| e.to_string())
    }
}
