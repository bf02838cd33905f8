//! Real Redis servers for tests: the shared one `./run test` starts (`DRIP_TEST_REDIS_URL`), and
//! private servers or a 3-master cluster on free loopback ports, stopped when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Redis every test shares, isolated by key names.
pub fn shared_url() -> String {
    std::env::var("DRIP_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

pub async fn shared_connection() -> redis::aio::MultiplexedConnection {
    let url = shared_url();
    let client = redis::Client::open(url.as_str()).expect("valid DRIP_TEST_REDIS_URL");
    client.get_multiplexed_async_connection().await.unwrap_or_else(|e| {
        panic!("no Redis at {url} ({e}); run the suite with ./run test, or set DRIP_TEST_REDIS_URL")
    })
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

/// A free port for a cluster node: Redis Cluster talks to its peers on the port 10,000 higher,
/// so it must be at most 55,535 and that port free too (an ephemeral port often is above).
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A `redis-server` child process on 127.0.0.1.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: PathBuf,
    /// `--requirepass`, when the server was started with one.
    password: Option<String>,
}

impl RedisServer {
    pub fn start(extra_args: &[&str]) -> Self {
        let cluster = extra_args.windows(2).any(|pair| pair == ["--cluster-enabled", "yes"]);
        let port = if cluster { free_cluster_port() } else { free_port() };
        let dir = std::env::temp_dir().join(format!("drip-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let child = Self::spawn(port, &dir, extra_args);
        let password = extra_args
            .iter()
            .position(|a| *a == "--requirepass")
            .and_then(|i| extra_args.get(i + 1))
            .map(|p| p.to_string());
        let server = Self { child, port, dir, password };
        server.wait_until(|| server.cli(&["PING"]).is_some_and(|out| out.trim() == "PONG"), "PING");
        server
    }

    fn spawn(port: u16, dir: &std::path::Path, extra_args: &[&str]) -> Child {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", dir.to_str().expect("utf-8 temp dir")])
            .args(extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server on PATH (./run test installs it)")
    }

    /// Stops the server (its data is gone: it keeps nothing on disk).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(self.port, &self.dir, &[]);
        self.wait_until(|| self.cli(&["PING"]).is_some_and(|out| out.trim() == "PONG"), "PING");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Runs `redis-cli` against this server; `None` when it fails.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let mut command = Command::new("redis-cli");
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(password) = &self.password {
            command.args(["-a", password, "--no-auth-warning"]);
        }
        let out = command.args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn wait_until(&self, ready: impl Fn() -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(Instant::now() < deadline, "redis on port {} never answered {what}", self.port);
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three masters, no replicas, all slots assigned: the shape of Memorystore for Redis Cluster.
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Every node requires `password` (as Memorystore for Redis Cluster requires a token).
    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(&["--requirepass", password, "--masterauth", password])
    }

    fn start_with(extra_args: &[&str]) -> Self {
        let mut args = vec!["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];
        args.extend_from_slice(extra_args);
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start(&args)).collect();
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        nodes[0].cli(&args).expect("redis-cli --cluster create");
        for node in &nodes {
            node.wait_until(
                || node.cli(&["CLUSTER", "INFO"]).is_some_and(|i| i.contains("cluster_state:ok")),
                "cluster_state:ok",
            );
        }
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
