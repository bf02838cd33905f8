//! How Drip authenticates to Memorystore, locally: in-transit encryption and AUTH (a Redis serving
//! TLS only, with a password, and a certificate signed by a CA of the test's own, REDIS_CA_CERT in
//! production), and token authentication (Memorystore for Redis Cluster's IAM authentication,
//! REDIS_IAM_AUTH), with a token source of the test's own standing in for Google's access tokens.

use std::time::Duration;

use drip_core::rules::{Limit, Placement, Window};
use drip_core::schedule::ReserveRequest;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use drip_store::{AnyConnection, RedisSettings, RedisStore, SlotRequest, Store, TokenAuth, TokenFuture, TokenSource};
use drip_tests::redis_server::{RedisCluster, RedisServer};
use drip_tests::redis_tls::{TlsRedis, start};
use drip_tests::unique;

fn settings(redis: &TlsRedis, password: &str, ca: &str) -> RedisSettings {
    RedisSettings {
        url: format!("rediss://:{password}@127.0.0.1:{}/", redis.port),
        ca_cert_pem: Some(std::fs::read(redis.dir.join(ca)).unwrap()),
        cluster: false,
        response_timeout: Duration::from_secs(2),
        tokens: None,
    }
}

#[tokio::test]
async fn reserves_over_tls_with_auth_and_the_given_ca() {
    let redis = start();
    let connection = AnyConnection::connect(&settings(&redis, "s3cret", "ca.pem")).await.expect("TLS + AUTH connect");
    let store = RedisStore::new(connection, "drip");
    let limits = [Limit::new(1, 60_000, Window::Fixed(Placement::Start)).unwrap()];
    let request =
        SlotRequest::new("tls", "k", ReserveRequest { max_delay: 120_000, ..ReserveRequest::new("m1", &limits, 0) })
            .at(0);
    let reserved = store.reserve(&request).await.unwrap();
    assert_eq!(reserved.reservation.slot, 0);
}

#[tokio::test]
async fn refuses_a_server_signed_by_another_ca_and_a_wrong_password() {
    let redis = start();
    assert!(AnyConnection::connect(&settings(&redis, "s3cret", "other.pem")).await.is_err(), "an unknown CA must fail");
    assert!(AnyConnection::connect(&settings(&redis, "wrong", "ca.pem")).await.is_err(), "a wrong password must fail");
}

/// Hands out a fixed token and counts how often it was asked.
struct CountingTokens {
    token: String,
    asked: AtomicUsize,
}

impl TokenSource for CountingTokens {
    fn token(&self) -> TokenFuture {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let token = self.token.clone();
        Box::pin(async move { Ok(token) })
    }
}

fn token_settings(url: String, cluster: bool, token: &str, refresh: Duration) -> (RedisSettings, Arc<CountingTokens>) {
    let tokens = Arc::new(CountingTokens { token: token.to_owned(), asked: AtomicUsize::new(0) });
    let auth = TokenAuth { source: tokens.clone(), refresh };
    (
        RedisSettings { url, ca_cert_pem: None, cluster, response_timeout: Duration::from_secs(2), tokens: Some(auth) },
        tokens,
    )
}

async fn reserve_once(connection: AnyConnection, id: &str) -> i64 {
    let store = RedisStore::new(connection, unique("tokens"));
    let limits = [Limit::new(5, 60_000, Window::Fixed(Placement::Start)).unwrap()];
    let request =
        SlotRequest::new("tokens", "k", ReserveRequest { max_delay: 120_000, ..ReserveRequest::new(id, &limits, 0) })
            .at(0);
    store.reserve(&request).await.expect("reserve with token auth").reservation.slot
}

#[tokio::test]
async fn token_authentication_on_one_node_re_authenticates_on_schedule() {
    let server = RedisServer::start(&["--requirepass", "t0ken"]);
    let (settings, tokens) = token_settings(server.url(), false, "t0ken", Duration::from_millis(200));
    let connection = AnyConnection::connect(&settings).await.expect("AUTH with the token");
    assert_eq!(reserve_once(connection.clone(), "a").await, 0);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(reserve_once(connection, "b").await, 0, "still authenticated after re-authenticating");
    assert!(tokens.asked.load(Ordering::SeqCst) >= 3, "asked {} times", tokens.asked.load(Ordering::SeqCst));

    let (wrong, _) = token_settings(server.url(), false, "stale", Duration::from_secs(60));
    let refused = match AnyConnection::connect(&wrong).await {
        Err(_) => true,
        Ok(connection) => {
            let store = RedisStore::new(connection, "x");
            let limits = [Limit::new(1, 1_000, Window::Fixed(Placement::Start)).unwrap()];
            let request =
                SlotRequest::new("r", "k", ReserveRequest { max_delay: 0, ..ReserveRequest::new("m", &limits, 0) })
                    .at(0);
            store.reserve(&request).await.is_err()
        }
    };
    assert!(refused, "a wrong token must not get in");
}

#[tokio::test]
async fn token_authentication_on_a_cluster() {
    let cluster = RedisCluster::start_with_password("clust3r");
    let (settings, tokens) = token_settings(cluster.urls()[0].clone(), true, "clust3r", Duration::from_secs(60));
    let connection = AnyConnection::connect(&settings).await.expect("cluster AUTH with the token");
    for id in ["a", "b", "c"] {
        assert_eq!(reserve_once(connection.clone(), id).await, 0);
    }
    assert!(tokens.asked.load(Ordering::SeqCst) >= 1);
}
