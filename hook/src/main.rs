//! `tessera-hook [--config FILE] prestart|poststop`: the OCI hook binary.
//! Parses argv, calls the library, prints at most one error line, and maps the
//! error to an exit code (see the README).
#![no_main]

use std::ffi::{c_char, c_int};

use tessera_hook::cli::{self, Command};
use tessera_hook::error::{exit, one_line};

/// The C entry point, called by the C runtime directly.
///
/// std's own start-up (ignoring SIGPIPE, probing the main thread's stack guard
/// through `/proc/self/maps`, an alternate signal stack) is skipped: it is about
/// half of the system calls of the fast path that every container pays for.
/// Arguments still come from `std::env::args_os`, which std captures on glibc
/// before `main` runs.
#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    c_int::from(hook_main())
}

fn hook_main() -> u8 {
    // First, while the process has one thread: nothing from the container's
    // environment survives (a hook entry without `env` would pass it).
    tessera_hook::sys::clear_environment();
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let cli = match cli::parse(&args) {
        Ok(Command::Run(cli)) => cli,
        Ok(Command::Help) => {
            println!("{}", cli::USAGE);
            return exit::OK;
        }
        Ok(Command::Version) => {
            println!("tessera-hook {}", env!("CARGO_PKG_VERSION"));
            return exit::OK;
        }
        Err(e) => {
            eprintln!("tessera-hook: {e}\n{}", cli::USAGE);
            return exit::USAGE;
        }
    };
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "tessera-hook: internal error: {}",
            one_line(&info.to_string())
        );
    }));
    match std::panic::catch_unwind(|| tessera_hook::run(&cli, std::io::stdin().lock())) {
        Ok(Ok(_)) => exit::OK,
        Ok(Err(e)) => {
            eprintln!("tessera-hook: {}", one_line(&e.to_string()));
            e.exit_code()
        }
        Err(_) => exit::INTERNAL,
    }
}
