//! The rollout metrics (platform §12): `kayra_rollout_wave{api}` (index of
//! the current wave) and `kayra_rollouts{state}`. Its own test binary: the
//! metrics recorder is process-global.

mod common;

use common::backend::TestBackend;
use common::{Kind, Seed, eventually, one_step_mode, start_reconciler, store};
use kayra_catalog::repo::{RecordRef, Repository};
use kayra_config::ReconcilerConfig;
use kayra_core::ApiRegistration;
use kayra_core::rollout::{Approval, RolloutPolicy, WavePolicy};

const API: &str = "compute.example.com";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_wave_and_rollouts_by_state_are_gauges() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    let store = store(Kind::Local).await;
    let repo = Repository::new(store.store.clone(), "dev", "local");
    let backend = TestBackend::start().await;
    let mut cfg = ReconcilerConfig::default();
    one_step_mode(&mut cfg, "api", &format!("{}/ok/x", backend.base));
    let running = start_reconciler(&repo, cfg);
    let seed = Seed(&repo);
    seed.registration(API, "api", "s1").await;
    for ns in ["a", "b"] {
        seed.namespace(ns).await;
        seed.subscription(ns, API).await;
        eventually("at s1", || async { seed.get(ns, API).await.is_synced("s1") }).await;
    }
    let policy = RolloutPolicy {
        waves: vec![
            WavePolicy { name: "first".into(), size: "1".into(), ..WavePolicy::default() },
            WavePolicy { name: "second".into(), approval: Approval::Manual, ..WavePolicy::default() },
        ],
        ..RolloutPolicy::default()
    };
    repo.modify::<ApiRegistration, _>(RecordRef::Registration(API), "registration", |r| {
        r.sync_id = "s2".into();
        r.rollout = Some(policy.clone());
        kayra_catalog::repo::Change::Write
    })
    .await
    .unwrap();
    let has = |line: &str| {
        let rendered = handle.render();
        rendered.lines().any(|l| l == line)
    };
    eventually("the second wave is current", || async {
        has("kayra_rollout_wave{api=\"compute.example.com\"} 1") && has("kayra_rollouts{state=\"waiting\"} 1")
    })
    .await;
    let rendered = handle.render();
    assert!(rendered.contains("# HELP kayra_rollouts "), "{rendered}");
    assert!(rendered.lines().any(|l| l == "kayra_rollouts{state=\"completed\"} 0"), "{rendered}");
    running.stop().await;
}
