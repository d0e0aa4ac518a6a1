//! Steps 1–5: who gets through, in which order, and what a refusal says.

use reqwest::Method;
use serde_json::json;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{COMPUTE, STORAGE, World, both_backends, everything, gw, refused};

/// A GET of `path` exactly as written, over a raw connection; the status.
async fn raw_get(base: &str, path: &str, token: &str) -> u16 {
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8_lossy(&answer);
    answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("not HTTP: {answer}"))
}

both_backends! {
    /// The seed: while `active` is false every request to the api is
    /// refused; once set it is never cleared, so a later failed sync
    /// (`state: error`) leaves the api usable.
    async fn subscription_must_be_active_and_stays_usable_after_failed_syncs(server: Server) {
        let world = World::new(server).await;
        let token = world.user("alice", everything()).await;
        let path = gw(COMPUTE, "core", "vms");

        let message = refused(world.call(Method::GET, &path, Some(&token)).await, 403, &["core", COMPUTE, "\"init\""]);
        assert!(message.contains("not active"), "{message}");
        assert!(world.backend.seen().is_empty(), "nothing reaches the backend before activation");

        world.activate("core", COMPUTE).await;
        let reply = world.call(Method::GET, &path, Some(&token)).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        assert_eq!(reply.json["path"], path);

        world.fail_sync("core", COMPUTE).await;
        let view = world.server.get(&format!("/namespaces/core/subscriptions/{COMPUTE}")).await.expect(200);
        assert_eq!((view["active"].clone(), view["state"].clone()), (json!(true), json!("error")));
        let reply = world.call(Method::GET, &path, Some(&token)).await;
        assert_eq!(reply.status, 200, "an active subscription keeps working after a failed sync: {}", reply.text);
        assert_eq!(world.backend.seen().len(), 2);
    }

    /// An inactive subscription whose initial sync failed says how to retry;
    /// a namespace without a subscription says how to subscribe.
    async fn missing_or_failed_subscriptions_say_what_to_do(server: Server) {
        let world = World::new(server).await;
        let token = world.user("alice", everything()).await;
        world.fail_sync("core", COMPUTE).await;
        let message = refused(world.call(Method::GET, &gw(COMPUTE, "core", "vms"), Some(&token)).await, 403, &["\"error\""]);
        assert!(message.contains(&format!("/namespaces/core/subscriptions/{COMPUTE}/sync")), "{message}");

        world.namespace("other").await;
        let message = refused(world.call(Method::GET, &gw(COMPUTE, "other", "vms"), Some(&token)).await, 403, &["other", COMPUTE]);
        assert!(message.contains("no subscription"), "{message}");
        assert!(world.backend.seen().is_empty());
    }

    /// Step 1: no token, or an unknown one, is 401 with `WWW-Authenticate`.
    async fn unauthenticated_requests_are_401(server: Server) {
        let world = World::new(server).await;
        world.activate("core", COMPUTE).await;
        let path = gw(COMPUTE, "core", "vms");
        for token in [None, Some("kayra_not-a-real-token")] {
            let reply = world.call(Method::GET, &path, token).await;
            assert_eq!(reply.headers.get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
            refused(reply, 401, &[]);
        }
        assert!(world.backend.seen().is_empty());
    }

    /// Step 2: only the long name of a registration of this deployment.
    async fn apis_are_named_by_their_long_name(server: Server) {
        let world = World::new(server).await;
        world.activate("core", COMPUTE).await;
        let token = world.user("alice", everything()).await;

        let reply = world.call(Method::GET, &gw("compute", "core", "vms"), Some(&token)).await;
        refused(reply, 400, &["\"compute\"", COMPUTE, "short name"]);
        let reply = world.call(Method::GET, &gw("nope.example.com", "core", "vms"), Some(&token)).await;
        refused(reply, 404, &["nope.example.com", "platform dev", "region local"]);

        // Another deployment on the same store does not see this one's registration.
        let sibling = world.server.sibling("prod", "eu").await;
        let reply = sibling.call(Method::GET, &gw(COMPUTE, "core", "vms"), Some(&token), None).await;
        refused(reply, 404, &[COMPUTE, "platform prod", "region eu"]);

        // A catalog path that is no catalog route is not forwarded anywhere.
        let reply = world.call(Method::GET, "/apis/catalog.example.com/v1/namespaces/core/vms", Some(&token)).await;
        assert_eq!(reply.status, 404, "{}", reply.text);
        assert!(world.backend.seen().is_empty());
    }

    /// Step 3: the namespace must exist (404) and be active (403).
    async fn namespaces_must_exist_and_be_active(server: Server) {
        let world = World::new(server).await;
        let token = world.user("alice", everything()).await;
        refused(world.call(Method::GET, &gw(COMPUTE, "ghost", "vms"), Some(&token)).await, 404, &["\"ghost\""]);

        world.server.namespace("fresh").await;
        let message = refused(world.call(Method::GET, &gw(COMPUTE, "fresh", "vms"), Some(&token)).await, 403, &["\"fresh\""]);
        assert!(message.contains("not active"), "{message}");
        assert!(world.backend.seen().is_empty());
    }

    /// Step 4, role bindings: a binding in namespace A grants nothing in B,
    /// and grants only its verbs in A.
    async fn role_bindings_grant_only_in_their_namespace(server: Server) {
        let world = World::new(server).await;
        world.namespace("b").await;
        world.server.subscribe("b", COMPUTE).await;
        world.activate("core", COMPUTE).await;
        world.activate("b", COMPUTE).await;
        let rules = json!([{"apis": [COMPUTE], "resources": ["vms"], "verbs": ["get", "list"]}]);
        let token = world.user_in_namespace("bob", "core", rules).await;

        assert_eq!(world.call(Method::GET, &gw(COMPUTE, "core", "vms"), Some(&token)).await.status, 200);
        assert_eq!(world.call(Method::GET, &gw(COMPUTE, "core", "vms/web-1"), Some(&token)).await.status, 200);
        assert_eq!(world.call(Method::HEAD, &gw(COMPUTE, "core", "vms/web-1"), Some(&token)).await.status, 200);

        let reply = world.call(Method::GET, &gw(COMPUTE, "b", "vms"), Some(&token)).await;
        refused(reply, 403, &["\"bob\"", "\"list\"", "\"vms\"", COMPUTE, "namespace \"b\""]);
        let reply = world.call(Method::DELETE, &gw(COMPUTE, "core", "vms/web-1"), Some(&token)).await;
        refused(reply, 403, &["\"bob\"", "\"delete\"", "\"vms\"", COMPUTE, "\"core\""]);
        let reply = world.call(Method::GET, &gw(COMPUTE, "core", "disks"), Some(&token)).await;
        refused(reply, 403, &["\"disks\""]);
        assert_eq!(world.backend.seen().len(), 3);
    }

    /// Step 4, cluster roles: `apis: ["compute.example.com"]` grants that
    /// API everywhere and no other.
    async fn cluster_roles_grant_only_their_apis(server: Server) {
        let world = World::new(server).await;
        world.register(STORAGE, json!({})).await;
        world.server.subscribe("core", STORAGE).await;
        world.activate("core", COMPUTE).await;
        world.activate("core", STORAGE).await;
        let token = world.user("carol", json!([{"apis": [COMPUTE], "resources": ["*"], "verbs": ["*"]}])).await;

        assert_eq!(world.call(Method::POST, &gw(COMPUTE, "core", "vms"), Some(&token)).await.status, 201);
        let reply = world.call(Method::GET, &gw(STORAGE, "core", "buckets"), Some(&token)).await;
        refused(reply, 403, &["\"carol\"", "\"list\"", "\"buckets\"", STORAGE]);
        assert_eq!(world.backend.seen().len(), 1);
    }

    /// Paths that would authorize one thing and forward another are refused.
    async fn unsafe_paths_are_refused(server: Server) {
        let world = World::new(server).await;
        world.activate("core", COMPUTE).await;
        let token = world.user("alice", everything()).await;
        refused(world.call(Method::GET, &gw(COMPUTE, "core", "vm%73"), Some(&token)).await, 400, &["percent-encoded"]);
        // reqwest normalises dot segments away, as browsers do; a raw client need not.
        for rest in ["vms/../../other/vms", "vms/%2e%2E/%2e%2e/other/vms"] {
            let status = raw_get(&world.server.base, &gw(COMPUTE, "core", rest), &token).await;
            assert_eq!(status, 400, "{rest}");
        }
        let reply = world.call(Method::GET, &format!("/apis/{COMPUTE}/v1/clusters/core/vms"), Some(&token)).await;
        refused(reply, 404, &[]);
        assert!(world.backend.seen().is_empty());
    }
}
