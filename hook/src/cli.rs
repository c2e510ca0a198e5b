//! The command line: `tessera-hook [--config FILE] prestart|poststop`.
//!
//! Hand-written rather than clap: two verbs and one option, and the hook stays
//! small and quick to start (it runs for every container).

use std::ffi::OsString;
use std::path::PathBuf;

/// Which hook point the hook serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `prestart` (also accepted: `createRuntime`, `createContainer`): bind,
    /// and inject where the runtime did not apply CDI.
    Prestart,
    /// `poststop`: remove the binding record.
    Poststop,
}

/// Parsed arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cli {
    /// The verb.
    pub verb: Verb,
    /// `--config FILE`; `None` means `/etc/tessera/hook.toml` if present.
    pub config: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run as a hook.
    Run(Cli),
    /// `--help`.
    Help,
    /// `--version`.
    Version,
}

/// The usage text.
pub const USAGE: &str = "usage: tessera-hook [--config FILE] prestart|poststop
  Runs as an OCI hook: reads the container state on stdin.
  prestart   (also as createRuntime or createContainer) record the container's
             binding to its Tessera allocation and, where the runtime did not
             apply CDI, create its device nodes, device-cgroup rules and mounts
  poststop   remove the binding record
  --config FILE   hook settings (default /etc/tessera/hook.toml, optional)";

/// Parses the arguments after the program name.
pub fn parse(args: &[OsString]) -> Result<Command, String> {
    let mut verb = None;
    let mut config = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg
            .to_str()
            .ok_or_else(|| format!("argument {arg:?} is not UTF-8"))?;
        match text {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--config" => {
                let value = iter.next().ok_or("--config needs a FILE")?;
                config = Some(PathBuf::from(value));
            }
            _ if text.starts_with("--config=") => {
                config = Some(PathBuf::from(&text["--config=".len()..]));
            }
            "prestart" | "createRuntime" | "createContainer" if verb.is_none() => {
                verb = Some(Verb::Prestart);
            }
            "poststop" if verb.is_none() => verb = Some(Verb::Poststop),
            _ => return Err(format!("unexpected argument {text:?}")),
        }
    }
    if config.as_ref().is_some_and(|c| c.as_os_str().is_empty()) {
        return Err("--config needs a FILE".into());
    }
    let verb = verb.ok_or("missing verb: prestart or poststop")?;
    Ok(Command::Run(Cli { verb, config }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn verbs_options_and_mistakes() {
        assert_eq!(
            parse(&args(&["prestart"])),
            Ok(Command::Run(Cli {
                verb: Verb::Prestart,
                config: None
            }))
        );
        assert_eq!(
            parse(&args(&["--config", "/x.toml", "createContainer"])),
            Ok(Command::Run(Cli {
                verb: Verb::Prestart,
                config: Some("/x.toml".into())
            }))
        );
        assert_eq!(
            parse(&args(&["poststop", "--config=/y"])),
            Ok(Command::Run(Cli {
                verb: Verb::Poststop,
                config: Some("/y".into())
            }))
        );
        assert_eq!(parse(&args(&["--help"])), Ok(Command::Help));
        for bad in [
            &[][..],
            &["start"],
            &["prestart", "poststop"],
            &["prestart", "--config"],
            &["--config=", "prestart"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
    }
}
