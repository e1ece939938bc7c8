//! `roce-agent`: see `roce-agent --help` and `agent/src/cli/mod.rs`.

use std::process::ExitCode;

use clap::Parser as _;
use roce_agent::cli::{self, Cli};

fn main() -> ExitCode {
    // Usage errors exit 2 here (clap); --help and --version exit 0.
    let args = Cli::parse();
    match cli::execute(args) {
        Ok(()) => ExitCode::SUCCESS,
        // `check` found errors: its table said so; exit 1 without a second message.
        Err(e)
            if e.downcast_ref::<roce_agent::cli::check::FindingsAtErrorLevel>()
                .is_some() =>
        {
            ExitCode::from(cli::EXIT_RUNTIME)
        }
        Err(e) => {
            cli::report(&e);
            ExitCode::from(cli::exit_code(&e))
        }
    }
}
