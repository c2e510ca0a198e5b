//! `tessera-scheduler-extender`: parse the options, run, map the outcome to
//! an exit code (2 for a bad option or config, with one line on stderr).

use std::process::ExitCode;

use clap::Parser;
use tessera_extender::cli::{Args, run};

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            let line = text.lines().next().unwrap_or("bad options");
            eprintln!(
                "tessera-scheduler-extender: {}",
                line.trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-scheduler-extender: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
