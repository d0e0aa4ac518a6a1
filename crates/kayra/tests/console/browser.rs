//! A headless Debian `chromium` driven through `chromedriver` (WebDriver),
//! one private driver per test on a free loopback port, with a throwaway
//! profile. Nothing is downloaded: when the driver is missing,
//! `scripts/setup.sh` installs Debian's packages, and a failure is loud.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use kayra_testkit::{WAIT, free_port};
use serde_json::{Value, json};

const DRIVER: &str = "/usr/bin/chromedriver";
/// `/usr/bin/chromium` is a wrapper script; the driver wants the binary.
const CHROMIUM: [&str; 2] = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"];

pub struct Browser {
    pub client: Client,
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// Ends the session (chromedriver then closes chromium), and kills the
    /// driver's whole process group: a chromium left behind would keep its
    /// page's watch streams reconnecting to a port that a later test may
    /// be listening on.
    fn drop(&mut self) {
        use std::io::{Read as _, Write as _};
        let request = format!(
            "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.session, self.port
        );
        if let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = conn.write_all(request.as_bytes());
            let _ = conn.read(&mut [0; 512]);
        }
        kill_group_of(&mut self.driver);
    }
}

/// Kills a driver's whole process group (it and the chromium it started).
fn kill_group_of(driver: &mut Child) {
    if let Ok(pid) = i32::try_from(driver.id()) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = driver.kill();
    let _ = driver.wait();
}

fn kill_group(mut driver: Child) {
    kill_group_of(&mut driver);
}

fn ensure_installed() -> PathBuf {
    if !Path::new(DRIVER).exists() || !CHROMIUM.iter().any(|p| Path::new(p).exists()) {
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/setup.sh");
        let status = Command::new("bash").arg(&setup).status().expect("run scripts/setup.sh");
        assert!(status.success(), "scripts/setup.sh failed ({status}); install chromium and chromium-driver");
    }
    assert!(Path::new(DRIVER).exists(), "{DRIVER} is missing after scripts/setup.sh");
    CHROMIUM.iter().map(PathBuf::from).find(|p| p.exists()).expect("chromium is missing after scripts/setup.sh")
}

/// How many times a browser is started before its test fails: a free port
/// another test's server took before chromedriver bound it, or a driver
/// that answered before it was ready, is a failed start, not a failed test.
const STARTS: usize = 3;

impl Browser {
    /// A fresh browser at 1280×900.
    pub async fn start() -> Browser {
        let chromium = ensure_installed();
        for attempt in 1..=STARTS {
            match Self::try_start(&chromium).await {
                Ok(browser) => return browser,
                Err(e) if attempt < STARTS => eprintln!("starting chromium failed ({e}); starting it again"),
                Err(e) => panic!("start a chromium session: {e} ({STARTS} attempts)"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    async fn try_start(chromium: &Path) -> Result<Browser, String> {
        let port = free_port();
        let driver = Command::new(DRIVER)
            .arg(format!("--port={port}"))
            // Its own process group, with the chromium it starts: killed whole on drop.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen on {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let profile = tempfile::tempdir().expect("profile dir");
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--no-first-run".into(),
            "--window-size=1280,900".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({
            "goog:chromeOptions": {"binary": chromium, "args": args},
            // The network log: every request the page makes, with its URL and headers.
            "goog:loggingPrefs": {"performance": "ALL", "browser": "ALL"},
        });
        let Value::Object(capabilities) = capabilities else { unreachable!() };
        let connected = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await;
        let session = match &connected {
            Ok(client) => client.session_id().await.ok().flatten(),
            Err(_) => None,
        };
        match (connected, session) {
            (Ok(client), Some(session)) => Ok(Browser { client, driver, port, session, _profile: profile }),
            (connected, _) => {
                kill_group(driver);
                Err(connected.err().map_or_else(|| "no session id".to_string(), |e| e.to_string()))
            }
        }
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub async fn js(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Waits until `script` returns `true`, naming `what` on timeout, and
    /// showing what the page said last.
    pub async fn until(&self, what: &str, script: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.js(script).await == Value::Bool(true) {
                return;
            }
            if Instant::now() > deadline {
                let text = self.js("return document.body.innerText").await;
                panic!("timed out waiting for {what}; the page says:\n{}", text.as_str().unwrap_or(""));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until the first element matching `css` holds exactly `text`
    /// (as `textContent`: markup in it shows as text, not as elements).
    pub async fn until_text(&self, what: &str, css: &str, text: &str) {
        let script = format!(
            "const e = document.querySelector({}); return !!e && e.textContent === {}",
            serde_json::to_string(css).unwrap(),
            serde_json::to_string(text).unwrap()
        );
        self.until(what, &script).await;
    }

    /// The rendered text of the first element matching `css`, read in one
    /// script (the page may replace the element between two WebDriver calls).
    pub async fn text(&self, css: &str) -> String {
        let script = format!(
            "const e = document.querySelector({}); return e ? e.innerText : null",
            serde_json::to_string(css).unwrap()
        );
        match self.js(&script).await {
            Value::String(text) => text,
            _ => panic!("no element matches {css}"),
        }
    }

    /// Runs `script` in every document this tab loads from now on, before
    /// the page's own scripts (DevTools `Page.addScriptToEvaluateOnNewDocument`).
    pub async fn on_new_document(&self, script: &str) {
        let url = format!("http://127.0.0.1:{}/session/{}/goog/cdp/execute", self.port, self.session);
        let params = json!({"cmd": "Page.addScriptToEvaluateOnNewDocument", "params": {"source": script}});
        let response = reqwest::Client::new().post(url).json(&params).send().await.expect("call DevTools");
        assert!(response.status().is_success(), "DevTools refused: {}", response.text().await.unwrap_or_default());
    }

    /// Whether a JavaScript dialog (alert/confirm/prompt) is open.
    pub async fn dialog_open(&self) -> bool {
        self.client.get_alert_text().await.is_ok()
    }

    /// Entries of chromedriver's log of `kind` (`performance`, `browser`)
    /// since the last call: each a JSON object, for `performance` one
    /// DevTools event (`message.method`, `message.params`).
    pub async fn log(&self, kind: &str) -> Vec<Value> {
        let url = format!("http://127.0.0.1:{}/session/{}/se/log", self.port, self.session);
        let reply: Value = reqwest::Client::new()
            .post(url)
            .json(&json!({"type": kind}))
            .send()
            .await
            .expect("read the browser log")
            .json()
            .await
            .expect("the log is JSON");
        let entries = reply["value"].as_array().cloned().unwrap_or_default();
        entries
            .into_iter()
            .map(|e| match kind {
                "performance" => serde_json::from_str(e["message"].as_str().unwrap_or("{}")).unwrap_or(Value::Null),
                _ => e,
            })
            .collect()
    }

    /// Panics on any script error or Content-Security-Policy violation the
    /// browser reported since the last call: the console must run under
    /// its own policy without a single refusal.
    pub async fn assert_no_script_errors(&self) {
        for entry in self.log("browser").await {
            let text = entry["message"].as_str().unwrap_or("");
            assert!(
                !text.contains("Content Security Policy") && !text.contains("Uncaught"),
                "the browser reported: {text}"
            );
        }
    }

    /// Every request the page sent since the last call: (URL, headers).
    pub async fn requests(&self) -> Vec<(String, Value)> {
        self.log("performance")
            .await
            .into_iter()
            .filter(|e| e["message"]["method"] == "Network.requestWillBeSent")
            .map(|e| {
                let request = &e["message"]["params"]["request"];
                (request["url"].as_str().unwrap_or("").to_string(), request["headers"].clone())
            })
            .collect()
    }
}
