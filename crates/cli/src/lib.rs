//! `kayra-cli`, the client of kayra's catalog API and gateway (platform
//! contract §9):
//!
//! ```text
//! kayra-cli [--server URL] [--token TOKEN] [-o table|json|yaml] VERB API [-n NAMESPACE] RESOURCE [NAME[/SUBRESOURCE]] [-d DATA]
//! ```
//!
//! The binary (`src/main.rs`) only parses arguments, starts a runtime and
//! turns [`Error`] into an exit status; everything else is here, so it can
//! be unit-tested without a server.
//!
//! # Layout
//! - [`args`]: the clap model, `--help` text, durations.
//! - [`apply`]: `apply -f`, documents checked, then created or patched.
//! - [`request`]: arguments → method, path, body (pure).
//! - [`data`]: `-d` as JSON/YAML, `@FILE`, `@-`.
//! - [`client`]: HTTP, error answers, paging, short-name resolution.
//! - [`output`]: JSON, YAML and the tables.
//! - [`grid`]: cells and column layout, shared by every table.
//! - [`watch`]: `--watch` (the server's watch stream) / `--until-synced`.
//! - [`wait`]: `update ... NAME/sync --wait`, the fan-out's progress.
//! - [`rollout`]: a registration's rollout as a table of its waves.
//! - [`runs`]: the table of a subscription's runs.
//! - [`error`]: the error type and its exit statuses.

pub mod apply;
pub mod args;
pub mod client;
pub mod data;
pub mod error;
pub mod escape;
pub mod grid;
pub mod output;
pub mod request;
pub mod rollout;
pub mod runs;
pub mod wait;
pub mod watch;

use clap::CommandFactory;
use serde_json::Value;

pub use args::Cli;
use args::{Command, GetArgs, GlobalArgs, TargetArgs};
use client::{Body, Client};
pub use error::Error;
use output::{Format, emit, is_list, render};
use request::{Api, Request, Target, Verb};

/// Runs one parsed command line to completion.
pub async fn run(cli: Cli) -> Result<(), Error> {
    let Cli { global, command } = cli;
    match command {
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kayra-cli", &mut script);
            emit(&script)
        }
        Command::Get(get) => {
            let watch = (get.watch || get.until_synced).then(|| watch_options(&get));
            execute(&global, Verb::Get, &get.target, None, Follow::from(watch)).await
        }
        Command::Create(write) => {
            refuse_wait(&write)?;
            execute(&global, Verb::Create, &write.target, write.data.as_deref(), Follow::No).await
        }
        Command::Update(write) => {
            let follow = if write.wait { Follow::Wait(write.timeout) } else { Follow::No };
            execute(&global, Verb::Update, &write.target, write.data.as_deref(), follow).await
        }
        Command::Patch(write) => {
            refuse_wait(&write)?;
            execute(&global, Verb::Patch, &write.target, write.data.as_deref(), Follow::No).await
        }
        Command::Delete(target) => execute(&global, Verb::Delete, &target, None, Follow::No).await,
        Command::Apply(args) => apply::run(&global, &args).await,
    }
}

/// The client of `--server`, `--token` and `--reason`; nothing is sent yet.
pub(crate) fn client(global: &GlobalArgs) -> Result<Client, Error> {
    Client::new(&global.server, global.token.as_deref())?.with_reason(global.reason.as_deref())
}

/// What happens after the request: nothing more, a watch, or `--wait`.
enum Follow {
    No,
    Watch(watch::Options),
    Wait(std::time::Duration),
}

impl Follow {
    fn from(watch: Option<watch::Options>) -> Follow {
        watch.map_or(Follow::No, Follow::Watch)
    }
}

fn refuse_wait(write: &args::WriteArgs) -> Result<(), Error> {
    if write.wait {
        return Err(error::invalid("--wait only goes with `update catalog apiregistrations NAME/sync`"));
    }
    Ok(())
}

fn watch_options(get: &GetArgs) -> watch::Options {
    watch::Options { interval: get.interval, until_synced: get.until_synced, timeout: get.timeout }
}

/// One verb: check everything that can be checked offline, then resolve a
/// short API name, send, and print.
async fn execute(
    global: &GlobalArgs,
    verb: Verb,
    args: &TargetArgs,
    data: Option<&str>,
    follow: Follow,
) -> Result<(), Error> {
    let mut target = Target::new(&args.api, args.namespace.as_deref(), &args.resource, args.name.as_deref())?;
    let waits_for = match (&follow, &target.object) {
        (Follow::Wait(_), Some(object))
            if target.is_catalog()
                && target.resource == "apiregistrations"
                && object.sub.iter().map(String::as_str).eq(["sync"]) =>
        {
            Some(object.name.clone())
        }
        (Follow::Wait(_), _) => {
            return Err(error::invalid("--wait only goes with `update catalog apiregistrations NAME/sync`"));
        }
        _ => None,
    };
    // A blocking read is fine here: nothing else runs yet on this runtime.
    let data = data.map(|spec| data::load(spec, std::io::stdin().lock())).transpose()?;
    let mut request = Request::build(verb, &target, data.clone())?;
    let client = client(global)?;
    if let Api::Short(_) = target.api {
        target.api = client.resolve(&target.api).await?;
        request = Request::build(verb, &target, data)?;
    }
    let call = Call { client: &client, request: &request, target: &target, verb };
    match follow {
        // The server's watch stream, for anything of the catalog.
        Follow::Watch(options) if !options.until_synced && target.is_catalog() => {
            let printer = watch::Printer::new(global.output.unwrap_or(Format::Table), target.view());
            watch::follow(&client, &request, printer, |text| emit(text.as_bytes())).await
        }
        Follow::Watch(options) => call.watch(global.output.unwrap_or(Format::Table), options).await,
        Follow::Wait(timeout) => {
            let name = waits_for.unwrap_or_default();
            if let Body::Json(registration) = client.send(&request).await? {
                let sync_id = crate::escape::escape_controls(
                    registration.get("sync_id").and_then(Value::as_str).unwrap_or_default(),
                );
                eprintln!("{name}: sync_id is now {sync_id}; waiting for every subscriber");
            }
            wait::run(&client, &name, timeout).await
        }
        Follow::No => call.once(global.output).await,
    }
}

/// One request about to be made, with what it takes to show its answer.
struct Call<'a> {
    client: &'a Client,
    request: &'a Request,
    target: &'a Target,
    verb: Verb,
}

impl Call<'_> {
    async fn fetch(&self) -> Result<Body, Error> {
        // Only the catalog's list format is known; a gateway answer is shown as it comes.
        if self.verb == Verb::Get && self.target.is_collection() && self.target.is_catalog() {
            self.client.get_all(self.request).await
        } else {
            self.client.send(self.request).await
        }
    }

    /// Sends the request once and prints the answer: lists as a table,
    /// single objects as JSON, unless `-o` says otherwise.
    async fn once(&self, format: Option<Format>) -> Result<(), Error> {
        match self.fetch().await? {
            Body::Empty => {
                if self.verb == Verb::Delete {
                    eprintln!("deleted {}", self.target.describe());
                }
                Ok(())
            }
            // A backend's own answer: shown as text, its control characters escaped.
            Body::Raw(bytes) => emit(&crate::escape::escape_raw(&bytes)),
            Body::Json(value) => {
                // A rollout is read for its waves: a table unless `-o` (§12).
                let waves = self.verb == Verb::Get && self.target.view() == request::View::Rollout;
                let format = format.unwrap_or(if is_list(&value) || waves { Format::Table } else { Format::Json });
                if let Some(note) = empty_list_note(&value, format, self.target) {
                    eprint!("{note}");
                    return Ok(());
                }
                emit(render(&value, self.target.view(), format)?.as_bytes())
            }
        }
    }

    /// `--watch`: prints the answer each time it differs from the last one
    /// printed, and each distinct transient failure once.
    async fn watch(&self, format: Format, options: watch::Options) -> Result<(), Error> {
        let mut last_shown: Option<String> = None;
        let mut last_warning: Option<String> = None;
        let fetch = || async {
            match self.fetch().await? {
                Body::Json(value) => Ok(value),
                _ => Err(Error::Transport("the answer is not JSON, so it cannot be watched".into())),
            }
        };
        watch::run(options, fetch, |update| match update {
            watch::Update::Answer(value) => {
                last_warning = None;
                let (text, is_note) = match empty_list_note(value, format, self.target) {
                    Some(note) => (note, true),
                    None => (render(value, self.target.view(), format)?, false),
                };
                if last_shown.as_deref() != Some(text.as_str()) {
                    if is_note {
                        eprint!("{text}");
                    } else {
                        emit(text.as_bytes())?;
                    }
                    last_shown = Some(text);
                }
                Ok(())
            }
            watch::Update::Retrying(error) => {
                let text = error.to_string();
                if last_warning.as_deref() != Some(text.as_str()) {
                    eprintln!("{text} (retrying every {:?})", options.interval);
                    last_warning = Some(text);
                }
                Ok(())
            }
        })
        .await
    }
}

/// kubectl's "No resources found": an empty table says so on stderr, so
/// stdout stays empty for scripts.
fn empty_list_note(value: &Value, format: Format, target: &Target) -> Option<String> {
    let empty = value.get("items").and_then(Value::as_array).is_some_and(Vec::is_empty);
    if format != Format::Table || !empty {
        return None;
    }
    if let (request::View::Runs, Some(object), Some(ns)) = (target.view(), &target.object, &target.namespace) {
        return Some(format!("No runs found for the subscription of namespace {ns} to {}.\n", object.name));
    }
    Some(match &target.namespace {
        Some(ns) => format!("No {} found in namespace {ns}.\n", target.resource),
        None => format!("No {} found.\n", target.resource),
    })
}
