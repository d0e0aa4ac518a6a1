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
//! - `backup`: `kayra export` and `kayra import` (platform §15).
//! - `notify`: `READY=1` to systemd once `/readyz` answers 200.

mod admin;
mod backup;
mod check;
mod dev;
mod fds;
mod logging;
mod notify;
mod render;
mod signal;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kayra_config::{Config, Env, LogFormat};

/// `--version`: the package version and the commit built (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("KAYRA_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "kayra", version = VERSION, about = "kayra: a multi-tenant control plane for infrastructure APIs")]
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
    /// Writes every record of the configured store as YAML documents (a backup), without `kayra serve`.
    Export(backup::ExportArgs),
    /// Writes a `kayra export` file into a store that holds none of its records.
    Import(backup::ImportArgs),
    /// Prints a shell completion script (e.g. `kayra completion bash`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
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
            Command::Export(args) => backup::export(args).await,
            Command::Import(args) => backup::import(args).await,
            Command::Completion { shell } => {
                let mut script = Vec::new();
                clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "kayra", &mut script);
                render::print(&String::from_utf8_lossy(&script))
            }
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
    // The stream cap the descriptor limit allows, which the hub enforces.
    config.server.max_streams = fds::raise_for(config.server.max_streams);
    // The recorder first: the store describes its metrics when it connects.
    kayra_server::metrics::handle();
    let store = kayra_store::Store::open(&config.database).await.context("open store")?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("listen on {}", config.server.listen))?;
    tracing::info!(listen = %listener.local_addr()?, platform = %config.platform, region = %config.region, "kayra serve listening");
    tokio::spawn(notify::when_ready(listener.local_addr()?, config.server.tls.is_some()));
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
    tokio::spawn(notify::when_ready(listener.local_addr()?, false));
    let admin = tokio::spawn(admin::serve(listener, store, reconciler.ready_flag(), cancel.clone()));
    let result = reconciler.run().await;
    cancel.cancel();
    let _ = admin.await;
    result.context("reconciler")?;
    tracing::info!("kayra reconciler exiting");
    Ok(())
}
