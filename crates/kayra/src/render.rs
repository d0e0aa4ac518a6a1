//! `kayra render --config FILE -n NAMESPACE API` (platform §10): what each
//! step of the subscription's mode would send now, from the reconciler's
//! own compiled pipeline and rendering code ([`kayra_pipeline::Pipeline::render`]),
//! with secrets `<redacted>` and a later step's `.Previous.Outputs.X` as
//! `<output X of step N>`. It reads the subscription and its registration
//! through the catalog's repository and writes nothing: no HTTP call, no
//! store write.

use anyhow::{Context, bail};
use clap::Args;
use kayra_catalog::repo::Repository;
use kayra_pipeline::{Pipelines, SubscriptionContext, format_rendered};

use crate::Common;

#[derive(Args, Clone, Debug)]
pub struct RenderArgs {
    #[command(flatten)]
    common: Common,
    /// The subscription's namespace.
    #[arg(short = 'n', long = "namespace")]
    namespace: String,
    /// The subscribed API (its registration's name).
    api: String,
}

pub async fn run(args: RenderArgs) -> anyhow::Result<()> {
    let config = args.common.load()?;
    let pipelines = Pipelines::compile(&config.reconciler)?;
    let (namespace, api) = (&args.namespace, &args.api);
    let missing = |what: &str| format!("{what} not found (namespace {namespace:?}, api {api:?})");
    // Opening a local store that does not exist would create it: a write.
    if let Some(local) = &config.database.local
        && !local.path.exists()
    {
        bail!("{}: store {} does not exist", missing("subscription"), local.path.display());
    }
    let store = kayra_store::Store::open(&config.database).await.context("open store")?;
    let repo = Repository::new(store, &config.platform, &config.region);
    let Some(subscription) = repo.get_subscription(namespace, api).await.context("read subscription")? else {
        bail!("{}", missing("subscription"));
    };
    let Some(registration) = repo.get_registration(api).await.context("read registration")? else {
        bail!("{}", missing("api registration"));
    };
    let (subscription, registration) = (subscription.value, registration.value);
    let Some(mode) = config.reconciler.resolve_mode(&registration.mode) else {
        bail!(
            "api registration {api:?} has no mode and reconciler.default_mode is empty: \
             a reconcile would fail (namespace {namespace:?}, api {api:?})"
        );
    };
    let Some(pipeline) = pipelines.get(mode) else {
        print(&format!("mode {mode:?} has no steps: the placeholder reconcile would succeed\n"))?;
        return Ok(());
    };
    // The context the reconciler builds for a run (crates/catalog reconciler).
    let ctx = SubscriptionContext {
        api: registration.name.clone(),
        short_name: registration.short_name.clone(),
        namespace: subscription.namespace.clone(),
        platform: config.platform.clone(),
        region: config.region.clone(),
        current_sync_id: subscription.current_sync_id.clone(),
        expected_sync_id: registration.sync_id.clone(),
        ..SubscriptionContext::default()
    };
    let steps = pipeline.render(&ctx)?;
    print(&format_rendered(&steps))
}

/// Writes to stdout; a closed pipe (`kayra render | head`) is an error,
/// not a panic.
pub fn print(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).context("write to stdout")
}
