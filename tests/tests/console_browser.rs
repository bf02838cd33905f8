//! The console in a real browser (headless Chromium through chromedriver, Debian's `chromium` and
//! `chromium-driver`): an operator opens a key with a backlog, pauses it through the form and its
//! confirmation, sees the pause, resumes it and sees the backlog again. Screenshots of each page
//! go to `target/console/`. Without Chromium the test says it was skipped, unless
//! `DRIP_BROWSER_TEST=required` (`./run test` on Debian, which installs it): then it fails.

#[path = "support/console.rs"]
mod console;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};

/// chromedriver and the Chromium it drives, where Debian puts them.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let found = |names: &[&str]| {
        names.iter().map(PathBuf::from).find(|p| p.exists()).or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path).flat_map(|dir| names.iter().map(move |n| dir.join(n))).find(|p| p.exists())
        })
    };
    let driver = found(&["/usr/bin/chromedriver", "chromedriver"])?;
    let chromium = found(&["/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"])?;
    Some((driver, chromium))
}

/// chromedriver in a process group of its own, with the Chromium it starts: dropped (the test
/// ended, or failed before closing its session), the whole group is stopped, so no browser is
/// left running.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn open_browser(driver: &std::path::Path, chromium: &std::path::Path) -> (Driver, Client) {
    let port = drip_tests::redis_server::free_port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver(child);
    let capabilities = serde_json::json!({
        "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"],
        }
    });
    let serde_json::Value::Object(capabilities) = capabilities else { unreachable!() };
    for _ in 0..100 {
        let builder = ClientBuilder::rustls()
            .expect("a TLS client")
            .capabilities(capabilities.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await;
        if let Ok(client) = builder {
            return (driver, client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver on port {port} opened no session");
}

fn screenshots() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // A relative CARGO_TARGET_DIR is the workspace's, not this test's working directory.
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), |dir| workspace.join(dir));
    let dir = target.join("console");
    std::fs::create_dir_all(&dir).expect("target/console");
    dir
}

async fn save(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    std::fs::write(screenshots().join(format!("{name}.png")), png).expect("the screenshot is saved");
}

/// The text of the element, once the page that has it has loaded.
async fn text(client: &Client, css: &str) -> String {
    let wait = client.wait().at_most(Duration::from_secs(10));
    wait.for_element(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}")).text().await.unwrap()
}

/// Clicks the element, then waits for the page the click opens to have `then`.
async fn click(client: &Client, css: &str, then: &str) {
    client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}")).click().await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(then))
        .await
        .unwrap_or_else(|e| panic!("after clicking {css}, no {then}: {e}"));
}

async fn type_into(client: &Client, css: &str, value: &str) {
    let field = client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
    field.clear().await.unwrap();
    field.send_keys(value).await.unwrap();
}

#[tokio::test]
async fn an_operator_pauses_and_resumes_a_key_in_a_browser() {
    let Some((driver, chromium)) = browser() else {
        if std::env::var("DRIP_BROWSER_TEST").as_deref() == Ok("required") {
            panic!("DRIP_BROWSER_TEST=required, but chromium and chromedriver are not installed");
        }
        eprintln!(
            "SKIPPED: the console's browser test needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)"
        );
        return;
    };
    let c = console::start(|_| {}).await;
    for merchant in [11, 12, 13] {
        c.backlog(merchant).await;
    }
    for user in [1, 2] {
        c.checks(user).await;
    }
    let (_driver, client) = open_browser(&driver, &chromium).await;
    let base = &c.limiter.url;

    client.goto(&format!("{base}/console")).await.unwrap();
    save(&client, "overview").await;
    client.goto(&format!("{base}/console/rules/{}", c.rule)).await.unwrap();
    assert_eq!(client.find_all(Locator::Css("#keys tbody tr")).await.unwrap().len(), 3);
    save(&client, "rule").await;

    client.goto(&format!("{base}{}", c.key_path(12))).await.unwrap();
    assert_eq!(text(&client, "#verdict").await, "backlogged");
    assert_eq!(text(&client, "#backlog").await, "1");
    save(&client, "key").await;

    type_into(&client, "#pause-form input[name=for]", "10m").await;
    type_into(&client, "#pause-form input[name=reason]", "partner maintenance").await;
    click(&client, "#pause", "#question").await;
    assert!(text(&client, "#question").await.starts_with("Pause merchant_12 of"), "a confirmation first");
    assert!(c.inspect(12).await["pausedUntil"].is_null(), "nothing is done before it");
    save(&client, "confirm").await;
    click(&client, "#confirm", "#message").await;
    let until = c.inspect(12).await["pausedUntil"].as_str().expect("paused after the confirmation").to_owned();
    assert!(text(&client, "#message").await.contains(&format!("paused key until {until}")));
    click(&client, "#back", "#verdict").await;
    assert_eq!(text(&client, "#verdict").await, "paused");
    assert_eq!(text(&client, "#paused").await, format!("until {until}"));
    assert!(text(&client, "#history").await.contains("partner maintenance"));
    save(&client, "key-paused").await;

    click(&client, "#resume", "#question").await;
    click(&client, "#confirm", "#message").await;
    assert!(text(&client, "#message").await.contains("lifted the pause"));
    click(&client, "#back", "#verdict").await;
    assert_eq!(text(&client, "#verdict").await, "backlogged");
    assert!(c.inspect(12).await["pausedUntil"].is_null());
    client.close().await.unwrap();
}
