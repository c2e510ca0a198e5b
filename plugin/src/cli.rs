//! The command line (TODO: being written).

/// Parses the flags, runs the plugin, maps the outcome to an exit code.
pub fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(2)
}
