//! Signs the OIDC tokens the stand-in attaches to dispatches, as Google does for a task's
//! `oidcToken`, with a committed test key whose public half the verifiers under test fetch.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

pub const TEST_KEY_ID: &str = "drip-test-key-1";
pub const TEST_SIGNING_KEY_PEM: &str = include_str!("../test-key/signing-key.pem");
/// A key the verifiers do not know: tokens it signs must be rejected.
pub const TEST_OTHER_KEY_PEM: &str = include_str!("../test-key/other-key.pem");
pub const TEST_JWKS: &str = include_str!("../test-key/jwks.json");

pub struct TokenSigner {
    key: EncodingKey,
    kid: String,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner").field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl TokenSigner {
    pub fn test_key() -> Self {
        Self::from_pem(TEST_SIGNING_KEY_PEM, TEST_KEY_ID)
    }

    pub fn from_pem(pem: &str, kid: &str) -> Self {
        Self { key: EncodingKey::from_rsa_pem(pem.as_bytes()).expect("a valid RSA test key"), kid: kid.to_owned() }
    }

    /// A Google-style ID token: issuer accounts.google.com, the given audience and email.
    pub fn sign(&self, email: &str, audience: &str, issued_at: i64, lifetime_secs: i64) -> String {
        let claims = json!({
            "iss": "https://accounts.google.com",
            "aud": audience,
            "sub": email,
            "email": email,
            "email_verified": true,
            "iat": issued_at,
            "exp": issued_at + lifetime_secs,
        });
        self.sign_claims(&claims)
    }

    pub fn sign_claims(&self, claims: &serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key).expect("signing with a valid key")
    }
}
