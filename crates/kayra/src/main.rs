//! The `kayra` binary: `serve`, `reconciler` and `dev`, each a thin shell
//! over the library crates. Every subcommand takes `--config`,
//! `--log-format` and `--listen` (platform contract §2).
//!
//! # Layout
//! - this file: argument parsing, config loading, the two long-running
//!   processes.
//! - `logging`: tracing initialisation (text, or flat JSON lines).
//! - `admin`: the reconciler's `/healthz`, `/readyz`, `/metrics` listener.
//! - `dev`: `kayra dev`, which runs `serve` and `reconciler` as children.
//! - `signal`: SIGTERM/SIGINT as a cancellation token.
//! - `check`, `render`: `kayra check` and `kayra render` (platform §10).

mod admin;
mod check;
mod dev;
mod fds;
mod logging;
mod render;
mod signal;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kayra_config::{Config, Env, LogFormat};

#[derive(Parser)]
#[command(name = "kayra", version, about = "kayra: a multi-tenant control plane for infrastructure APIs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The HTTP API server: catalog API and gateway.
    Serve(Common),
    /// The controller that activates namespaces and reconciles subscriptions.
    Reconciler(Common),
    /// Runs `serve` and `reconciler` on the local store, for a laptop.
    Dev(Common),
    /// Validates the config and every step template as the reconciler's startup does.
    Check(Common),
    /// Prints the requests a subscription's steps would send now, without sending them.
    Render(render::RenderArgs),
}

/// Flags every subcommand takes.
#[derive(Args, Clone, Debug, Default)]
pub struct Common {
    /// The configuration file (default: ./kayra.yaml if present, else built-in defaults).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Log format: text or json (overrides logging.format).
    #[arg(long, value_parser = ["text", "json"], global = true)]
    log_format: Option<String>,
    /// Listen address (overrides server.listen for serve, reconciler.listen for reconciler).
    #[arg(long, global = true)]
    listen: Option<String>,
}

impl Common {
    fn load(&self) -> anyhow::Result<Config> {
        let mut config = Config::load(self.config.as_deref(), &Env::from_process())?;
        if let Some(format) = &self.log_format {
            config.logging.format = if format == "json" { LogFormat::Json } else { LogFormat::Text };
        }
        Ok(config)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kayra: start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(common) => serve(common).await,
            Command::Reconciler(common) => reconciler(common).await,
            Command::Dev(common) => dev::run(common).await,
            Command::Check(common) => check::run(common).await,
            Command::Render(args) => render::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kayra: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(common: Common) -> anyhow::Result<()> {
    let mut config = common.load()?;
    if let Some(listen) = &common.listen {
        kayra_config::check_listen(listen).map_err(|message| anyhow::anyhow!("--listen: {message}"))?;
        config.server.listen = listen.clone();
    }
    logging::init(config.logging.format);
    fds::raise_for(config.server.max_streams);
    // The recorder first: the store describes its metrics when it connects.
    kayra_server::metrics::handle();
    let store = kayra_store::Store::open(&config.database).await.context("open store")?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("listen on {}", config.server.listen))?;
    tracing::info!(listen = %listener.local_addr()?, platform = %config.platform, region = %config.region, "kayra serve listening");
    let shutdown = signal::shutdown_token();
    kayra_server::run(config, store, listener, async move { shutdown.cancelled().await }).await
}

async fn reconciler(common: Common) -> anyhow::Result<()> {
    let mut config = common.load()?;
    if let Some(listen) = &common.listen {
        kayra_config::check_listen(listen).map_err(|message| anyhow::anyhow!("--listen: {message}"))?;
        config.reconciler.listen = listen.clone();
    }
    logging::init(config.logging.format);
    let cancel = signal::shutdown_token();
    // The recorder first: the store describes its metrics when it connects,
    // and the reconciler describes its own and sets them to zero as it
    // starts (present from startup, platform §8).
    kayra_server::metrics::handle();
    let store = kayra_store::Store::open(&config.database).await.context("open store")?;
    let repo = kayra_catalog::repo::Repository::new(store.clone(), &config.platform, &config.region);
    let reconciler = kayra_reconciler::Reconciler::new(repo, config.reconciler.clone(), cancel.clone())?
        .with_notifications(&config.notifications)?;
    let listener = tokio::net::TcpListener::bind(&config.reconciler.listen)
        .await
        .with_context(|| format!("listen on {}", config.reconciler.listen))?;
    tracing::info!(listen = %listener.local_addr()?, platform = %config.platform, region = %config.region, "kayra reconciler started");
    let admin = tokio::spawn(admin::serve(listener, store, reconciler.ready_flag(), cancel.clone()));
    let result = reconciler.run().await;
    cancel.cancel();
    let _ = admin.await;
    result.context("reconciler")?;
    tracing::info!("kayra reconciler exiting");
    Ok(())
}
