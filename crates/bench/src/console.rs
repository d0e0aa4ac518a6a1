//! What the console's API page waits for with 10,000 subscribers to one
//! API (`--console-subscribers`: 100,000 for issue 34's row): `GET /apiregistrations/:name/status` answered from `kayra serve`'s
//! watch-fed subscriber index (consistent-read check included), and the
//! first document of its `?watch=true` stream, against what the report
//! cost before the index, in the same run: reading every subscription of
//! the deployment from the store and encoding the same document.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use kayra_catalog::api::registrations::{RegistrationStatus, Subscriber};
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_core::{ApiRegistration, Subscription};
use kayra_store::Store;

use crate::serve::{ADMIN, CATALOG, ok, serve};

const API: &str = "compute.example.com";
const ROUNDS: usize = 30;

/// p50 and p99 of `ROUNDS` sequential runs of `op`.
async fn timed<F, Fut>(op: F) -> anyhow::Result<(Duration, Duration)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        op().await?;
        times.push(t.elapsed());
    }
    times.sort_unstable();
    Ok((times[ROUNDS / 2], times[(ROUNDS - 1) * 99 / 100]))
}

/// The report as the handler built it before the index: from the store.
async fn from_store(repo: &Repository) -> anyhow::Result<Vec<u8>> {
    let registration = repo.get_registration(API).await?.context("registration")?.value;
    let subscribers: Vec<Subscriber> = repo
        .registration_subscribers(API)
        .await?
        .into_iter()
        .map(|s| Subscriber {
            synced: s.value.is_synced(&registration.sync_id),
            namespace: s.value.namespace,
            active: s.value.active,
            state: s.value.state,
            current_sync_id: s.value.current_sync_id,
            wave: String::new(),
        })
        .collect();
    let status = RegistrationStatus::new(registration, subscribers);
    Ok(serde_json::to_vec(&status)?)
}

pub async fn run(backend: &str, database: kayra_config::DatabaseConfig, subscribers: usize) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = Store::open(&database).await?;
    let mut config = kayra_config::Config { database, ..Default::default() };
    config.auth.bootstrap_token = ADMIN.into();
    let repo = Repository::new(store.clone(), &config.platform, &config.region);
    let registration = ApiRegistration { name: API.into(), sync_id: "s1".into(), ..Default::default() };
    repo.create(RecordRef::Registration(API), &registration, "registration").await?;
    let writes = (0..subscribers).map(|i| {
        let ns = format!("tenant-{i:05}");
        let mut sub = Subscription::new(ns.as_str(), API);
        sub.active = i % 10 == 7;
        sub.current_sync_id = if sub.active { "s1".into() } else { String::new() };
        (repo.store_key_of(RecordRef::Subscription { namespace: &ns, api: API }), serde_json::to_vec(&sub))
    });
    let created = futures::stream::iter(writes).map(|(key, value)| {
        let store = store.clone();
        async move { store.create(&key, value?).await.map(|_| ()).map_err(anyhow::Error::from) }
    });
    for result in created.buffer_unordered(64).collect::<Vec<_>>().await {
        result?;
    }
    let (base, stop) = serve(store.clone(), &config).await?;
    let http = reqwest::Client::new();
    let url = format!("{base}{CATALOG}/apiregistrations/{API}/status");
    let body = ok(http.get(&url).bearer_auth(ADMIN).send().await?).await?.bytes().await?;
    let status: serde_json::Value = serde_json::from_slice(&body)?;
    anyhow::ensure!(status["total"] == subscribers, "the report counts {}", status["total"]);

    let (index50, index99) = timed(|| async {
        ok(http.get(&url).bearer_auth(ADMIN).send().await?).await?.bytes().await?;
        Ok(())
    })
    .await?;
    let page_url = format!("{url}?limit=500");
    let (page50, page99) = timed(|| async {
        ok(http.get(&page_url).bearer_auth(ADMIN).send().await?).await?.bytes().await?;
        Ok(())
    })
    .await?;
    let (stream50, stream99) = timed(|| async {
        let mut stream = ok(http.get(format!("{url}?watch=true")).bearer_auth(ADMIN).send().await?).await?;
        let mut first = Vec::new();
        while !first.contains(&b'\n') {
            first.extend_from_slice(&stream.chunk().await?.context("the stream ended")?);
        }
        Ok(())
    })
    .await?;
    let (store50, store99) = timed(|| async { from_store(&repo).await.map(|_| ()) }).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let what = format!("{subscribers} subscribers, {} KB", body.len() / 1000);
    println!(
        "| {backend} | GET /status over HTTP, {what} | {:.1} | {:.1} | {:.2}× the store read's p50 |",
        ms(index50),
        ms(index99),
        ms(index50) / ms(store50)
    );
    println!(
        "| {backend} | GET /status?limit=500 (one page, the counts of all {subscribers}) | {:.1} | {:.1} | {:.2}× |",
        ms(page50),
        ms(page99),
        ms(page50) / ms(store50)
    );
    println!(
        "| {backend} | its ?watch=true stream's first document | {:.1} | {:.1} | {:.2}× |",
        ms(stream50),
        ms(stream99),
        ms(stream50) / ms(store50)
    );
    println!(
        "| {backend} | the report from a store read, in process (before the index) | {:.1} | {:.1} | 1.00× |",
        ms(store50),
        ms(store99)
    );
    stop.cancel();
    Ok(())
}
