//! The web console (platform §11) in a real browser: Debian's headless
//! chromium driven through chromedriver, against real `kayra serve` and
//! `kayra reconciler` processes and a recording backend.
//!
//! Each test function has its own processes and browser session and walks
//! through several behaviours in it, so the suite stays fast.

#[path = "console/browser.rs"]
mod browser;
#[path = "console/world.rs"]
mod world;

use browser::Browser;
use fantoccini::Locator;
use kayra_catalog::repo::RecordRef;
use kayra_core::{ApiRegistration, Namespace, Run, RunResult, RunStep, RunTrigger, Subscription};
use reqwest::Method;
use serde_json::{Value, json};
use world::{ADMIN, Backend, World};

const COMPUTE: &str = "compute.example.com";
const STORAGE: &str = "storage.example.com";
const NETWORK: &str = "network.example.com";
const HOSTILE_SCRIPT: &str = "<script>window.__pwned = 1</script>";
const HOSTILE_IMG: &str = "<img src=x onerror=alert(1)>";

/// A JavaScript string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// With `KAYRA_CONSOLE_SHOTS` naming a directory, saves a screenshot of
/// the page as `<dir>/<name>.png` (to look at the pages while changing them).
async fn shot(b: &Browser, name: &str) {
    if let Ok(dir) = std::env::var("KAYRA_CONSOLE_SHOTS") {
        let path = std::path::Path::new(&dir).join(format!("{name}.png"));
        std::fs::write(&path, b.client.screenshot().await.unwrap()).unwrap();
    }
}

/// Types `token` into the sign-in form and submits it.
async fn submit_token(b: &Browser, token: &str) {
    b.until("the sign-in form", "return !document.getElementById('signin').hidden").await;
    let input = b.client.find(Locator::Css("input#token[type=password]")).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(token).await.unwrap();
    b.client.find(Locator::Css("#signin-form button[type=submit]")).await.unwrap().click().await.unwrap();
}

/// The "S/T synced, F failed, P pending" text of `api`'s row on the APIs page.
fn counts_are(api: &str, text: &str) -> String {
    format!(
        "const c = document.querySelector('#apis tr[data-key={api}] .counts'); return !!c && c.textContent === {text}",
        api = lit(api),
        text = lit(text)
    )
}

async fn progress_of(b: &Browser, api: &str) -> (String, String) {
    let v = b
        .js(&format!(
            "const p = document.querySelector('#apis tr[data-key={}] progress'); return [p.getAttribute('value'), p.getAttribute('max')]",
            lit(api)
        ))
        .await;
    (v[0].as_str().unwrap().to_string(), v[1].as_str().unwrap().to_string())
}

/// Three APIs: `compute` (held by the backend until released) to five
/// namespaces, `storage` (succeeds) to two, `network` (fails) to one.
async fn seed_fleet(w: &World) {
    w.namespace("core", HOSTILE_SCRIPT).await;
    for ns in ["team-a", "team-b", "team-c", "team-d"] {
        w.namespace(ns, "").await;
    }
    w.registration(COMPUTE, json!({"short_name": "compute", "mode": "hold", "description": HOSTILE_IMG})).await;
    w.registration(STORAGE, json!({"short_name": "storage", "mode": "ok", "description": "object storage"})).await;
    w.registration(NETWORK, json!({"mode": "fail"})).await;
    for ns in ["core", "team-a", "team-b", "team-c", "team-d"] {
        w.subscribe(ns, COMPUTE).await;
    }
    w.subscribe("core", STORAGE).await;
    w.subscribe("team-a", STORAGE).await;
    w.subscribe("team-b", NETWORK).await;
}

/// Signs in, follows a fan-out live through a SyncID bump, renders hostile
/// descriptions as text, navigates every page by its links, and keeps the
/// token out of every URL and every store but sessionStorage. Writes
/// `docs/console.png` mid-fan-out when `KAYRA_CONSOLE_SCREENSHOT` names a path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_follows_a_fan_out_live_and_renders_hostile_text_as_text() {
    fan_out(Backend::Local).await;
}

/// The same on etcd: the streams the page follows come from the other
/// backend's watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_follows_a_fan_out_live_on_etcd() {
    fan_out(Backend::Etcd).await;
}

async fn fan_out(backend: Backend) {
    let mut w = World::start_on(backend, true).await;
    seed_fleet(&w).await;
    let b = Browser::start().await;
    b.client.goto(&w.ui("")).await.unwrap();

    // A wrong token is refused with the server's message; nothing is kept.
    submit_token(&b, "not-a-real-token").await;
    b.until("the refusal", "return document.getElementById('signin-error').textContent !== ''").await;
    assert_eq!(b.text("#signin-error").await, w.refusal("not-a-real-token").await);
    assert_eq!(b.js("return document.getElementById('signin').hidden").await, false);
    assert_eq!(b.js("return sessionStorage.length").await, 0);

    // The admin token signs in and lands on #/apis.
    submit_token(&b, ADMIN).await;
    b.until("the APIs page", "return document.querySelectorAll('#apis tbody tr').length === 3").await;
    assert!(b.client.current_url().await.unwrap().as_str().ends_with("/ui/#/apis"));
    assert_eq!(b.js("return document.getElementById('signin').hidden").await, true);
    b.until("the registrations stream", "return document.getElementById('live').textContent === 'live'").await;

    // Correct counts for each registration, as /status has them.
    b.until("storage synced", &counts_are(STORAGE, "2/2 synced, 0 failed, 0 pending")).await;
    b.until("network failed", &counts_are(NETWORK, "0/1 synced, 1 failed, 0 pending")).await;
    b.until("compute pending", &counts_are(COMPUTE, "0/5 synced, 0 failed, 5 pending")).await;
    assert_eq!(progress_of(&b, COMPUTE).await, ("0".into(), "5".into()));
    let status = w.status(STORAGE).await;
    assert_eq!((status["total"].as_u64(), status["synced"].as_u64()), (Some(2), Some(2)));

    // Hostile descriptions are text: no element made of them, no script ran.
    let description =
        format!("return document.querySelector('#apis tr[data-key={}] td.description').textContent", lit(COMPUTE));
    assert_eq!(b.js(&description).await, HOSTILE_IMG);
    assert_eq!(b.js("return document.querySelectorAll('#view img, #view script').length").await, 0);
    assert!(!b.dialog_open().await, "a dialog opened");

    // A marker that a reload would wipe: everything below happens live.
    b.js("window.__samePage = 'yes'; return true").await;
    w.backend.release(5);
    b.until("compute synced", &counts_are(COMPUTE, "5/5 synced, 0 failed, 0 pending")).await;
    assert_eq!(progress_of(&b, COMPUTE).await, ("5".into(), "5".into()));

    // Bump the SyncID through the API: the bar drops, then climbs as the
    // backend lets subscribers through, without a reload, following the
    // status stream rather than polling.
    let mut requests = b.requests().await;
    let bumped = w.call(Method::PUT, &format!("/apiregistrations/{COMPUTE}/sync"), Some(json!({})), 200).await;
    let sync_id = bumped["sync_id"].as_str().unwrap().to_string();
    b.until(
        "the new sync_id on the page",
        &format!(
            "const r = document.querySelector('#apis tr[data-key={}]'); return !!r && r.cells[3].textContent === {}",
            lit(COMPUTE),
            lit(&sync_id)
        ),
    )
    .await;
    b.until("compute pending again", &counts_are(COMPUTE, "0/5 synced, 0 failed, 5 pending")).await;
    w.backend.release(2);
    b.until("two synced", &counts_are(COMPUTE, "2/5 synced, 0 failed, 3 pending")).await;
    assert_eq!(progress_of(&b, COMPUTE).await, ("2".into(), "5".into()));
    let screenshot = std::env::var("KAYRA_CONSOLE_SCREENSHOT").ok().filter(|_| backend == Backend::Local);
    if let Some(path) = screenshot {
        std::fs::write(&path, b.client.screenshot().await.unwrap()).unwrap();
        eprintln!("console screenshot written to {path}");
    }
    w.backend.release(3);
    b.until("all synced", &counts_are(COMPUTE, "5/5 synced, 0 failed, 0 pending")).await;
    let during = b.requests().await;
    // The fleet reads each API's counts alone (§16): never every subscriber.
    let status_path = format!("/apiregistrations/{COMPUTE}/status");
    let counts_path = format!("{status_path}?limit=1");
    let urls: Vec<&str> = during.iter().map(|(url, _)| url.as_str()).collect();
    assert!(urls.iter().any(|u| u.ends_with(&format!("{counts_path}&watch=true"))), "no status stream: {urls:?}");
    let unpaged: Vec<_> = urls.iter().filter(|u| u.contains(&status_path) && !u.contains("limit=1")).collect();
    assert!(unpaged.is_empty(), "status read for more than its counts: {unpaged:?}");
    // At most the poll that may have been under way at the bump, and the
    // one that takes over when the fan-out has settled.
    let polls = urls.iter().filter(|u| u.ends_with(&counts_path)).count();
    assert!(polls <= 2, "the fan-out's status was polled {polls} times: {urls:?}");
    requests.extend(during);
    assert_eq!(b.js("return window.__samePage").await, "yes", "the page was reloaded");

    // Keyboard only: Tab walks the navigation, the sort buttons and every
    // name link, and Enter on a sort button sorts.
    b.js("document.activeElement.blur(); window.focus(); return true").await;
    let mut reached = Vec::new();
    for _ in 0..20 {
        b.client.active_element().await.unwrap().send_keys("\u{E004}").await.unwrap(); // Tab
        let focused = b.js("const e = document.activeElement; return `${e.tagName} ${e.textContent.trim()}`").await;
        reached.push(focused.as_str().unwrap().to_string());
    }
    for expected in [
        "A APIs",
        "A Namespaces",
        "BUTTON Name",
        "BUTTON Subscribers",
        &format!("A {COMPUTE}"),
        &format!("A {STORAGE}"),
    ] {
        assert!(reached.iter().any(|r| r == expected), "Tab never reached {expected:?}: {reached:?}");
    }

    // Sorting by progress puts the failing API first.
    let sort = "[...document.querySelectorAll('#apis th button')].find(b => b.textContent === 'Subscribers').focus()";
    b.js(&format!("{sort}; return true")).await;
    b.client.active_element().await.unwrap().send_keys("\u{E006}").await.unwrap(); // Enter
    b.until(
        "sorted by progress",
        &format!("return document.querySelector('#apis tbody tr').dataset.key === {}", lit(NETWORK)),
    )
    .await;

    // One API: its subscribers, filterable by state, each linking to its subscription.
    b.client.find(Locator::LinkText(NETWORK)).await.unwrap().click().await.unwrap();
    b.until("the network page", "return document.querySelectorAll('#subscribers tbody tr').length === 1").await;
    assert!(b.client.current_url().await.unwrap().as_str().ends_with(&format!("#/apis/{NETWORK}")));
    assert_eq!(b.text("#subscribers tbody tr td:nth-child(3)").await, "error");
    let filter = b.client.find(Locator::Css("select#state-filter")).await.unwrap();
    assert_eq!(b.text("label[for=state-filter]").await, "State");
    filter.select_by_value("synced").await.unwrap();
    b.until("filtered out", "return document.querySelectorAll('#subscribers tbody tr').length === 0").await;
    filter.select_by_value("failed").await.unwrap();
    b.until("filtered in", "return document.querySelectorAll('#subscribers tbody tr').length === 1").await;
    b.client.find(Locator::LinkText("team-b")).await.unwrap().click().await.unwrap();
    b.until("the subscription page", "return !!document.querySelector('dl.fields')").await;
    assert!(
        b.client
            .current_url()
            .await
            .unwrap()
            .as_str()
            .ends_with(&format!("#/namespaces/team-b/subscriptions/{NETWORK}"))
    );
    shot(&b, "subscription-failed").await;
    let fields = b.text("dl.fields").await;
    for expected in ["team-b", NETWORK, "error"] {
        assert!(fields.contains(expected), "{expected} missing from {fields}");
    }

    // Namespaces: every page has the nav links; hostile text stays text.
    b.client.find(Locator::LinkText("Namespaces")).await.unwrap().click().await.unwrap();
    b.until("the namespaces page", "return document.querySelectorAll('#namespaces tbody tr').length === 5").await;
    b.until(
        "core's APIs",
        &format!(
            "const r = document.querySelector('#namespaces tr[data-key=core]'); return !!r && r.cells[3].textContent === {}",
            lit(&format!("{COMPUTE}{STORAGE}"))
        ),
    )
    .await;
    let core = b.js("return document.querySelector('#namespaces tr[data-key=core]').cells[1].textContent").await;
    assert_eq!(core, HOSTILE_SCRIPT);
    assert_eq!(b.js("return window.__pwned === undefined").await, true, "a description ran as script");
    assert_eq!(b.js("return document.querySelectorAll('#view img, #view script').length").await, 0);
    shot(&b, "namespaces").await;
    b.client.find(Locator::LinkText("core")).await.unwrap().click().await.unwrap();
    b.until("core's subscriptions", "return document.querySelectorAll('#subscriptions tbody tr').length === 2").await;
    // The namespace's fields come from a request of their own, which may
    // answer after the subscriptions'.
    b.until_text("core's description, as text", "dl.fields dd:nth-of-type(2)", HOSTILE_SCRIPT).await;
    b.client.find(Locator::LinkText("APIs")).await.unwrap().click().await.unwrap();
    b.until("back on APIs", "return document.querySelectorAll('#apis tbody tr').length === 3").await;
    assert!(!b.dialog_open().await, "a dialog opened");

    // The server goes away and comes back: the stream reconnects (with
    // back-off) and the page carries on, still without a reload.
    w.restart_serve().await;
    w.registration("dns.example.com", json!({"mode": "ok"})).await;
    b.until("the new API after the reconnect", "return document.querySelectorAll('#apis tbody tr').length === 4").await;
    b.until("live again", "return document.getElementById('live').textContent === 'live'").await;
    assert_eq!(b.js("return window.__samePage").await, "yes", "the page was reloaded");

    // Readable on a phone: the page itself never scrolls sideways (wide
    // tables scroll inside their own region).
    b.client.set_window_size(390, 844).await.unwrap();
    b.until("narrow layout", "return document.documentElement.scrollWidth <= window.innerWidth").await;
    shot(&b, "phone-apis").await;
    b.client.set_window_size(1280, 900).await.unwrap();

    // The token: in sessionStorage only, in no URL, sent only as a bearer
    // header, and never to the console's own files.
    assert_eq!(b.js("return sessionStorage.getItem('kayra.token')").await, ADMIN);
    assert_eq!(b.js("return localStorage.length").await, 0);
    assert_eq!(b.js("return document.cookie").await, "");
    requests.extend(b.requests().await);
    assert!(requests.iter().any(|(url, _)| url.contains("/apis/catalog.example.com/v1/")), "no API call was logged");
    for (url, headers) in &requests {
        assert!(!url.contains(ADMIN), "the token is in a request URL: {url}");
        let authorization = headers.get("Authorization").and_then(Value::as_str).unwrap_or("");
        if url.contains("/ui/") {
            assert_eq!(authorization, "", "a console asset was requested with a token: {url}");
        }
        if url.contains("/apis/") && authorization.contains(ADMIN) {
            assert_eq!(authorization, format!("Bearer {ADMIN}"));
        }
    }
    let entries = b.js("return performance.getEntries().map(e => e.name).concat([location.href])").await;
    for name in entries.as_array().unwrap() {
        assert!(!name.as_str().unwrap().contains(ADMIN), "the token is in {name}");
    }
    b.assert_no_script_errors().await;
}

/// Sessions: a reload keeps the sign-in, a new tab asks again, a caller
/// without rights sees the server's 403 message where the data would be,
/// and a revoked token sends the page back to the sign-in with the
/// server's message. And every console response carries the headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_sessions_follow_the_token_and_every_response_is_locked_down() {
    let w = World::start(false).await;
    w.registration(COMPUTE, json!({})).await;
    // A user with no role: authenticated, allowed nothing.
    w.call(Method::POST, "/users", Some(json!({"name": "nobody"})), 201).await;
    let created = w.call(Method::POST, "/users/nobody/tokens", Some(json!({})), 201).await;
    let token = created["token"].as_str().unwrap().to_string();
    let token_id = created["id"].as_str().unwrap().to_string();
    let refused = w.http.get(format!("{}{}/apiregistrations", w.base, world::CATALOG)).bearer_auth(&token);
    let refused: Value = refused.send().await.unwrap().json().await.unwrap();
    assert_eq!(refused["code"], 403);
    let forbidden = refused["message"].as_str().unwrap().to_string();

    let b = Browser::start().await;
    // A deep link survives the sign-in.
    b.client.goto(&w.ui("#/apis")).await.unwrap();
    submit_token(&b, &token).await;
    b.until(
        "the 403 message",
        &format!(
            "const n = document.querySelector('#view .notice.error'); return !!n && n.textContent === {}",
            lit(&forbidden)
        ),
    )
    .await;
    assert!(b.client.current_url().await.unwrap().as_str().ends_with("/ui/#/apis"));

    // A reload keeps the session; a new tab asks again.
    b.client.refresh().await.unwrap();
    b.until("the 403 message after reload", "return !!document.querySelector('#view .notice.error')").await;
    assert_eq!(b.js("return document.getElementById('signin').hidden").await, true);
    let first = b.client.window().await.unwrap();
    let tab = b.client.new_window(true).await.unwrap();
    b.client.switch_to_window(tab.handle).await.unwrap();
    b.client.goto(&w.ui("#/namespaces")).await.unwrap();
    b.until("a sign-in in the new tab", "return !document.getElementById('signin').hidden").await;
    assert_eq!(b.js("return sessionStorage.length").await, 0);
    b.client.close_window().await.unwrap();
    b.client.switch_to_window(first).await.unwrap();

    // Revoking the token: back to the sign-in, with the server's message.
    w.call(Method::DELETE, &format!("/users/nobody/tokens/{token_id}"), None, 204).await;
    b.until("the sign-in after revocation", "return !document.getElementById('signin').hidden").await;
    assert_eq!(b.text("#signin-error").await, w.refusal(&token).await);
    assert_eq!(b.js("return sessionStorage.length").await, 0);

    // A caller who may read registrations but not their status sees the
    // server's 403 where the counts would be.
    let rules = json!([{"resources": ["apiregistrations"], "verbs": ["get", "list", "watch"]}]);
    w.call(Method::POST, "/roles", Some(json!({"name": "reader-role", "rules": rules})), 201).await;
    w.call(Method::POST, "/users", Some(json!({"name": "reader"})), 201).await;
    let binding = json!({"name": "reader-binding", "role": "reader-role", "user": "reader"});
    w.call(Method::POST, "/clusterrolebindings", Some(binding), 201).await;
    let reader = w.call(Method::POST, "/users/reader/tokens", Some(json!({})), 201).await;
    let reader = reader["token"].as_str().unwrap().to_string();
    let status =
        w.http.get(format!("{}{}/apiregistrations/{COMPUTE}/status", w.base, world::CATALOG)).bearer_auth(&reader);
    let status: Value = status.send().await.unwrap().json().await.unwrap();
    assert_eq!(status["code"], 403, "{status}");
    submit_token(&b, &reader).await;
    b.until("the status refusal in the row", &counts_are(COMPUTE, status["message"].as_str().unwrap())).await;
    b.until("the registrations stream", "return document.getElementById('live').textContent === 'live'").await;

    // Every console response the browser saw carried the headers.
    let mut seen = 0;
    for entry in b.log("performance").await {
        let message = &entry["message"];
        if message["method"] != "Network.responseReceived" {
            continue;
        }
        let response = &message["params"]["response"];
        if !response["url"].as_str().unwrap_or("").contains("/ui/") {
            continue;
        }
        seen += 1;
        let headers: serde_json::Map<String, Value> =
            response["headers"].as_object().unwrap().iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect();
        assert_eq!(headers["content-security-policy"], kayra_server::console::CONTENT_SECURITY_POLICY, "{response}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["referrer-policy"], "no-referrer");
    }
    assert!(seen >= kayra_server::console::ASSETS.len() - 1, "only {seen} console responses logged");
    b.assert_no_script_errors().await;

    // And with a plain HTTP client: every asset, the redirect and a miss.
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let mut paths: Vec<String> = kayra_server::console::ASSETS.iter().map(|a| format!("/ui/{}", a.path)).collect();
    paths.extend(["/ui".into(), "/ui/".into(), "/ui/missing.js".into()]);
    for path in paths {
        let response = no_redirects.get(format!("{}{path}", w.base)).send().await.unwrap();
        let h = response.headers();
        assert_eq!(h["content-security-policy"], kayra_server::console::CONTENT_SECURITY_POLICY, "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{path}");
        let expected = match path.as_str() {
            "/ui" => 308,
            "/ui/missing.js" => 404,
            _ => 200,
        };
        assert_eq!(response.status().as_u16(), expected, "{path}");
    }
}

/// 10,000 subscribers to one API: the page shows the first 100 (paged,
/// filterable) and its data arrives quickly on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pages_ten_thousand_subscribers() {
    const N: usize = 10_000;
    let w = World::start(false).await;
    let repo = w.repo().await;
    let reg = ApiRegistration { name: COMPUTE.into(), sync_id: "s1".into(), ..Default::default() };
    repo.create(RecordRef::Registration(COMPUTE), &reg, "registration").await.unwrap();
    let names: Vec<String> = (0..N).map(|i| format!("tenant-{i:05}")).collect();
    futures::future::join_all(names.chunks(N / 8).map(|chunk| {
        let repo = repo.clone();
        async move {
            for ns in chunk {
                let n = Namespace { name: ns.clone(), ..Default::default() };
                repo.create(RecordRef::Namespace(ns), &n, "namespace").await.unwrap();
                let mut sub = Subscription::new(ns.as_str(), COMPUTE);
                if ns.ends_with('7') {
                    sub.active = true;
                    sub.current_sync_id = "s1".into();
                }
                repo.create(RecordRef::Subscription { namespace: ns, api: COMPUTE }, &sub, "subscription")
                    .await
                    .unwrap();
            }
        }
    }))
    .await;

    let b = Browser::start().await;
    b.client.goto(&w.ui("#/apis")).await.unwrap();
    submit_token(&b, ADMIN).await;
    b.until("the counts", &counts_are(COMPUTE, "1000/10000 synced, 0 failed, 9000 pending")).await;

    // What the server spends: the report, and its stream's first document.
    let url = format!("{}{}/apiregistrations/{COMPUTE}/status", w.base, world::CATALOG);
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let body = w.http.get(&url).bearer_auth(ADMIN).send().await.unwrap().bytes().await.unwrap();
        let get = started.elapsed();
        let started = std::time::Instant::now();
        let mut stream = w.http.get(format!("{url}?watch=true")).bearer_auth(ADMIN).send().await.unwrap();
        let mut first = Vec::new();
        while !first.contains(&b'\n') {
            first.extend_from_slice(&stream.chunk().await.unwrap().expect("a first document"));
        }
        let watch = started.elapsed();
        eprintln!(
            "10,000 subscribers: GET /status {get:?} ({} bytes), its stream's first document {watch:?}",
            body.len()
        );
    }

    // A fresh load of the API's page, timed by the page's own clock: from
    // navigation start to the first render with data.
    let mut best = f64::MAX;
    for _ in 0..3 {
        b.client.goto(&w.ui(&format!("#/apis/{COMPUTE}"))).await.unwrap();
        b.client.refresh().await.unwrap();
        b.until(
            "the first page of subscribers",
            "return document.querySelectorAll('#subscribers tbody tr').length === 100",
        )
        .await;
        let ms = b.js("return performance.getEntriesByName('kayra:data')[0].startTime").await.as_f64().unwrap();
        best = best.min(ms);
        let calls = b
            .js("return performance.getEntriesByType('resource').filter(e => e.name.includes('/apis/')).map(e => `${e.name.replace(location.origin, '')} at ${Math.round(e.startTime)} ms took ${Math.round(e.duration)} ms`).join('; ')")
            .await;
        let calls = calls.as_str().unwrap_or("");
        let ready = b.js("return performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd").await;
        let ready = ready.as_f64().unwrap_or(0.0);
        eprintln!(
            "10,000 subscribers: data rendered {ms:.0} ms after navigation start, the page and its modules ready at \
             {ready:.0} ms; API calls: {calls}"
        );
    }
    // The contract's budget is 200 ms on loopback; a shared, loaded CI
    // machine gets slack, a table rendering all 10,000 rows would not fit.
    assert!(best < 1000.0, "the subscribers page took {best:.0} ms");
    assert_eq!(b.text(".pager-info").await, "1–100 of 10000");
    shot(&b, "api-10000").await;
    assert_eq!(b.js("return document.querySelectorAll('#subscribers tbody tr').length").await, 100);

    // Paging and filtering work on the whole set.
    b.client.find(Locator::XPath("//nav[@class='pager']/button[text()='Next']")).await.unwrap().click().await.unwrap();
    b.until("page two", "return document.querySelector('.pager-info').textContent === '101–200 of 10000'").await;
    assert_eq!(b.text("#subscribers tbody tr td").await, "tenant-00100");
    b.client.find(Locator::Css("select#state-filter")).await.unwrap().select_by_value("synced").await.unwrap();
    b.until("synced only", "return document.querySelector('.pager-info').textContent === '1–100 of 1000'").await;
    assert_eq!(b.text("#subscribers tbody tr td").await, "tenant-00007");

    // Every page, filter and count came from the server a page at a time:
    // no request read more subscribers than the 100 a page shows (§16).
    let requests = b.requests().await;
    let reads: Vec<&str> = requests.iter().map(|(url, _)| url.as_str()).filter(|url| url.contains("/status")).collect();
    assert!(reads.iter().any(|url| url.contains("category=synced")), "the filter is the server's: {reads:?}");
    for url in &reads {
        let limit = url.split(['?', '&']).find_map(|p| p.strip_prefix("limit=")).and_then(|n| n.parse::<u32>().ok());
        assert!(limit.is_some_and(|n| (1..=100).contains(&n)), "{url} reads more than a page");
    }
}

/// An API's page shows who last changed its SyncID and why, from the
/// audit trail (platform §13), and follows the next change live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_who_last_changed_a_sync_id_and_why() {
    let w = World::start(false).await;
    w.registration(STORAGE, json!({"sync_id": "s1"})).await;
    let sync = |reason: &'static str| {
        let request = w
            .http
            .put(format!("{}{}/apiregistrations/{STORAGE}/sync", w.base, world::CATALOG))
            .bearer_auth(ADMIN)
            .header("X-Kayra-Reason", reason)
            .json(&json!({}));
        async move { assert_eq!(request.send().await.unwrap().status().as_u16(), 200) }
    };
    sync("roll out the <b>v2</b> pipeline").await;

    let b = Browser::start().await;
    b.client.goto(&w.ui(&format!("#/apis/{STORAGE}"))).await.unwrap();
    submit_token(&b, ADMIN).await;
    b.until_text("who and why", "#sync-changed-by .reason", "roll out the <b>v2</b> pipeline").await;
    assert_eq!(b.text("#sync-changed-by .user").await, "admin");
    assert_eq!(b.js("return document.querySelectorAll('#sync-changed-by b').length").await, 0, "text, not markup");

    // A PUT that moves the SyncID is a change of it too, shown live.
    b.js("window.__samePage = 'yes'; return true").await;
    let request = w
        .http
        .put(format!("{}{}/apiregistrations/{STORAGE}", w.base, world::CATALOG))
        .bearer_auth(ADMIN)
        .header("X-Kayra-Reason", "pin s9")
        .json(&json!({"sync_id": "s9"}));
    assert_eq!(request.send().await.unwrap().status().as_u16(), 200);
    b.until_text("the newer change", "#sync-changed-by .reason", "pin s9").await;
    assert_eq!(b.js("return window.__samePage").await, "yes");
    b.assert_no_script_errors().await;
}

/// An API's page follows its rollout (platform §12) live: nothing before
/// one starts, then its state, reason, current wave and every wave's
/// counts, each subscriber's wave and how many are held, through a manual
/// approval, a pause whose reason is shown as text, and a promote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_follows_a_rollout_through_its_waves() {
    let w = World::start(true).await;
    let policy = json!({"waves": [{"name": "first", "size": "2"}, {"name": "second", "approval": "manual"}]});
    w.registration(STORAGE, json!({"mode": "ok", "sync_id": "s1", "rollout": policy})).await;
    for ns in ["ns-a", "ns-b", "ns-c"] {
        w.namespace(ns, "").await;
        w.subscribe(ns, STORAGE).await;
    }
    w.wait_synced(STORAGE, 3).await; // first syncs: outside every wave
    let rollout_path = format!("/apiregistrations/{STORAGE}/rollout");
    w.call(Method::GET, &rollout_path, None, 404).await;

    let b = Browser::start().await;
    b.client.goto(&w.ui(&format!("#/apis/{STORAGE}"))).await.unwrap();
    submit_token(&b, ADMIN).await;
    b.until_text("no rollout yet", "#rollout-message", "No rollout has started.").await;
    assert_eq!(b.js("return document.getElementById('rollout-details').hidden").await, true);
    // No rollout is not a broken stream: the page stays "live".
    b.until("the page live", "return document.getElementById('live').textContent === 'live'").await;
    b.until_text("no wave outside a rollout", "#subscribers tr[data-key=ns-c] td.wave", "—").await;

    // The bump starts a rollout; the page shows it without a reload.
    b.js("window.__samePage = 'yes'; return true").await;
    w.call(Method::PUT, &format!("/apiregistrations/{STORAGE}/sync"), Some(json!({})), 200).await;
    let wave_state = |wave: &str| format!("#waves tr[data-key={wave}] .wave-state");
    b.until_text("the first wave completed", &wave_state("first"), "completed").await;
    b.until_text("the second wave waiting", &wave_state("second"), "waiting").await;
    b.until_text("the rollout waiting", "#rollout-state", "waiting").await;
    assert_eq!(b.text("#rollout-wave").await, "second (2 of 2)");
    assert_eq!(b.text("#waves tr[data-key=first] .counts").await, "2/2 synced, 0 failed, 0 pending");
    assert_eq!(b.text("#waves tr[data-key=second] .counts").await, "0/1 synced, 0 failed, 1 pending");
    assert_eq!(b.text("#waves tr[data-key=first] .gate").await, "—");
    assert_eq!(b.js("return document.querySelector('#waves tr.current').dataset.key").await, "second");
    assert_eq!(b.text("#rollout-message").await, "");
    let sync_id = w.call(Method::GET, &rollout_path, None, 200).await["sync_id"].as_str().unwrap().to_string();
    assert_eq!(b.text("#rollout-sync-id").await, sync_id);
    b.until_text("the held subscriber", "#fan-out .held", "1 held by the rollout").await;
    b.until_text("ns-a's wave", "#subscribers tr[data-key=ns-a] td.wave", "first").await;
    assert_eq!(b.text("#subscribers tr[data-key=ns-b] td.wave").await, "first");
    assert_eq!(b.text("#subscribers tr[data-key=ns-c] td.wave").await, "second");
    shot(&b, "rollout-waiting").await;

    // A pause's reason is text, not markup.
    let act = |action: &str, reason: &str| json!({"action": action, "reason": reason});
    w.call(Method::PUT, &rollout_path, Some(act("pause", "<b>hold</b> on")), 200).await;
    b.until_text("the rollout paused", "#rollout-state", "paused").await;
    b.until_text("the pause's reason", "#rollout-reason", "paused by admin: <b>hold</b> on").await;
    assert_eq!(b.js("return document.querySelectorAll('#rollout b').length").await, 0, "text, not markup");
    w.call(Method::PUT, &rollout_path, Some(act("resume", "")), 200).await;
    b.until_text("the rollout waiting again", "#rollout-state", "waiting").await;

    // A promote through the API completes the second wave, live.
    w.call(Method::PUT, &rollout_path, Some(act("promote", "looks good")), 200).await;
    b.until_text("the second wave completed", &wave_state("second"), "completed").await;
    b.until_text("the rollout completed", "#rollout-state", "completed").await;
    b.until_text("every wave synced", "#waves tr[data-key=second] .counts", "1/1 synced, 0 failed, 0 pending").await;
    b.until("nothing held", "return document.querySelector('#fan-out .held').hidden").await;
    b.until_text("all synced", "#fan-out .counts", "3/3 synced, 0 failed, 0 pending").await;
    assert_eq!(b.js("return window.__samePage").await, "yes", "the page was reloaded");
    shot(&b, "rollout-completed").await;
    b.assert_no_script_errors().await;
}

/// A subscription's page shows its run history, newest first, with every
/// step of a pipeline that ran against the recording backend, and a new
/// run appears without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_run_history_with_step_details() {
    let w = World::start(true).await;
    w.namespace("core", "").await;
    w.registration(STORAGE, json!({"mode": "ok", "sync_id": "s1"})).await;
    w.registration(NETWORK, json!({"mode": "fail", "sync_id": "n1"})).await;
    w.subscribe("core", STORAGE).await;
    w.subscribe("core", NETWORK).await;
    w.wait_synced(STORAGE, 1).await;

    let b = Browser::start().await;
    b.client.goto(&w.ui(&format!("#/namespaces/core/subscriptions/{STORAGE}"))).await.unwrap();
    submit_token(&b, ADMIN).await;
    b.until("a run", "return document.querySelectorAll('#runs tbody.run').length >= 1").await;
    let first =
        b.js("return [...document.querySelector('#runs tbody.run').rows[0].cells].map(c => c.textContent)").await;
    assert_eq!(first[1], "initial", "{first}");
    assert_eq!(first[2], "s1", "{first}");
    assert_eq!(first[3], "success", "{first}");
    let summary = b.client.find(Locator::Css("#runs tbody.run details summary")).await.unwrap();
    assert_eq!(summary.text().await.unwrap(), "2 steps");
    summary.click().await.unwrap();
    let steps = b
        .js("return [...document.querySelectorAll('#runs tbody.run')[0].querySelectorAll('table.steps tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        .await;
    let base = &w.backend.base;
    let row = |i: usize| -> Vec<String> {
        steps[i].as_array().unwrap().iter().take(6).map(|c| c.as_str().unwrap().to_string()).collect()
    };
    let deploy = format!("{base}/ok/core/deploy");
    let check = format!("{base}/ok/core/check");
    assert_eq!(row(0), ["0", "POST", deploy.as_str(), "no", "200", "1"]);
    assert_eq!(row(1), ["1", "GET", check.as_str(), "no", "200", "1"]);

    // A SyncID bump: a new run on top, live.
    b.js("window.__samePage = 'yes'; return true").await;
    w.call(Method::PUT, &format!("/apiregistrations/{STORAGE}"), Some(json!({"mode": "ok", "sync_id": "s2"})), 200)
        .await;
    b.until(
        "the ongoing run on top",
        "const r = document.querySelector('#runs tbody.run'); return !!r && r.rows[0].cells[2].textContent === 's2'",
    )
    .await;
    assert_eq!(b.js("return document.querySelector('#runs tbody.run').rows[0].cells[1].textContent").await, "ongoing");
    assert_eq!(b.js("return window.__samePage").await, "yes");

    // A failing pipeline: its error, and the step's status and error.
    b.client.goto(&w.ui(&format!("#/namespaces/core/subscriptions/{NETWORK}"))).await.unwrap();
    b.until("a failed run", "return !!document.querySelector('#runs tbody.run.error')").await;
    let failed =
        b.js("return [...document.querySelector('#runs tbody.run.error').rows[0].cells].map(c => c.textContent)").await;
    assert!(!failed[6].as_str().unwrap().is_empty(), "a failed run shows its error: {failed}");
    let step = b
        .js("return [...document.querySelector('#runs tbody.run.error table.steps tbody tr').cells].map(c => c.textContent)")
        .await;
    assert_eq!(step[1], "POST");
    assert_eq!(step[4], "500");

    // Runs go with their subscription: its /runs then answer 404.
    let runs = format!("/namespaces/core/subscriptions/{NETWORK}/runs");
    let listed = w.call(Method::GET, &runs, None, 200).await;
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(2), "an error run and its retry: {listed}");
    w.call(Method::DELETE, &format!("/namespaces/core/subscriptions/{NETWORK}"), None, 204).await;
    w.call(Method::GET, &runs, None, 404).await;
}

/// Run records as the reconciler stores them (§4.4), written here directly:
/// the subscription page lists them newest first with every run and step
/// field, hostile error text as text, and a new run appears live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_renders_recorded_runs_newest_first_with_every_step_field() {
    let w = World::start(false).await;
    w.namespace("core", "").await;
    w.registration(COMPUTE, json!({"mode": "api", "sync_id": "s2"})).await;
    w.subscribe("core", COMPUTE).await;
    let repo = w.repo().await;
    let step = |index: usize, method: &str, status: u16, error: &str| RunStep {
        index,
        method: method.into(),
        endpoint: format!("https://compute.local.services/api/v1/namespaces/core/step{index}"),
        is_async: index == 0,
        attempts: index as u32 + 1,
        status,
        error: error.into(),
        duration_ms: 41 + index as u64,
        outputs: [("JobID".to_string(), format!("7{index}"))].into(),
    };
    let run = |id: &str, sync_id: &str, trigger: RunTrigger, result: RunResult, error: &str, steps: Vec<RunStep>| Run {
        id: id.into(),
        namespace: "core".into(),
        api: COMPUTE.into(),
        sync_id: sync_id.into(),
        mode: "api".into(),
        trigger,
        result,
        error: error.into(),
        started_at: format!("2026-02-01T00:00:0{}.200Z", &id[id.len() - 1..]),
        finished_at: format!("2026-02-01T00:00:0{}.900Z", &id[id.len() - 1..]),
        lock_id: 3,
        reconciler: "host-a:4711".into(),
        steps,
    };
    let older = run(
        "0193a6c1-0000-7000-8000-000000000001",
        "s1",
        RunTrigger::Initial,
        RunResult::Success,
        "",
        vec![step(0, "POST", 202, ""), step(1, "GET", 200, "")],
    );
    let newer = run(
        "0193a6c1-0000-7000-8000-000000000002",
        "s2",
        RunTrigger::Ongoing,
        RunResult::Error,
        HOSTILE_SCRIPT,
        vec![step(0, "POST", 500, HOSTILE_IMG)],
    );
    for r in [&older, &newer] {
        repo.add_run(r, 20).await.unwrap();
    }

    let b = Browser::start().await;
    b.client.goto(&w.ui(&format!("#/namespaces/core/subscriptions/{COMPUTE}"))).await.unwrap();
    submit_token(&b, ADMIN).await;
    b.until("two runs", "return document.querySelectorAll('#runs tbody.run').length === 2").await;
    // The fields come from the subscription's own stream, which may land
    // after the runs' (each its own watch).
    b.until("the subscription's fields", "return document.querySelector('dl.fields') !== null").await;
    let fields = b.text("dl.fields").await;
    for expected in ["core", COMPUTE, "init", "s2"] {
        assert!(fields.contains(expected), "{expected} missing from {fields}");
    }
    let rows = b
        .js("return [...document.querySelectorAll('#runs tbody.run')].map(t => [...t.rows[0].cells].map(c => c.textContent))")
        .await;
    assert_eq!(rows[0], json!([newer.id, "ongoing", "s2", "error", newer.started_at, "700 ms", HOSTILE_SCRIPT]));
    assert_eq!(rows[1], json!([older.id, "initial", "s1", "success", older.started_at, "700 ms", ""]));
    let steps = b
        .js("return [...document.querySelectorAll('#runs tbody.run')].map(t => [...t.querySelectorAll('table.steps tbody tr')].map(r => [...r.cells].map(c => c.textContent)))")
        .await;
    let endpoint = |i: usize| format!("https://compute.local.services/api/v1/namespaces/core/step{i}");
    assert_eq!(steps[0], json!([["0", "POST", endpoint(0), "yes", "500", "1", "41", "JobID70", HOSTILE_IMG]]));
    assert_eq!(
        steps[1],
        json!([
            ["0", "POST", endpoint(0), "yes", "202", "1", "41", "JobID70", ""],
            ["1", "GET", endpoint(1), "no", "200", "2", "42", "JobID71", ""]
        ])
    );
    assert_eq!(b.js("return document.querySelectorAll('#view img, #view script').length").await, 0);
    assert_eq!(b.js("return window.__pwned === undefined").await, true);
    assert!(!b.dialog_open().await, "a dialog opened");

    // The steps are behind a <details>, which opens from the keyboard.
    b.js("document.querySelector('#runs tbody.run details summary').focus(); return true").await;
    b.client.active_element().await.unwrap().send_keys("\u{E006}").await.unwrap(); // Enter
    b.until("the details open", "return document.querySelector('#runs tbody.run details').open").await;
    shot(&b, "subscription").await;

    // A new run shows on top without a reload, the open <details> stays open.
    b.js("window.__samePage = 'yes'; return true").await;
    let newest = run("0193a6c1-0000-7000-8000-000000000003", "s2", RunTrigger::Retry, RunResult::Success, "", vec![]);
    repo.add_run(&newest, 20).await.unwrap();
    b.until("three runs", "return document.querySelectorAll('#runs tbody.run').length === 3").await;
    let top = b.js("return document.querySelector('#runs tbody.run').rows[0].cells[1].textContent").await;
    assert_eq!(top, "retry");
    assert_eq!(b.text("#runs tbody.run details").await, "0 steps");
    assert_eq!(b.js("return document.querySelectorAll('#runs tbody.run details')[1].open").await, true);
    assert_eq!(b.js("return window.__samePage").await, "yes");
    b.assert_no_script_errors().await;
}

/// Seeded hostile text in every displayed field a caller controls (names are
/// DNS labels; descriptions are free text): each shows exactly as written,
/// and nothing in it becomes an element, runs, or opens a dialog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_any_text_as_text() {
    use rand::{Rng, SeedableRng};
    const PIECES: [&str; 16] = [
        "<script>window.__pwned=1</script>",
        "<img src=x onerror=alert(1)>",
        "<svg onload=alert(1)>",
        "\"",
        "'",
        "&amp;",
        "&lt;b&gt;",
        "</td></tr>",
        "<!--",
        "javascript:alert(1)",
        "${alert(1)}",
        "\u{202e}",
        "ü",
        " ",
        "<iframe src=/>",
        "{{ .X }}",
    ];
    let w = World::start(false).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x006b_6179_7261);
    let mut expected = Vec::new();
    for i in 0..12 {
        let text: String = (0..rng.random_range(1..8)).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect();
        let name = format!("hostile-{i:02}");
        w.namespace(&name, &text).await;
        expected.push((name, text));
    }
    w.registration(COMPUTE, json!({"description": expected[0].1})).await;

    let b = Browser::start().await;
    b.client.goto(&w.ui("#/namespaces")).await.unwrap();
    submit_token(&b, ADMIN).await;
    b.until("every namespace", "return document.querySelectorAll('#namespaces tbody tr').length === 12").await;
    let shown = b.js("return [...document.querySelectorAll('#namespaces tbody tr')].map(r => [r.dataset.key, r.cells[1].textContent])").await;
    let expected_json: Vec<Value> = expected.iter().map(|(n, t)| json!([n, t])).collect();
    assert_eq!(shown, json!(expected_json));
    b.client.goto(&w.ui("#/apis")).await.unwrap();
    b.until(
        "the API",
        &format!(
            "const d = document.querySelector('#apis td.description'); return !!d && d.textContent === {}",
            lit(&expected[0].1)
        ),
    )
    .await;
    b.client.goto(&w.ui(&format!("#/namespaces/{}", expected[1].0))).await.unwrap();
    b.until_text("the namespace", "dl.fields dd:nth-of-type(2)", &expected[1].1).await;
    assert_eq!(
        b.js("return document.querySelectorAll('#view img, #view script, #view svg, #view iframe').length").await,
        0
    );
    assert_eq!(b.js("return window.__pwned === undefined").await, true);
    assert!(!b.dialog_open().await, "a dialog opened");
    b.assert_no_script_errors().await;
}

/// A token of a new user bound to `sysadmin`: (token, token id).
async fn operator_token(w: &World, user: &str) -> (String, String) {
    w.call(Method::POST, "/users", Some(json!({"name": user})), 201).await;
    let binding = json!({"name": format!("{user}-sysadmin"), "role": "sysadmin", "user": user});
    w.call(Method::POST, "/clusterrolebindings", Some(binding), 201).await;
    let created = w.call(Method::POST, &format!("/users/{user}/tokens"), Some(json!({})), 201).await;
    (created["token"].as_str().unwrap().to_string(), created["id"].as_str().unwrap().to_string())
}

/// Makes two 401s of a page meet in the worst order, every time: the first
/// refused response is held until a second one has arrived, then let
/// through; the second is held until the first has brought the sign-in
/// back (which leaves the page and aborts its calls), and then reaches the
/// page too. `window.__refusals.done` turns true once the page has read
/// (or failed to read) that second answer and handled it.
const HOLD_REFUSALS: &str = r#"
window.__refusals = { seen: 0, done: false };
const realFetch = window.fetch;
window.fetch = async (...args) => {
  const response = await realFetch(...args);
  const r = window.__refusals;
  if (response.status !== 401) return response;
  r.seen += 1;
  if (r.seen === 1) {
    // A bound, not a wait for luck: without a second refusal the test times out on `done`.
    await new Promise((resolve) => { r.releaseFirst = resolve; setTimeout(resolve, 20000); });
  } else if (r.seen === 2) {
    r.releaseFirst();
    await new Promise((resolve) => {
      const check = () => (document.getElementById('signin').hidden ? setTimeout(check, 10) : resolve());
      check();
    });
    const json = response.json.bind(response);
    // After every reaction to the body (microtasks) has run.
    response.json = () => json().finally(() => setTimeout(() => { r.done = true; }, 0));
  }
  return response;
};
"#;

/// Records every text the sign-in's error line takes from now on, in
/// `window.__signinErrors` (until the next page load).
async fn record_signin_errors(b: &Browser) {
    b.js("window.__signinErrors = [];
          const e = document.getElementById('signin-error');
          new MutationObserver(() => window.__signinErrors.push(e.textContent))
            .observe(e, {childList: true, characterData: true, subtree: true});
          return true")
        .await;
}

/// A token revoked while a live page follows its streams (platform §4.5:
/// the server closes them; the reconnects are refused together) returns
/// to the sign-in with the server's 401 message, not a status line from a
/// second refusal the sign-out itself cut short. The same when a page is
/// loaded with a revoked token (`/whoami` and the page's streams refused
/// at once), and on a page that polls because it may not watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_revoked_token_returns_to_the_sign_in_with_the_servers_message() {
    let w = World::start(false).await;
    w.namespace("core", "").await;
    // `hold` with no reconciler: compute stays pending, so its /status is streamed.
    w.registration(COMPUTE, json!({"mode": "hold"})).await;
    w.subscribe("core", COMPUTE).await;
    let b = Browser::start().await;
    b.on_new_document(HOLD_REFUSALS).await;
    b.client.goto(&w.ui("")).await.unwrap();

    // Live pages of two streams each: the reconnects of both are refused.
    let pages = [format!("#/apis/{COMPUTE}"), "#/namespaces/core".to_string()];
    for (i, page) in pages.iter().enumerate() {
        let user = format!("operator-{i}");
        let (token, id) = operator_token(&w, &user).await;
        b.client.goto(&w.ui(page)).await.unwrap();
        submit_token(&b, &token).await;
        b.until("the page's streams", "return document.getElementById('live').textContent === 'live'").await;
        b.js("window.__refusals = { seen: 0, done: false }; return true").await;
        record_signin_errors(&b).await;

        w.call(Method::DELETE, &format!("/users/{user}/tokens/{id}"), None, 204).await;
        b.until("both reconnects refused and handled", "return window.__refusals.done === true").await;
        let message = w.refusal(&token).await;
        assert_eq!(b.js("return document.getElementById('signin').hidden").await, false, "{page}");
        assert_eq!(b.text("#signin-error").await, message, "{page}");
        let texts = b.js("return window.__signinErrors").await;
        assert!(texts.as_array().unwrap().iter().all(|t| t == message.as_str()), "{page}: the sign-in said {texts}");
        assert_eq!(b.js("return sessionStorage.length").await, 0, "{page}");
    }

    // A page loaded with a revoked token: /whoami (a plain call) and the
    // page's two streams are refused at once.
    let (token, id) = operator_token(&w, "reloader").await;
    b.client.goto(&w.ui("#/namespaces/core")).await.unwrap();
    submit_token(&b, &token).await;
    b.until("the page's streams", "return document.getElementById('live').textContent === 'live'").await;
    w.call(Method::DELETE, &format!("/users/reloader/tokens/{id}"), None, 204).await;
    b.client.refresh().await.unwrap();
    b.until("the refusals handled after the reload", "return window.__refusals.done === true").await;
    assert_eq!(b.js("return document.getElementById('signin').hidden").await, false);
    assert_eq!(b.text("#signin-error").await, w.refusal(&token).await);

    // A caller who may read but not watch: the page polls with plain
    // calls (403 on the streams), and those are what the revocation refuses.
    let rules = json!([{"resources": ["namespaces", "subscriptions"], "verbs": ["get", "list"]}]);
    w.call(Method::POST, "/roles", Some(json!({"name": "poller-role", "rules": rules})), 201).await;
    w.call(Method::POST, "/users", Some(json!({"name": "poller"})), 201).await;
    let binding = json!({"name": "poller-binding", "role": "poller-role", "user": "poller"});
    w.call(Method::POST, "/clusterrolebindings", Some(binding), 201).await;
    let created = w.call(Method::POST, "/users/poller/tokens", Some(json!({})), 201).await;
    let (token, id) = (created["token"].as_str().unwrap().to_string(), created["id"].as_str().unwrap().to_string());
    submit_token(&b, &token).await;
    b.until("the page polling", "return document.getElementById('live').textContent === 'polling'").await;
    b.until("the namespace shown", "return !!document.querySelector('#view dl.fields')").await;
    b.js("window.__refusals = { seen: 0, done: false }; return true").await;
    record_signin_errors(&b).await;
    w.call(Method::DELETE, &format!("/users/poller/tokens/{id}"), None, 204).await;
    b.until("both polls refused and handled", "return window.__refusals.done === true").await;
    let message = w.refusal(&token).await;
    assert_eq!(b.js("return document.getElementById('signin').hidden").await, false);
    assert_eq!(b.text("#signin-error").await, message);
    let texts = b.js("return window.__signinErrors").await;
    assert!(texts.as_array().unwrap().iter().all(|t| t == message.as_str()), "the sign-in said {texts}");
    b.assert_no_script_errors().await;
}
