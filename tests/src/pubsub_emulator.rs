//! Google's Pub/Sub emulator for tests: the shared one `./run test` starts
//! (`DRIP_TEST_PUBSUB_EMULATOR_HOST`) or a private one a test owns (and may stop and restart),
//! and the REST calls tests make to it: topics, subscriptions, publish, pull.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pubsub_emulator_client::EmulatorClient;
pub use pubsub_emulator_client::Pulled;

use crate::redis_server::free_port;

/// Where Debian's Cloud SDK package puts the emulator; `./run` exports `DRIP_PUBSUB_EMULATOR_BIN`
/// with the one it found through `gcloud info` on other systems.
pub const EMULATOR: &str = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// The emulator to start: `DRIP_PUBSUB_EMULATOR_BIN`, else Debian's path.
pub fn emulator_bin() -> String {
    std::env::var("DRIP_PUBSUB_EMULATOR_BIN").ok().filter(|bin| !bin.is_empty()).unwrap_or_else(|| EMULATOR.into())
}
pub const PROJECT: &str = "drip-test";

#[derive(Debug)]
pub struct PubsubEmulator {
    child: Option<Child>,
    pub port: u16,
}

impl PubsubEmulator {
    pub fn start() -> Self {
        let mut emulator = Self { child: None, port: free_port() };
        emulator.restart();
        emulator
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// (Re)starts it on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new(emulator_bin())
            .args(["--host=127.0.0.1", &format!("--port={}", self.port)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("the Pub/Sub emulator of the Cloud SDK");
        self.child = Some(child);
        // The JVM takes seconds to start, and minutes on a loaded 2-core machine.
        let deadline = Instant::now() + Duration::from_secs(180);
        while !answers_ok(self.port) {
            assert!(Instant::now() < deadline, "the Pub/Sub emulator on port {} never answered", self.port);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The emulator is ready when `GET /` answers `Ok`.
fn answers_ok(port: u16) -> bool {
    crate::get_ok(port, "/").is_some_and(|body| body.trim_end() == "Ok")
}

impl Drop for PubsubEmulator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The emulator a test talks to: the shared one, or one of its own. Its REST calls panic on
/// failure, as a test wants.
#[derive(Debug)]
pub struct Pubsub {
    pub host: String,
    client: EmulatorClient,
    _owned: Option<PubsubEmulator>,
}

impl Pubsub {
    pub fn shared() -> Self {
        match std::env::var("DRIP_TEST_PUBSUB_EMULATOR_HOST") {
            Ok(host) => Self { client: EmulatorClient::new(host.clone(), PROJECT), host, _owned: None },
            Err(_) => Self::own(PubsubEmulator::start()),
        }
    }

    /// A client of an emulator the test holds apart (to stop and restart it while this client is
    /// borrowed elsewhere).
    pub fn at(host: String) -> Self {
        Self { client: EmulatorClient::new(host.clone(), PROJECT), host, _owned: None }
    }

    pub fn own(emulator: PubsubEmulator) -> Self {
        Self { host: emulator.host(), client: EmulatorClient::new(emulator.host(), PROJECT), _owned: Some(emulator) }
    }

    pub fn emulator(&mut self) -> Option<&mut PubsubEmulator> {
        self._owned.as_mut()
    }

    pub async fn create_topic(&self, topic: &str) {
        self.client.create_topic(topic).await.expect("create topic");
    }

    pub async fn create_subscription(&self, subscription: &str, topic: &str, push_endpoint: Option<&str>) {
        self.client.create_subscription(subscription, topic, push_endpoint).await.expect("create subscription");
    }

    pub async fn topic_with_subscription(&self, topic: &str) {
        self.client.topic_with_subscription(topic).await.expect("create topic and subscription");
    }

    pub async fn publish(&self, topic: &str, data: &[u8], attributes: &BTreeMap<String, String>) -> String {
        self.client.publish(topic, data, attributes).await.expect("publish")
    }

    pub async fn pull(&self, subscription: &str, max: usize) -> Vec<Pulled> {
        self.client.pull(subscription, max).await.expect("pull")
    }

    pub async fn pull_until(&self, subscription: &str, count: usize, timeout: Duration) -> Vec<Pulled> {
        self.client.pull_until(subscription, count, timeout).await.expect("pull")
    }
}
