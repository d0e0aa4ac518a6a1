//! Error answers of a real server: the message on stderr, exit 1 for 4xx,
//! 2 for 5xx and an unreachable server.

use crate::common::server::Kayra;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_exit_1_with_the_servers_message() {
    let kayra = Kayra::start().await;
    let cli = &kayra.cli;
    kayra.register("core", "compute.example.com", "compute", "").await;

    // 404: out of scope registration, in the contract's own words.
    let run = cli.run(&["get", "catalog", "apiregistrations", "x.example.com"]).await.expect_code(1);
    assert_eq!(
        run.stderr,
        "Error from server (NotFound): api registration \"x.example.com\" not found in platform dev, region local\n"
    );
    assert_eq!(run.stdout, "");

    // 400: a short name where the long one is needed; the message names it.
    let run = cli.run(&["create", "catalog", "-n", "core", "subscriptions", "-d", r#"{"api": "compute"}"#]).await;
    let run = run.expect_code(1);
    assert!(run.stderr.starts_with("Error from server (BadRequest): "), "{run:#?}");
    assert!(run.stderr.contains("compute.example.com"), "{run:#?}");

    // 409: a duplicate.
    let run = cli.run(&["create", "catalog", "namespaces", "core"]).await.expect_code(1);
    assert!(run.stderr.starts_with("Error from server (Conflict): "), "{run:#?}");

    // 401: an unknown token, never echoed.
    let mut stranger = cli.clone();
    stranger.token = Some("not-a-real-token-but-secret".into());
    let run = stranger.run(&["get", "catalog", "namespaces"]).await.expect_code(1);
    assert!(run.stderr.starts_with("Error from server (Unauthorized)"), "{run:#?}");
    assert!(!run.stderr.contains("not-a-real-token-but-secret"));

    // No token at all: one line, no request.
    let mut anonymous = cli.clone();
    anonymous.token = None;
    let run = anonymous.run(&["get", "catalog", "namespaces"]).await.expect_code(1);
    assert_eq!(run.stderr, "error: no token: pass --token or set KAYRA_TOKEN\n");

    // An unknown short name for the gateway.
    let run = cli.run(&["get", "nosuch", "-n", "core", "vms"]).await.expect_code(1);
    assert!(run.stderr.contains("no API registration has the short name \"nosuch\""), "{run:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_exit_2() {
    let mut kayra = Kayra::with_reconciler().await;
    let cli = kayra.cli.clone();
    // A registration without an endpoint: the gateway answers 503 once the
    // subscription is active.
    kayra.register("core", "compute.example.com", "compute", "").await;
    kayra.subscribe_synced("core", "compute.example.com").await;
    let run = cli.run(&["get", "compute", "-n", "core", "vms"]).await.expect_code(2);
    assert!(run.stderr.starts_with("Error from server (Unavailable): "), "{run:#?}");

    // The server gone: a transport error.
    kayra.stop_server().await;
    let run = cli.run(&["get", "catalog", "namespaces"]).await.expect_code(2);
    assert!(run.stderr.starts_with(&format!("error: cannot reach {}/", cli.server)), "{run:#?}");
}
