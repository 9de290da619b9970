//! A headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`): the
//! page tests load pages the daemon serves, read the DOM the page's script built, and take
//! screenshots. Skipped with a notice when the browser is missing, required under
//! `MAINTD_REQUIRE_BROWSER=1` (scripts/test).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver leads a process group of its own, the browser's processes included.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// A fresh headless browser with a window of `width`×`height`, or None (with a notice) when
    /// Chromium or its driver is not installed.
    pub async fn start(width: u32, height: u32) -> Option<Browser> {
        let need = "MAINTD_REQUIRE_BROWSER";
        if !(super::have_tool("chromium", need) && super::have_tool("chromedriver", need)) {
            return None;
        }
        let port = super::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().unwrap();
        let mut b = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http: maintd::http::client_builder().build().unwrap(),
            _profile: profile,
        };
        let deadline = Instant::now() + super::WAIT;
        while b
            .http
            .get(format!("{}/status", b.base))
            .send()
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "chromedriver never answered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Without the networking flags Chromium keeps calling out to Google's hosts, which this
        // closed network refuses; root needs --no-sandbox.
        let args = json!([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            format!("--user-data-dir={}", b._profile.path().display()),
            format!("--window-size={width},{height}"),
        ]);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
        }}});
        let v = b.call("POST", "/session", caps).await;
        b.session = v["sessionId"].as_str().expect("a session id").to_string();
        Some(b)
    }

    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "POST" => self.http.post(url).json(&body),
            "DELETE" => self.http.delete(url),
            _ => self.http.get(url),
        };
        let resp = req
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status();
        let v: Value = resp.json().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {status} {v:#}");
        v["value"].clone()
    }

    fn at(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", &self.at("/url"), json!({ "url": url }))
            .await;
    }

    /// Runs `body` (a function body; `return` gives the value) in the page.
    pub async fn eval(&self, body: &str) -> Value {
        self.call(
            "POST",
            &self.at("/execute/sync"),
            json!({"script": body, "args": []}),
        )
        .await
    }

    /// Waits until `body` returns something other than null, false or undefined.
    pub async fn wait_until(&self, what: &str, body: &str) -> Value {
        let deadline = Instant::now() + super::WAIT;
        loop {
            let v = self.eval(body).await;
            if !(v.is_null() || v == Value::Bool(false)) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.call(
            "POST",
            &self.at("/window/rect"),
            json!({"width": width, "height": height}),
        )
        .await;
    }

    /// Saves a PNG of the viewport.
    pub async fn screenshot(&self, path: &Path) {
        let v = self.call("GET", &self.at("/screenshot"), Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64"))
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}
