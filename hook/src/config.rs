//! `hook.toml`: the hook's own configuration, strict (an unknown key is an
//! error) and read only when a container asks for something.
//!
//! ```toml
//! cdi_dir = "/var/run/cdi"                 # transient and static specs
//! state_dir = "/var/lib/tessera"           # binding records: <state_dir>/alloc/<id>/
//! accept_nvidia_visible_devices = false    # serve NVIDIA_VISIBLE_DEVICES requests
//! log_level = "warn"                       # error | warn | info | debug
//! update_ldcache = true                    # links + /etc/ld.so.cache for injected libraries
//! ```
//!
//! The file is a trusted file ([`crate::trust`]): it decides where specs are
//! read from, so it must be root-owned and not group- or world-writable.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tessera_model::contract;

use crate::error::{HookError, Result, one_line};
use crate::log::Level;
use crate::trust::read_trusted_file;

/// Where the configuration lives unless `--config` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = contract::hook::CONFIG_PATH;
/// Default CDI spec directory (transient specs are written there).
pub const DEFAULT_CDI_DIR: &str = contract::cdi::SPEC_DIR;
/// Default node state directory.
pub const DEFAULT_STATE_DIR: &str = contract::node::STATE_DIR;

/// The hook's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HookConfig {
    /// Directory holding `tessera.io-alloc_<id>.json` and `tessera.io-gpu.json`.
    pub cdi_dir: PathBuf,
    /// Node state directory; binding records and accounting directories go
    /// under `<state_dir>/alloc/<id>/`.
    pub state_dir: PathBuf,
    /// Whether `NVIDIA_VISIBLE_DEVICES` in a container's env requests devices
    /// from the static spec. Off by default: any image can set an env variable.
    pub accept_nvidia_visible_devices: bool,
    /// How much the hook says on stderr.
    pub log_level: Level,
    /// Whether the injected driver libraries get their SONAME and
    /// development links and entries in the container's `/etc/ld.so.cache`
    /// ([`crate::libraries`]).
    pub update_ldcache: bool,
}

impl Default for HookConfig {
    fn default() -> Self {
        HookConfig {
            cdi_dir: PathBuf::from(DEFAULT_CDI_DIR),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            accept_nvidia_visible_devices: false,
            log_level: Level::Warn,
            update_ldcache: true,
        }
    }
}

/// Parses `hook.toml` text; errors are one line with the line and column.
pub fn parse_config(text: &str) -> std::result::Result<HookConfig, String> {
    let config: HookConfig = toml::from_str(text).map_err(|e| {
        let place = e
            .span()
            .map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!("line {line} column {column}: ")
            })
            .unwrap_or_default();
        format!("{place}{}", one_line(e.message()))
    })?;
    for (key, dir) in [
        ("cdi_dir", &config.cdi_dir),
        ("state_dir", &config.state_dir),
    ] {
        if !dir.is_absolute() {
            return Err(format!("{key} = {dir:?} is not an absolute path"));
        }
    }
    Ok(config)
}

/// Loads the configuration: from `explicit` (which must exist), or from
/// [`DEFAULT_CONFIG_PATH`] when it exists, or the defaults.
pub fn load(explicit: Option<&Path>) -> Result<HookConfig> {
    let path = explicit.unwrap_or(Path::new(DEFAULT_CONFIG_PATH));
    match read_trusted_file(path)? {
        Some(raw) => {
            let text =
                std::str::from_utf8(&raw).map_err(|_| HookError::input(path, "not UTF-8 text"))?;
            parse_config(text).map_err(|reason| HookError::input(path, reason))
        }
        None if explicit.is_some() => Err(HookError::input(path, "no such file")),
        None => Ok(HookConfig::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_the_defaults_and_every_key_parses() {
        assert_eq!(parse_config(""), Ok(HookConfig::default()));
        let c = parse_config(
            "cdi_dir = \"/tmp/cdi\"\nstate_dir = \"/tmp/state\"\naccept_nvidia_visible_devices = true\nlog_level = \"debug\"\nupdate_ldcache = false\n",
        )
        .expect("all keys");
        assert_eq!(c.cdi_dir, Path::new("/tmp/cdi"));
        assert_eq!(c.state_dir, Path::new("/tmp/state"));
        assert!(c.accept_nvidia_visible_devices);
        assert_eq!(c.log_level, Level::Debug);
        assert!(!c.update_ldcache);
        assert!(HookConfig::default().update_ldcache);
    }

    #[test]
    fn mistakes_fail_with_one_line_naming_the_place() {
        for (text, expect) in [
            (
                "cdi_dri = \"/x\"",
                "line 1 column 1: unknown field `cdi_dri`",
            ),
            (
                "\n\naccept_nvidia_visible_devices = \"yes\"",
                "line 3 column 33",
            ),
            ("log_level = \"loud\"", "unknown variant `loud`"),
            ("cdi_dir = \"relative\"", "is not an absolute path"),
            ("state_dir = \"\"", "is not an absolute path"),
            ("cdi_dir = ", "line 1"),
            ("[section]\nx = 1", "unknown field `section`"),
        ] {
            let e = parse_config(text).expect_err(text);
            assert!(e.contains(expect), "{text:?}: {e:?} lacks {expect:?}");
            assert!(!e.contains('\n'), "{e:?}");
        }
    }
}
