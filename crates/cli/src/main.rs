//! The `kayra-cli` binary: parse, run on a single-threaded runtime, map the
//! outcome to an exit status. Everything else lives in the library.

use std::process::ExitCode;

use clap::Parser;
use kayra_cli::{Cli, Error};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // `--help` and `--version` are successes; a usage error is a
            // refused request (1), not a server failure (clap's own 2).
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(kayra_cli::run(cli)) {
        Ok(()) | Err(Error::StdoutClosed) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}
