//! `kayra check --config FILE` (platform §10): the reconciler's own startup
//! validation — the whole config, then every step template and secret name
//! through [`Pipelines::compile`], then the notification sinks' secret names
//! and headers ([`Sinks::compile`]) — without a store, a listener or a call.

use kayra_pipeline::Pipelines;
use kayra_reconciler::notify::Sinks;

use crate::Common;

/// Validates the config exactly as `kayra reconciler` does at startup.
/// `Ok` prints `config ok`; an error is the message the reconciler would
/// stop with (mode, step and field), printed by `main` with exit code 1.
pub async fn run(common: Common) -> anyhow::Result<()> {
    let config = common.load()?;
    Pipelines::compile(&config.reconciler)?;
    Sinks::compile(&config.notifications, &config.reconciler)?;
    crate::render::print("config ok\n")?;
    Ok(())
}
