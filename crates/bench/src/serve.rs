//! `kayra serve` on its watch-fed auth caches, like for like:
//!
//! - GET one subscription over HTTP with full authentication and RBAC (a
//!   narrow role), 32 in flight, against the raw in-process store get and,
//!   on etcd, etcd's own JSON gateway (`POST /v3/kv/range` on the same
//!   etcd, the same HTTP client, the same concurrency);
//! - POST a subscription against the raw create and the gateway's
//!   `/v3/kv/put`;
//! - p50/p99 latency of each;
//! - a revoked token's propagation to a second `kayra serve` (p50/p99 over
//!   100 revocations): from the DELETE's answer on one replica to the
//!   first 401 on the other;
//! - with `--serve-prefill N`, all of it over a store the generator
//!   filled with N synced subscriptions first (issue 34: a million),
//!   etcd's then compacted and defragmented;
//! - with `--memory`, the RSS of a real `kayra serve` process over a store
//!   of 100,000 subscriptions (its subscriber index listed and answering a
//!   `/status`), 10,000 namespaces and 1,000 users.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use futures::StreamExt;
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_core::{ApiRegistration, ClusterRoleBinding, Namespace, Role, Rule, Subscription, User};
use kayra_store::Store;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::client::{self, Call, Figures, percentile};

const API: &str = "compute.example.com";
pub(crate) const ADMIN: &str = "bench-admin-token-0123456789abcdef0123456789";
pub(crate) const CATALOG: &str = "/apis/catalog.example.com/v1";
const INFLIGHT: usize = 32;

fn row(backend: &str, what: &str, f: &Figures, baselines: &[(&str, &Figures)]) {
    let ratios: Vec<String> = baselines.iter().map(|(name, b)| format!("{:.2}× {name}", f.rate / b.rate)).collect();
    println!(
        "| {backend} | {what} | {:.0} | {:.2} | {:.2} | {} |",
        f.rate,
        f.p50.as_secs_f64() * 1e3,
        f.p99.as_secs_f64() * 1e3,
        ratios.join(", ")
    );
}

/// `ops` calls of `op`, [`INFLIGHT`] at a time, each timed.
/// One operation's rows: the raw store's figure, then for each client
/// etcd's gateway (where there is one) and the API against both.
fn report<'a>(
    backend: &str,
    (raw_what, raw): (&str, &Figures),
    (gateway_what, api_what): (&str, &str),
    clients: impl Iterator<Item = (&'a str, (&'a Figures, Option<&'a Figures>))>,
) {
    row(backend, raw_what, raw, &[]);
    for (client, (api, gateway)) in clients {
        let mut baselines = vec![("raw", raw)];
        if let Some(gateway) = gateway {
            row(backend, &format!("{gateway_what}{client}"), gateway, &[]);
            baselines.push(("gateway", gateway));
        }
        row(backend, &format!("{api_what}{client}"), api, &baselines);
    }
}

async fn measure<F, Fut>(ops: usize, op: F) -> anyhow::Result<Figures>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    let timed = |i| {
        let call = op(i);
        async move {
            let t = Instant::now();
            call.await.map(|()| t.elapsed())
        }
    };
    let results: Vec<anyhow::Result<Duration>> =
        futures::stream::iter(0..ops).map(timed).buffer_unordered(INFLIGHT).collect().await;
    let rate = ops as f64 / started.elapsed().as_secs_f64();
    let mut latencies = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    latencies.sort_unstable();
    Ok(Figures::from_sorted(rate, &latencies))
}

/// A `kayra serve` on `store`, in this process; stopped with the token.
pub(crate) async fn serve(store: Store, config: &kayra_config::Config) -> anyhow::Result<(String, CancellationToken)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let cancel = CancellationToken::new();
    tokio::spawn(kayra_server::run(config.clone(), store, listener, cancel.clone().cancelled_owned()));
    let http = reqwest::Client::new();
    kayra_testkit::eventually("kayra serve up", || async {
        http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await;
    Ok((base, cancel))
}

pub(crate) async fn ok(response: reqwest::Response) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    anyhow::ensure!(status.is_success(), "HTTP {status}: {}", response.text().await.unwrap_or_default());
    Ok(response)
}

/// The figures of §"Benchmarks" for one backend; `gateway` is etcd's
/// client URL when the backend is etcd.
pub async fn run(
    backend: &str,
    database: kayra_config::DatabaseConfig,
    gateway: Option<String>,
    ops: usize,
    prefill: usize,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = Store::open(&database).await?;
    let mut config = kayra_config::Config { database: database.clone(), ..Default::default() };
    config.auth.bootstrap_token = ADMIN.into();
    let repo = Repository::new(store.clone(), &config.platform, &config.region);
    if prefill > 0 {
        let shape = crate::generate::Shape::spread(prefill, 1, 0);
        let filled = crate::generate::fill(&repo, &shape, 8).await?;
        println!(
            "| {backend} | the store: {} generated records ({prefill} synced subscriptions, one run each), in {:.0} s | | | | |",
            filled.records,
            filled.took.as_secs_f64()
        );
        // As a production etcd keeps it (`--auto-compaction-*`, a defrag
        // after a bulk load): the million writes' history gone, so the
        // figures are the store's and not its catching up after the load.
        if let Some(endpoint) = &gateway {
            let settled = Instant::now();
            let size = crate::space::db_size(endpoint)?;
            println!(
                "| {backend} | compacted and defragmented: dbSize {} MiB, in {:.0} s | | | | |",
                size >> 20,
                settled.elapsed().as_secs_f64()
            );
        }
    }
    let (base, stop) = serve(store.clone(), &config).await?;
    let http = reqwest::Client::new();

    // The caller: a user whose one role grants exactly what is measured.
    let rule = Rule {
        apis: vec!["catalog.example.com".into()],
        resources: vec!["subscriptions".into()],
        verbs: vec!["get".into(), "create".into()],
    };
    repo.create(RecordRef::Role("bench"), &Role { name: "bench".into(), rules: vec![rule] }, "role").await?;
    repo.create(RecordRef::User("bench"), &User { name: "bench".into(), description: String::new() }, "user").await?;
    let binding = ClusterRoleBinding { name: "bench".into(), role: "bench".into(), user: "bench".into() };
    repo.create(RecordRef::ClusterRoleBinding("bench"), &binding, "binding").await?;
    let token: serde_json::Value =
        ok(http.post(format!("{base}{CATALOG}/users/bench/tokens")).bearer_auth(ADMIN).json(&json!({})).send().await?)
            .await?
            .json()
            .await?;
    let token = token["token"].as_str().context("token")?.to_string();
    let registration = ApiRegistration { name: API.into(), sync_id: "s1".into(), ..Default::default() };
    repo.create(RecordRef::Registration(API), &registration, "registration").await?;
    // b<i> for the POSTs measured, r<i> for the same through reqwest, f<i>
    // for their floor.
    let names = (0..ops).flat_map(|i| [format!("b{i}"), format!("r{i}"), format!("f{i}")]);
    let namespaces = futures::stream::iter(names).map(|name| {
        let repo = repo.clone();
        async move {
            let ns = Namespace { name, active: true, ..Namespace::default() };
            repo.create(RecordRef::Namespace(&ns.name), &ns, "namespace").await
        }
    });
    for created in namespaces.buffer_unordered(INFLIGHT).collect::<Vec<_>>().await {
        created?;
    }

    // POST: the API, the raw create of the same record, the gateway put.
    let bearer: Arc<str> = token.as_str().into();
    let body = serde_json::to_vec(&json!({"api": API}))?;
    let post = {
        let bearer = bearer.clone();
        client::measure(&base, ops, INFLIGHT, move |i| {
            Call::post(format!("{CATALOG}/namespaces/b{i}/subscriptions"), body.clone()).bearer(&bearer)
        })
        .await?
    };
    let post_reqwest = measure(ops, |i| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let url = format!("{base}{CATALOG}/namespaces/r{i}/subscriptions");
            ok(http.post(url).bearer_auth(token).json(&json!({"api": API})).send().await?).await.map(|_| ())
        }
    })
    .await?;
    let value = serde_json::to_vec(&Subscription::new("raw", API))?;
    let raw_create = measure(ops, |i| {
        let (store, value) = (store.clone(), value.clone());
        async move { Ok(store.create(&format!("/bench/raw/{i:08}"), value).await.map(|_| ())?) }
    })
    .await?;
    let create_floor = create_floor(&repo, ops).await?;
    fn b64(s: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }
    let gateway_put = match &gateway {
        Some(url) => {
            let value = value.clone();
            Some(
                client::measure(url, ops, INFLIGHT, move |i| {
                    let body = json!({"key": b64(format!("/gateway/{i:08}").as_bytes()), "value": b64(&value)});
                    Call::post("/v3/kv/put".into(), body.to_string().into_bytes())
                })
                .await?,
            )
        }
        None => None,
    };
    let gateway_put_reqwest = match &gateway {
        Some(url) => Some(
            measure(ops, |i| {
                let (http, url) = (http.clone(), url.clone());
                let body = json!({"key": b64(format!("/gateway-r/{i:08}").as_bytes()), "value": b64(&value)});
                async move { ok(http.post(format!("{url}/v3/kv/put")).json(&body).send().await?).await.map(|_| ()) }
            })
            .await?,
        ),
        None => None,
    };

    // GET: the subscriptions just created.
    let get = {
        let bearer = bearer.clone();
        client::measure(&base, ops, INFLIGHT, move |i| {
            Call::get(format!("{CATALOG}/namespaces/b{i}/subscriptions/{API}")).bearer(&bearer)
        })
        .await?
    };
    // The same GETs through reqwest, as measured before: what a heavier
    // client on the same two cores takes from the server.
    let get_reqwest = measure(ops, |i| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let url = format!("{base}{CATALOG}/namespaces/b{i}/subscriptions/{API}");
            ok(http.get(url).bearer_auth(token).send().await?).await.map(|_| ())
        }
    })
    .await?;
    // The floor: the same client, the same server, a route with no
    // authentication, no store and no RBAC — HTTP itself on this machine.
    let healthz = client::measure(&base, ops, INFLIGHT, |_| Call::get("/healthz".into())).await?;
    let raw_get = measure(ops, |i| {
        let store = store.clone();
        async move { Ok(store.get(&format!("/bench/raw/{i:08}")).await.map(|_| ())?) }
    })
    .await?;
    let gateway_range = match &gateway {
        Some(url) => Some(
            client::measure(url, ops, INFLIGHT, move |i| {
                let body = json!({"key": b64(format!("/gateway/{i:08}").as_bytes())});
                Call::post("/v3/kv/range".into(), body.to_string().into_bytes())
            })
            .await?,
        ),
        None => None,
    };
    let gateway_range_reqwest = match &gateway {
        Some(url) => Some(
            measure(ops, |i| {
                let (http, url) = (http.clone(), url.clone());
                let body = json!({"key": b64(format!("/gateway-r/{i:08}").as_bytes())});
                async move { ok(http.post(format!("{url}/v3/kv/range")).json(&body).send().await?).await.map(|_| ()) }
            })
            .await?,
        ),
        None => None,
    };

    // Each HTTP figure against the baselines of the same client.
    let clients = ["", ", reqwest client"];
    let posts = [(&post, gateway_put.as_ref()), (&post_reqwest, gateway_put_reqwest.as_ref())];
    let gets = [(&get, gateway_range.as_ref()), (&get_reqwest, gateway_range_reqwest.as_ref())];
    let names = ("etcd gateway POST /v3/kv/put", "API POST subscription (auth + RBAC)");
    report(backend, ("raw store create", &raw_create), names, clients.into_iter().zip(posts));
    let mut baselines = vec![("raw", &raw_create)];
    baselines.extend(gateway_put.as_ref().map(|put| ("gateway", put)));
    row(
        backend,
        "floor: a subscription create's store transaction alone (no HTTP, auth, RBAC or JSON)",
        &create_floor,
        &baselines,
    );
    let names = ("etcd gateway POST /v3/kv/range", "API GET subscription (auth + RBAC)");
    report(backend, ("raw store get", &raw_get), names, clients.into_iter().zip(gets));
    row(backend, "GET /healthz (HTTP floor: no auth, no store)", &healthz, &[("raw", &raw_get)]);

    get_parts(backend, &repo, &config, &token, ops, (&get, &healthz)).await?;

    propagation(backend, &base, &config, &http).await?;
    stop.cancel();
    Ok(())
}

/// The floor of `POST …/subscriptions`: the store transaction a
/// subscription create sends — its namespace and registration compared
/// present and the record absent; the record, its two index keys and (when
/// the API's POSTs wrote one) an audit record of their size put; the
/// registration read — sent raw through the store client by group commit,
/// as the API's writes go, to the namespaces `f<i>`, [`INFLIGHT`] at a
/// time.
async fn create_floor(repo: &Repository, ops: usize) -> anyhow::Result<Figures> {
    let (audits, _) = repo.store().list_all(&repo.layout().prefix(kayra_catalog::repo::Collection::Audit)).await?;
    let audit_size = audits.iter().map(|kv| kv.value.len()).sum::<usize>() / audits.len().max(1);
    let registration = repo.layout().key(RecordRef::Registration(API));
    measure(ops, |i| {
        let (store, registration) = (repo.store().clone(), registration.clone());
        let namespace = repo.layout().key(RecordRef::Namespace(&format!("f{i}")));
        let key = format!("/bench/floor/subscriptions/f{i}/{API}");
        let index = |kind: &str| kayra_store::Op::Put {
            key: format!("/bench/floor/{kind}/f{i}/{API}"),
            value: key.clone().into_bytes(),
        };
        let txn = kayra_store::Txn::new()
            .when(kayra_store::Compare::Exists(namespace))
            .when(kayra_store::Compare::Exists(registration.clone()))
            .when(kayra_store::Compare::Absent(key.clone()))
            .then(kayra_store::Op::Put {
                key: key.clone(),
                value: serde_json::to_vec(&Subscription::new(format!("f{i}"), API)).unwrap_or_default(),
            })
            .then(index("subscribers"))
            .then(index("namespace-subscribers"));
        // Audited (§13) when the API's creates were.
        let txn = match audit_size {
            0 => txn,
            size => {
                txn.then(kayra_store::Op::Put { key: format!("/bench/floor/audit/{i:08}"), value: vec![b'a'; size] })
            }
        };
        let txn = txn.then(kayra_store::Op::Get { key: registration });
        async move {
            let done = store.txn_grouped(txn).await?;
            anyhow::ensure!(done.succeeded, "the floor's create of f{i} failed its compares");
            Ok(())
        }
    })
    .await
}

/// Where a GET's time goes (issue 34: "authentication, RBAC and the read
/// cost more than the HTTP round trip itself — find where"): each part of
/// the handler's work alone, in this process, at the same concurrency as
/// the HTTP figures and through a Repository with the server's caches, so
/// each rate is what that part alone would let the two cores do. Per
/// request, `1 / rate`: the parts' sum against the GET's and `/healthz`'s.
async fn get_parts(
    backend: &str,
    repo: &Repository,
    config: &kayra_config::Config,
    token: &str,
    ops: usize,
    (get, healthz): (&Figures, &Figures),
) -> anyhow::Result<()> {
    let cache =
        kayra_catalog::cache::AuthCache::start(repo.store(), repo.platform(), repo.region(), Duration::from_secs(5));
    let cached = repo.clone().with_cache(cache);
    // Until the caches have listed what the server's have.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(cached.authenticate(token).await, Ok(Some(_))) {
        anyhow::ensure!(Instant::now() < deadline, "the bench's token does not authenticate through the caches");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let token: Arc<str> = token.into();
    let authenticate = measure(ops, |_| {
        let (repo, token) = (cached.clone(), token.clone());
        async move {
            anyhow::ensure!(repo.authenticate(&token).await?.is_some(), "token refused");
            Ok(())
        }
    })
    .await?;
    let decide = measure(ops, |_| {
        let repo = cached.clone();
        async move {
            let request = kayra_rbac::Request::new("catalog.example.com", "subscriptions", "get");
            anyhow::ensure!(repo.decide("bench", None, &request).await?.is_allowed(), "RBAC denied");
            Ok(())
        }
    })
    .await?;
    let read = measure(ops, |i| {
        let repo = cached.clone();
        async move {
            let read = repo.read_subscription(&format!("b{i}"), API).await?;
            anyhow::ensure!(read.subscription.is_some(), "b{i}'s subscription not found");
            Ok(())
        }
    })
    .await?;
    let sample = cached.read_subscription("b0", API).await?;
    let sync_id = sample.sync_id.clone();
    let sub = sample.subscription.context("b0's subscription")?;
    let json = measure(ops, |_| {
        let view = sub.value.view(&sync_id);
        async move { serde_json::to_vec(&view).map(|_| ()).map_err(anyhow::Error::from) }
    })
    .await?;
    // The server's whole router, called in process (no connection, no
    // HTTP parsing or writing): what routing and the middlewares add to
    // the parts, and the same for `/healthz`.
    let state = kayra_server::AppState::cached(config, repo.store().clone(), cached.cache().context("cache")?.clone());
    let app = kayra_server::router(state);
    let peer = kayra_server::listener::Peer { addr: ([127, 0, 0, 1], 1).into(), tls: false };
    let routed = |path: String, bearer: Option<Arc<str>>| {
        let mut request = hyper::Request::get(path);
        if let Some(token) = bearer {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let mut request = request.body(http_body_util::Empty::<bytes::Bytes>::new()).expect("a valid request");
        request.extensions_mut().insert(peer);
        let app = app.clone();
        async move {
            let response = tower::ServiceExt::oneshot(app, request).await?;
            anyhow::ensure!(response.status() == 200, "answered {}", response.status());
            http_body_util::BodyExt::collect(response.into_body()).await?;
            Ok(())
        }
    };
    let routed_get =
        measure(ops, |i| routed(format!("{CATALOG}/namespaces/b{i}/subscriptions/{API}"), Some(token.clone()))).await?;
    let routed_healthz = measure(ops, |_| routed("/healthz".into(), None)).await?;
    let us = |f: &Figures| 1e6 / f.rate;
    let parts = [
        ("authentication (token hash, cache)", &authenticate),
        ("RBAC decision (cache)", &decide),
        ("the read (subscription and registration: one read transaction)", &read),
        ("the answer's JSON", &json),
    ];
    for (what, f) in parts {
        println!("| {backend} | GET's part alone, in process: {what} | {:.0} | {:.1} µs a call | | |", f.rate, us(f));
    }
    for (what, f) in [("the GET", &routed_get), ("/healthz", &routed_healthz)] {
        println!(
            "| {backend} | through the server's router, in process (no HTTP): {what} | {:.0} | {:.1} µs a call | | |",
            f.rate,
            us(f)
        );
    }
    let sum: f64 = parts.iter().map(|(_, f)| us(f)).sum();
    println!(
        "| {backend} | a GET: {:.1} µs of the two cores a request; /healthz {:.1} µs; the parts above {sum:.1} µs; the rest (routing, middleware, extractors, the larger answer) {:.1} µs | | | | |",
        us(get),
        us(healthz),
        us(get) - us(healthz) - sum
    );
    Ok(())
}

/// 100 revocations through one replica, each timed until the other
/// replica refuses the token.
async fn propagation(
    backend: &str,
    a: &str,
    config: &kayra_config::Config,
    http: &reqwest::Client,
) -> anyhow::Result<()> {
    let other = Store::open(&config.database).await?;
    let (b, stop) = serve(other, config).await?;
    let mut times = Vec::new();
    for _ in 0..100 {
        let issued: serde_json::Value = ok(http
            .post(format!("{a}{CATALOG}/users/bench/tokens"))
            .bearer_auth(ADMIN)
            .json(&json!({}))
            .send()
            .await?)
        .await?
        .json()
        .await?;
        let (id, token) = (issued["id"].as_str().context("id")?, issued["token"].as_str().context("token")?);
        let whoami = format!("{b}{CATALOG}/whoami");
        // Known to the other replica before it is revoked.
        loop {
            if http.get(&whoami).bearer_auth(token).send().await?.status().is_success() {
                break;
            }
        }
        ok(http.delete(format!("{a}{CATALOG}/users/bench/tokens/{id}")).bearer_auth(ADMIN).send().await?).await?;
        let revoked = Instant::now();
        loop {
            let status = http.get(&whoami).bearer_auth(token).send().await?.status();
            if status == reqwest::StatusCode::UNAUTHORIZED {
                break;
            }
            anyhow::ensure!(revoked.elapsed() < Duration::from_secs(5), "revocation never reached the other replica");
        }
        times.push(revoked.elapsed());
    }
    times.sort_unstable();
    println!(
        "| {backend} | revoked token refused by a second kayra serve (100 revocations) | | {:.2} | {:.2} | |",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3
    );
    stop.cancel();
    Ok(())
}

/// The RSS of a real `kayra serve` process (`binary`) over `database`
/// holding 100,000 subscriptions, 10,000 namespaces and 1,000 users.
pub async fn memory(database: &kayra_config::DatabaseConfig, binary: &std::path::Path) -> anyhow::Result<()> {
    let repo = Repository::new(Store::open(database).await?, "dev", "local");
    let started = Instant::now();
    let writes = (0..10_000usize)
        .map(|i| {
            (
                repo.store_key_of(RecordRef::Namespace(&format!("m{i}"))),
                serde_json::to_vec(&Namespace { name: format!("m{i}"), active: true, ..Namespace::default() }),
            )
        })
        .chain((0..1_000usize).flat_map(|i| {
            let user = format!("user{i}");
            [
                (
                    repo.store_key_of(RecordRef::User(&user)),
                    serde_json::to_vec(&User { name: user.clone(), description: String::new() }),
                ),
                (
                    repo.store_key_of(RecordRef::ClusterRoleBinding(&user)),
                    serde_json::to_vec(&ClusterRoleBinding {
                        name: user.clone(),
                        role: "bench".into(),
                        user: user.clone(),
                    }),
                ),
            ]
        }))
        .chain((0..100_000usize).map(|i| {
            let (ns, api) = (format!("m{}", i % 10_000), format!("api{}.example.com", i / 10_000));
            (
                repo.store_key_of(RecordRef::Subscription { namespace: &ns, api: &api }),
                serde_json::to_vec(&Subscription::new(ns.clone(), &api)),
            )
        }));
    let created = futures::stream::iter(writes).map(|(key, value)| {
        let store = repo.store().clone();
        async move { store.create(&key, value?).await.map(|_| ()).map_err(anyhow::Error::from) }
    });
    for result in created.buffer_unordered(64).collect::<Vec<_>>().await {
        result?;
    }
    eprintln!("populated 111,000 records in {:.1}s", started.elapsed().as_secs_f64());

    let dir = tempfile::tempdir()?;
    let config_file = dir.path().join("kayra.yaml");
    let etcd = database.etcd.as_ref().context("the memory measurement runs on etcd")?;
    let listen = format!("127.0.0.1:{}", kayra_testkit::free_port());
    std::fs::write(
        &config_file,
        format!(
            "server:\n  listen: {listen}\ndatabase:\n  etcd:\n    endpoints: [{endpoint}]\n    prefix: {prefix}\nauth:\n  bootstrap_token: {ADMIN}\n",
            endpoint = etcd.endpoints[0],
            prefix = etcd.prefix,
        ),
    )?;
    let mut child = tokio::process::Command::new(binary)
        .arg("serve")
        .arg("--config")
        .arg(&config_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", binary.display()))?;
    let http = reqwest::Client::new();
    kayra_testkit::eventually("kayra serve ready", || async {
        http.get(format!("http://{listen}/readyz")).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await;
    // The console's report of one API (10,000 of the subscribers) comes from
    // the serve's subscriber index: the figure includes it, fully listed.
    let registration = ApiRegistration { name: "api0.example.com".into(), ..Default::default() };
    repo.create(RecordRef::Registration(&registration.name), &registration, "registration").await?;
    let url = format!("http://{listen}{CATALOG}/apiregistrations/api0.example.com/status");
    let status: serde_json::Value = ok(http.get(url).bearer_auth(ADMIN).send().await?).await?.json().await?;
    anyhow::ensure!(status["total"] == 10_000, "the report counts {}", status["total"]);
    // Some traffic, so the figure includes a serving process, not an idle one.
    for i in 0..200 {
        let url = format!("http://{listen}{CATALOG}/namespaces/m{}", i % 10_000);
        ok(http.get(url).bearer_auth(ADMIN).send().await?).await?;
    }
    let pid = child.id().context("pid")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?.to_string();
    println!("| etcd | kayra serve RSS with 100,000 subscriptions, 10,000 namespaces, 1,000 users | {rss} |");
    child.kill().await?;
    Ok(())
}
