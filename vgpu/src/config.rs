//! Loading the vGPU limits of this process, once, at library start.
//!
//! Order (see `docs/vgpu.md`):
//! 1. `/usr/local/tessera/vgpu.json`, if it exists, is authoritative: the
//!    environment is not read at all, so a process cannot raise its own limit
//!    by editing its environment, and `su`/`env -i` children keep their limits.
//! 2. Only if that file does not exist: `TESSERA_VGPU_CONFIG=<path>` names a
//!    limits file to read instead (tests and the simulated node, which have no
//!    `/usr/local/tessera`).
//! 3. Otherwise the HAMi-core environment names; none of them set means no limits.
//!
//! **Fail closed.** A limits file that exists but cannot be read or parsed, or
//! a HAMi-core limit value that cannot be parsed, is an error; the caller logs
//! its one line and enforces [`ResolvedLimits::fail_closed`] — no GPU memory on
//! any device — rather than running unlimited. [`load_or_fail_closed`] does
//! exactly that.
//!
//! Why `TESSERA_VGPU_CONFIG` is no way out: it is consulted only when the
//! container file is absent. Where Tessera set limits by file the file is
//! mounted and wins; where it is absent, limits came from the environment,
//! which the process controls anyway, so naming another file grants nothing the
//! environment did not.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use tessera_model::contract::vgpu::{
    ACCOUNTING_FILE as ACCOUNTING_FILE_NAME, CONTAINER_CONFIG_PATH,
};
use tessera_model::vgpu::{
    EnvLimits, EnvLimitsError, LimitsSource, ResolvedLimits, VgpuConfig, VgpuConfigError,
};

/// Names a limits file to read where the container file is absent (testing hook).
pub const CONFIG_OVERRIDE_ENV: &str = "TESSERA_VGPU_CONFIG";

/// Largest limits file read; a bigger one is refused.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why the limits could not be loaded; one line.
#[derive(Debug)]
pub enum ConfigError {
    /// The limits file exists (or was named) but could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// The limits file is larger than [`MAX_CONFIG_BYTES`].
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The limits file is not a valid limits file.
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        source: VgpuConfigError,
    },
    /// A HAMi-core limit variable has a value that is not a limit.
    Env(EnvLimitsError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { path, source } => write!(f, "{}: {source}", path.display()),
            ConfigError::TooLarge { path } => write!(
                f,
                "{}: larger than {MAX_CONFIG_BYTES} bytes, not a limits file",
                path.display()
            ),
            ConfigError::Parse { path, source } => write!(f, "{}: {source}", path.display()),
            ConfigError::Env(e) => write!(f, "environment: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Read { source, .. } => Some(source),
            ConfigError::Parse { source, .. } => Some(source),
            ConfigError::Env(e) => Some(e),
            ConfigError::TooLarge { .. } => None,
        }
    }
}

/// Loads this process's limits from the container file, the test override, or
/// the environment, in that order (module docs).
pub fn load() -> Result<ResolvedLimits, ConfigError> {
    load_from(Path::new(CONTAINER_CONFIG_PATH), std::env::vars_os())
}

/// [`load`], with the error turned into [`ResolvedLimits::fail_closed`]: the
/// limits to enforce, and the error to log (one line) if there was one.
pub fn load_or_fail_closed() -> (ResolvedLimits, Option<ConfigError>) {
    match load() {
        Ok(limits) => (limits, None),
        Err(e) => (ResolvedLimits::fail_closed(e.to_string()), Some(e)),
    }
}

/// [`load`] with the container file's path and the environment given (tests).
pub fn load_from(
    container_path: &Path,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<ResolvedLimits, ConfigError> {
    if let Some(text) = read_if_exists(container_path)? {
        return parse_file(container_path, &text);
    }
    // Non-UTF-8 names cannot be ours; a non-UTF-8 value becomes U+FFFD and,
    // for a limit, a parse error.
    let vars: Vec<(String, String)> = vars
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .collect();
    if let Some((_, path)) = vars
        .iter()
        .rev()
        .find(|(k, v)| k == CONFIG_OVERRIDE_ENV && !v.is_empty())
    {
        let path = PathBuf::from(path);
        return match read_if_exists(&path)? {
            Some(text) => parse_file(&path, &text),
            None => Err(ConfigError::Read {
                path,
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("named by {CONFIG_OVERRIDE_ENV} but does not exist"),
                ),
            }),
        };
    }
    let env = EnvLimits::from_vars(vars).map_err(ConfigError::Env)?;
    let mut limits = env.resolve();
    // HAMi-core's cache variable names a file; accept a directory as well.
    if limits.source == LimitsSource::Env && limits.accounting_path.is_dir() {
        limits.accounting_path = limits.accounting_path.join(ACCOUNTING_FILE_NAME);
    }
    Ok(limits)
}

/// The file's text, `None` if it does not exist; any other failure is an error
/// (a file we cannot read might exist, and then it would be authoritative).
fn read_if_exists(path: &Path) -> Result<Option<String>, ConfigError> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None);
        }
        Err(source) => {
            return Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(Some(text))
}

fn parse_file(path: &Path, text: &str) -> Result<ResolvedLimits, ConfigError> {
    VgpuConfig::parse(text)
        .map(|config| config.resolve())
        .map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::vgpu::{DeviceLimit, MIB};

    const UUID: &str = "GPU-5a4b3c2d-1e0f-4a5b-8c7d-6e5f4a3b2c1d";

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let dir = std::env::temp_dir()
                .join(format!("tessera-vgpu-config-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            Dir(dir)
        }

        fn file(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).expect("write");
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn limits_file(mib: u64) -> String {
        format!(r#"{{"version": 1, "devices": [{{"uuid": "{UUID}", "memoryLimitMiB": {mib}}}]}}"#)
    }

    /// An environment naming an override file `override_mib` MiB big in
    /// `dir`, and asking for 80 GiB itself.
    fn env_with_override(dir: &Dir, override_mib: u64) -> Vec<(OsString, OsString)> {
        let other = dir.file("other.json", &limits_file(override_mib));
        vars(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "80g"),
            (CONFIG_OVERRIDE_ENV, other.to_str().expect("utf-8")),
        ])
    }

    /// The memory limit of device 0 (`UUID`).
    fn memory_limit(limits: &ResolvedLimits) -> Option<u64> {
        limits.limit_for(0, UUID).memory_limit_bytes
    }

    #[test]
    fn container_file_wins_over_env_and_override() {
        let dir = Dir::new("wins");
        let container = dir.file("vgpu.json", &limits_file(1024));
        let limits = load_from(&container, env_with_override(&dir, 999_999)).expect("loads");
        assert_eq!(limits.source, LimitsSource::File);
        assert_eq!(memory_limit(&limits), Some(1024 * MIB));
    }

    #[test]
    fn override_is_read_only_without_the_container_file() {
        let dir = Dir::new("override");
        let env = env_with_override(&dir, 2048);
        let limits = load_from(&dir.0.join("absent.json"), env).expect("loads");
        assert_eq!(memory_limit(&limits), Some(2048 * MIB));
    }

    #[test]
    fn env_is_read_without_any_file() {
        let dir = Dir::new("env");
        let env = vars(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                dir.0.to_str().expect("utf-8"),
            ),
        ]);
        let limits = load_from(&dir.0.join("absent.json"), env).expect("loads");
        assert_eq!(limits.source, LimitsSource::Env);
        assert_eq!(memory_limit(&limits), Some(1 << 30));
        assert_eq!(
            limits.accounting_path,
            dir.0.join(ACCOUNTING_FILE_NAME),
            "a cache directory gets the accounting file name"
        );
    }

    #[test]
    fn nothing_set_means_no_limits() {
        let dir = Dir::new("nothing");
        let limits = load_from(&dir.0.join("absent.json"), vars(&[("HOME", "/")])).expect("loads");
        assert_eq!(limits.source, LimitsSource::Unlimited);
        assert!(limits.limit_for(0, UUID).is_unlimited());
    }

    #[test]
    fn malformed_container_file_is_an_error_not_the_env() {
        let dir = Dir::new("malformed");
        let container = dir.file(
            "vgpu.json",
            &format!(
                r#"{{"version": 1, "devices": [{{"uuid": "{UUID}", "smLimitPercent": 140}}]}}"#
            ),
        );
        let err = load_from(&container, vars(&[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]))
            .expect_err("refused");
        let line = err.to_string();
        assert!(
            line.ends_with("vgpu.json: devices[0].smLimitPercent: 140 is above 100"),
            "{line}"
        );
        let limits = ResolvedLimits::fail_closed(line);
        assert_eq!(limits.limit_for(0, UUID), DeviceLimit::denied());
    }

    #[test]
    fn unreadable_or_missing_named_files_are_errors() {
        let dir = Dir::new("unreadable");
        // A directory where the file should be: it exists, but is not a file.
        let container = dir.0.join("vgpu.json");
        std::fs::create_dir(&container).expect("mkdir");
        assert!(matches!(
            load_from(&container, vars(&[])),
            Err(ConfigError::Read { .. })
        ));
        let env = vars(&[(CONFIG_OVERRIDE_ENV, "/nonexistent/tessera/vgpu.json")]);
        let err = load_from(&dir.0.join("absent.json"), env).expect_err("named file missing");
        assert!(err.to_string().contains(CONFIG_OVERRIDE_ENV), "{err}");
    }

    #[test]
    fn oversized_file_is_refused() {
        let dir = Dir::new("oversized");
        let container = dir.file("vgpu.json", &" ".repeat(MAX_CONFIG_BYTES as usize + 1));
        assert!(matches!(
            load_from(&container, vars(&[])),
            Err(ConfigError::TooLarge { .. })
        ));
    }

    #[test]
    fn bad_env_limit_is_an_error() {
        let dir = Dir::new("badenv");
        let err = load_from(
            &dir.0.join("absent.json"),
            vars(&[("CUDA_DEVICE_MEMORY_LIMIT", "lots")]),
        )
        .expect_err("refused");
        assert!(
            err.to_string()
                .starts_with("environment: CUDA_DEVICE_MEMORY_LIMIT="),
            "{err}"
        );
    }
}
