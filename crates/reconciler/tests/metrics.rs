//! `kayra_sync_lag_seconds` (platform §8): a subscriber's sync time minus
//! its registration's `sync_id_updated_at`, observed once per successful
//! sync, on both backends. Its own test binary: the metrics recorder is
//! process-global.

mod common;

use std::time::{Duration, SystemTime};

use common::{Kind, Seed, eventually, start_reconciler, store};
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::ApiRegistration;

const API: &str = "compute.example.com";

fn sample(rendered: &str, name: &str) -> Option<f64> {
    rendered.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn sync_once(kind: Kind, lagging: Duration) {
    let store = store(kind).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let seed = Seed(&repo);
    seed.registration(API, "placeholder", "s1").await;
    // A registration whose SyncID moved `lagging` ago.
    let at = humantime::format_rfc3339_millis(SystemTime::now() - lagging).to_string();
    repo.modify::<ApiRegistration, _>(RecordRef::Registration(API), "registration", |r| {
        r.sync_id_updated_at = at.clone();
        kayra_catalog::repo::Change::Write
    })
    .await
    .unwrap();
    seed.subscription("core", API).await;
    let running = start_reconciler(&repo, ReconcilerConfig::default());
    eventually("synced", || async { seed.get("core", API).await.is_synced("s1") }).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_lag_is_observed_per_successful_sync() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    sync_once(Kind::Local, Duration::from_secs(30)).await;
    sync_once(Kind::Etcd, Duration::from_secs(30)).await;
    let rendered = handle.render();
    assert!(rendered.contains("# HELP kayra_sync_lag_seconds "), "{rendered}");
    assert_eq!(sample(&rendered, "kayra_sync_lag_seconds_count"), Some(2.0), "{rendered}");
    let sum = sample(&rendered, "kayra_sync_lag_seconds_sum").unwrap();
    assert!((60.0..120.0).contains(&sum), "two syncs 30 s behind: {sum}\n{rendered}");
}
