//! A Redis that serves TLS only, with a password, and a certificate signed by a CA of the test's
//! own (Memorystore's in-transit encryption and AUTH), made with `openssl`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_server::free_port;
use crate::unique;

/// The password every `TlsRedis` requires.
pub const PASSWORD: &str = "s3cret";

/// Its directory holds `ca.pem` (the CA that signed it) and `other.pem` (a CA that signed nothing).
#[derive(Debug)]
pub struct TlsRedis {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl {args:?}");
}

/// A self-signed CA: `<name>.key` and `<name>.pem`.
fn certificate_authority(dir: &Path, name: &str) {
    let (key, pem, subject) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN={name}"));
    let args = [
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", &subject, "-keyout", &key, "-out", &pem,
    ];
    openssl(dir, &args);
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and a second CA that signed nothing.
fn certificates(dir: &Path) {
    certificate_authority(dir, "ca");
    certificate_authority(dir, "other");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let sign =
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1"];
    openssl(dir, &[&sign[..], &["-extfile", "san.ext", "-out", "server.pem"]].concat());
}

pub fn start() -> TlsRedis {
    let dir = std::env::temp_dir().join(unique("redis-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    certificates(&dir);
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args([
            "--tls-cert-file",
            "server.pem",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.pem",
            "--tls-auth-clients",
            "no",
        ])
        .args(["--requirepass", PASSWORD, "--dir", dir.to_str().unwrap()])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "TLS redis never listened");
        std::thread::sleep(Duration::from_millis(25));
    }
    TlsRedis { child, port, dir }
}
