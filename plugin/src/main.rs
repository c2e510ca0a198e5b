//! `tessera-device-plugin`: parse the flags, run, map the outcome to an exit code.

fn main() -> std::process::ExitCode {
    tessera_plugin::cli::main()
}
