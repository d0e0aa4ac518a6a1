//! The command line, as clap derive types (platform contract §9):
//!
//! ```text
//! kayra-cli [--server URL] [--token TOKEN] [-o table|json|yaml] VERB API [-n NAMESPACE] RESOURCE [NAME[/SUBRESOURCE]] [-d DATA]
//! ```
//!
//! Every verb is a subcommand sharing the same positional shape, so clap
//! gives each its own `--help` and shell completion knows the verbs. The
//! three global flags are `global = true`, so they may appear anywhere.
//! Nothing here talks to the network; [`crate::request`] turns these values
//! into a request.

use std::fmt;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::output::Format;

/// Shown after `kayra-cli --help`: the seed's two examples come first,
/// because they are the contract (they must work exactly as written).
const EXAMPLES: &str = "\
Examples:
  # Subscribe namespace core to an API (the seed's example)
  kayra-cli create catalog -n core subscriptions -d '{\"api\": \"compute.example.com\"}'

  # Force one subscription to re-sync (the seed's example)
  kayra-cli update catalog -n sre subscriptions dev.example.com/sync -d '{}'

  # Create a namespace; register an API from a file (-d takes JSON or YAML, @FILE, @- for stdin)
  kayra-cli create catalog namespaces core
  kayra-cli create catalog apiregistrations -d @compute.yaml

  # See where every subscriber of an API stands, and wait until all are synced
  kayra-cli get catalog apiregistrations compute.example.com/status -o table
  kayra-cli get catalog apiregistrations compute.example.com/status --until-synced

  # Bump an API's SyncID, which re-syncs every subscriber, and follow the fan-out
  kayra-cli update catalog apiregistrations compute.example.com/sync
  kayra-cli update catalog apiregistrations compute.example.com/sync -d '{}' --wait --timeout 30s

  # Follow changes as they happen; see what the reconciler did
  kayra-cli get catalog -n core subscriptions --watch
  kayra-cli get catalog -n core subscriptions compute.example.com/runs
  kayra-cli get catalog -n core subscriptions compute.example.com/runs/ID -o yaml

  # Stop a run in flight (recorded cancelled; the next trigger runs the job again)
  kayra-cli update catalog -n core subscriptions compute.example.com/runs/ID/cancel -d '{\"reason\": \"bad canary\"}'

  # Call a registered API through the gateway (short or long name)
  kayra-cli get compute -n core vms

  # Make the catalog match files (kind: Namespace, ApiRegistration, ...); see first, then do it
  kayra-cli apply -f platform/ --dry-run
  kayra-cli apply -f platform/ --reason \"onboard team core (TICKET-42)\"

  # Say why: every change carries the reason into the audit trail (or set KAYRA_REASON)
  kayra-cli --reason \"rotate after incident 7\" delete catalog users alice/tokens/ID

Exit status:
  0  success
  1  the request was refused: a 4xx answer, or arguments/data that cannot make a request;
     with --wait: some subscriber failed to sync; with apply: some object failed
  2  the server failed (5xx) or could not be reached
  3  --until-synced or --wait gave up after --timeout";

/// `--version`: the package version and the commit built (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("KAYRA_COMMIT"), ")");

/// `kayra-cli`: the command-line client of kayra's catalog API and gateway.
#[derive(Debug, Parser)]
#[command(name = "kayra-cli", version = VERSION, about, after_help = EXAMPLES)]
#[command(propagate_version = true, subcommand_required = true, arg_required_else_help = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every verb takes, anywhere on the line.
#[derive(Clone, Args)]
pub struct GlobalArgs {
    /// Base URL of `kayra serve`.
    #[arg(long, env = "KAYRA_SERVER", default_value = "http://localhost:8080", value_name = "URL", global = true)]
    pub server: String,

    /// Bearer token. Prefer the environment variable: a flag shows up in
    /// the shell history and the process list.
    // `hide_env_values`: `--help` would otherwise print the token.
    #[arg(long, env = "KAYRA_TOKEN", hide_env_values = true, value_name = "TOKEN", global = true)]
    pub token: Option<String>,

    /// Output format [default: table for lists and --watch, json for one object].
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT", global = true)]
    pub output: Option<Format>,

    /// Why: sent as `X-Kayra-Reason` on every request of this command, and
    /// kept in the audit trail of every change it makes (at most 1024
    /// characters, no control characters).
    #[arg(long, env = "KAYRA_REASON", value_name = "TEXT", global = true)]
    pub reason: Option<String>,
}

// Written by hand so that no `{:?}` of the arguments can ever show the token.
impl fmt::Debug for GlobalArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobalArgs")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("output", &self.output)
            .field("reason", &self.reason)
            .finish()
    }
}

/// The verbs, and `completion`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read one object, or list a collection when NAME is omitted.
    Get(GetArgs),
    /// Create an object (POST to the collection).
    ///
    /// With NAME (and no -d field saying otherwise) the NAME becomes the
    /// object's `name` (`api` for subscriptions), so
    /// `kayra-cli create catalog namespaces core` is enough.
    Create(WriteArgs),
    /// Replace an object's writable fields (PUT).
    ///
    /// `update catalog apiregistrations NAME/sync` and
    /// `update catalog -n NS subscriptions API/sync` are the force re-sync
    /// shorthands; their body defaults to `{}`.
    Update(WriteArgs),
    /// Change some fields of an object (PATCH, a JSON merge patch).
    Patch(WriteArgs),
    /// Delete an object.
    Delete(TargetArgs),
    /// Create or update objects from files: `kind: Namespace`, `User`, `Role`,
    /// `ApiRegistration`, `ClusterRoleBinding`, `RoleBinding`, `Subscription`.
    ///
    /// Every document is checked before any request; then, kind by kind in
    /// that order (file order within a kind), an absent object is created,
    /// one that differs in a field the document sets is patched with those
    /// fields (fields left out keep their values), anything else is left
    /// alone. One line per object: `Kind/[namespace/]name created|configured|unchanged`.
    /// Exit 1 when any object failed (the others are still applied).
    Apply(ApplyArgs),
    /// Print a shell completion script.
    ///
    /// For example: `kayra-cli completion bash > /etc/bash_completion.d/kayra-cli`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// What a command acts on: `API [-n NAMESPACE] RESOURCE [NAME[/SUBRESOURCE]]`.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// `catalog`, or a registered API's short or long name (reached through the gateway).
    #[arg(value_name = "API")]
    pub api: String,

    /// The resource type, e.g. namespaces, apiregistrations, subscriptions, users.
    #[arg(value_name = "RESOURCE")]
    pub resource: String,

    /// The object's name, optionally followed by a subresource: `core`,
    /// `compute.example.com/status`, `dev.example.com/sync`, `alice/tokens/ID`.
    #[arg(value_name = "NAME[/SUBRESOURCE]")]
    pub name: Option<String>,

    /// The namespace, for namespaced resources and every gateway request.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// `get`: a target plus the watch options.
#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Follow the server's watch stream and print a row per change as it
    /// happens (the type of change first), until Ctrl-C. Through the gateway,
    /// re-fetch every --interval instead.
    #[arg(short = 'w', long)]
    pub watch: bool,

    /// With --until-synced (or --watch through the gateway): how long to wait between fetches (e.g. 500ms, 2s, 1m).
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,

    /// Watch until everything is synced, then exit 0 (implies --watch). Works on
    /// subscriptions and on `apiregistrations NAME/status`.
    #[arg(long)]
    pub until_synced: bool,

    /// With --until-synced: give up (exit 3) after this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
}

/// `create`, `update`, `patch`: a target plus the request body.
#[derive(Debug, Clone, Args)]
pub struct WriteArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// The request body: a JSON or YAML document, `@FILE`, or `@-` for stdin.
    #[arg(short = 'd', long, value_name = "DATA")]
    pub data: Option<String>,

    /// With `update catalog apiregistrations NAME/sync`: show the fan-out's
    /// progress until every subscriber is synced or failed; exit 0 when all
    /// synced, 1 when any failed, 3 on --timeout.
    #[arg(long)]
    pub wait: bool,

    /// With --wait: give up (exit 3) after this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION", requires = "wait")]
    pub timeout: Duration,
}

/// `apply`: where the documents are, and whether to write.
#[derive(Debug, Clone, Args)]
pub struct ApplyArgs {
    /// A YAML or JSON file, a directory (its *.yaml, *.yml, *.json, in name
    /// order, not recursive) or `-` for stdin. May be given more than once.
    #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
    pub files: Vec<String>,

    /// Read and compare, but write nothing: each line says what would happen.
    #[arg(long)]
    pub dry_run: bool,
}

/// Parses `500ms`, `2s`, `5m`, `1h`, `1m30s`, or a bare number of seconds.
///
/// A zero duration is refused: an `--interval` of zero would hammer the
/// server, a `--timeout` of zero could never succeed.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?}: expected e.g. 500ms, 2s, 5m, 1h or 1m30s");
    let text = text.trim();
    if text.is_empty() {
        return Err(bad());
    }
    let total = if text.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(text.parse().map_err(|_| bad())?)
    } else {
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
            if digits == 0 {
                return Err(bad());
            }
            let amount: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
            let unit = match &rest[..unit_len] {
                "ms" => Duration::from_millis(1),
                "s" => Duration::from_secs(1),
                "m" => Duration::from_secs(60),
                "h" => Duration::from_secs(3600),
                _ => return Err(bad()),
            };
            let amount = u32::try_from(amount).map_err(|_| bad())?;
            total = unit.checked_mul(amount).and_then(|d| total.checked_add(d)).ok_or_else(bad)?;
            rest = &rest[unit_len..];
        }
        total
    };
    if total.is_zero() {
        return Err(format!("invalid duration {text:?}: must be greater than zero"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        let mut argv = vec!["kayra-cli"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn clap_model_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn seed_examples_parse() {
        let cli =
            parse(&["create", "catalog", "-n", "core", "subscriptions", "-d", r#"{"api": "compute.example.com"}"#]);
        let Command::Create(args) = cli.command else { panic!("not create") };
        assert_eq!(args.target.api, "catalog");
        assert_eq!(args.target.namespace.as_deref(), Some("core"));
        assert_eq!(args.target.resource, "subscriptions");
        assert_eq!(args.target.name, None);
        assert_eq!(args.data.as_deref(), Some(r#"{"api": "compute.example.com"}"#));

        let cli = parse(&["update", "catalog", "-n", "sre", "subscriptions", "dev.example.com/sync", "-d", "{}"]);
        let Command::Update(args) = cli.command else { panic!("not update") };
        assert_eq!(args.target.namespace.as_deref(), Some("sre"));
        assert_eq!(args.target.name.as_deref(), Some("dev.example.com/sync"));
        assert_eq!(args.data.as_deref(), Some("{}"));
    }

    #[test]
    fn global_flags_go_anywhere() {
        let before = parse(&["--server", "http://s:1", "-o", "yaml", "--token", "t", "get", "catalog", "namespaces"]);
        let after = parse(&["get", "catalog", "namespaces", "--server", "http://s:1", "-o", "yaml", "--token", "t"]);
        let middle = parse(&["get", "-o", "yaml", "catalog", "--token", "t", "namespaces", "--server", "http://s:1"]);
        for cli in [before, after, middle] {
            assert_eq!(cli.global.server, "http://s:1");
            assert_eq!(cli.global.token.as_deref(), Some("t"));
            assert_eq!(cli.global.output, Some(Format::Yaml));
        }
    }

    #[test]
    fn namespace_flag_goes_anywhere_after_the_verb() {
        for args in [
            &["get", "-n", "core", "catalog", "subscriptions"][..],
            &["get", "catalog", "-n", "core", "subscriptions"][..],
            &["get", "catalog", "subscriptions", "--namespace", "core"][..],
        ] {
            let Command::Get(get) = parse(args).command else { panic!("not get") };
            assert_eq!(get.target.namespace.as_deref(), Some("core"), "{args:?}");
            assert_eq!(get.target.resource, "subscriptions");
        }
    }

    #[test]
    fn watch_defaults() {
        let Command::Get(get) = parse(&["get", "catalog", "namespaces"]).command else { panic!() };
        assert!(!get.watch && !get.until_synced);
        assert_eq!(get.interval, Duration::from_secs(2));
        assert_eq!(get.timeout, Duration::from_secs(300));
    }

    #[test]
    fn data_is_not_a_get_or_delete_flag() {
        let argv = ["kayra-cli", "delete", "catalog", "namespaces", "core", "-d", "{}"];
        assert!(Cli::try_parse_from(argv).is_err());
        let argv = ["kayra-cli", "get", "catalog", "namespaces", "-d", "{}"];
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn bad_output_format_is_refused() {
        assert!(Cli::try_parse_from(["kayra-cli", "-o", "xml", "get", "catalog", "namespaces"]).is_err());
    }

    #[test]
    fn debug_never_shows_the_token() {
        let cli = parse(&["--token", "s3cr3t-token", "get", "catalog", "namespaces"]);
        let debug = format!("{cli:?}");
        assert!(!debug.contains("s3cr3t-token"), "{debug}");
        assert!(debug.contains("<redacted>"));
    }

    #[test]
    fn help_shows_the_seed_examples() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains(r#"kayra-cli create catalog -n core subscriptions -d '{"api": "compute.example.com"}'"#));
        assert!(help.contains("kayra-cli update catalog -n sre subscriptions dev.example.com/sync -d '{}'"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        for bad in ["", "s", "2x", "ms5", "-1s", "0s", "0", "1.5s", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }
}
