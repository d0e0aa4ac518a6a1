//! The seed's two `kayra-cli` commands, exactly as written, through a shell.

use crate::common::Run;
use crate::common::server::Kayra;

/// The seed's text, character for character.
const SEED_CREATE: &str = r#"kayra-cli create catalog -n core subscriptions -d '{"api": "compute.example.com"}'"#;
const SEED_RESYNC: &str = r#"kayra-cli update catalog -n sre subscriptions dev.example.com/sync -d '{}'"#;

/// Runs a command line through `sh -c`, with `kayra-cli` being the built binary.
async fn shell(kayra: &Kayra, line: &str) -> Run {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_kayra-cli"));
    let dir = bin.parent().expect("the binary has a directory");
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut cli = kayra.cli.clone();
    cli.env.push(("PATH".into(), path));
    let out = tokio::process::Command::new("sh")
        .args(["-c", line])
        .env_remove("KAYRA_TOKEN")
        .env("KAYRA_SERVER", &cli.server)
        .env("KAYRA_TOKEN", cli.token.as_deref().unwrap_or_default())
        .envs(cli.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .await
        .expect("run sh");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_examples_work_as_written() {
    let kayra = Kayra::with_reconciler().await;
    kayra.register("core", "compute.example.com", "compute", "").await;
    kayra.register("sre", "dev.example.com", "dev", "").await;

    let created = shell(&kayra, SEED_CREATE).await.ok();
    let sub = created.json();
    assert_eq!(sub["api"], "compute.example.com");
    assert_eq!(sub["namespace"], "core");
    assert_eq!(sub["state"], "init");
    assert_eq!(sub["active"], false);

    // Let the reconciler bring dev.example.com in sre up to date first, so
    // the re-sync visibly resets something.
    kayra.cli.run(&["create", "catalog", "-n", "sre", "subscriptions", "dev.example.com"]).await.ok();
    let args =
        ["get", "catalog", "-n", "sre", "subscriptions", "dev.example.com", "--until-synced", "--interval", "50ms"];
    kayra.cli.run(&args).await.ok();

    let resynced = shell(&kayra, SEED_RESYNC).await.ok();
    let sub = resynced.json();
    assert_eq!(sub["api"], "dev.example.com");
    assert_eq!(sub["namespace"], "sre");
    assert_eq!(sub["current_sync_id"], "", "the re-sync resets current_sync_id: {resynced:#?}");
    assert_eq!(sub["active"], true, "active is left as it was");
    assert_eq!(sub["state"], "success", "state is left as it was");

    // The reset is the whole trigger: the reconciler syncs it again.
    kayra.cli.run(&args).await.ok();
}
