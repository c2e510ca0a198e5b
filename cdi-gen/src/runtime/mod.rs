//! Enabling CDI in a container runtime's configuration: the pure part of
//! `tessera-cdi runtime configure`.
//!
//! Everything here takes text (a config file's content, a `--version`
//! output) and returns text or a refusal; nothing reads or writes files, so
//! it is unit-testable and safe to fuzz. The thin I/O layer is
//! [`crate::commands::runtime`].
//!
//! What "enable CDI" means per runtime, and nothing more (no default-runtime
//! change, ever):
//! - containerd ≥ 1.7: `enable_cdi = true` and `cdi_spec_dirs` in the CRI
//!   plugin's table ([`containerd`]);
//! - CRI-O ≥ 1.23 (CDI always on): `cdi_spec_dirs` under `[crio.runtime]` in
//!   a drop-in ([`crio`]);
//! - Docker ≥ 25: `features.cdi = true` in `daemon.json` ([`docker`]).

pub mod containerd;
pub mod crio;
pub mod diff;
pub mod docker;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The CDI spec directories every CDI runtime reads by default; Tessera
/// writes its static and transient specs to the second.
pub const DEFAULT_CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Exit status of a refusal because the runtime's version has no CDI.
pub const EXIT_NO_CDI: u8 = 3;

/// Exit status of a malformed config file or bad arguments.
pub const EXIT_CONFIG: u8 = 2;

/// A container runtime whose configuration `runtime configure` edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Runtime {
    /// containerd (CRI plugin).
    Containerd,
    /// CRI-O.
    Crio,
    /// Docker Engine (dockerd).
    Docker,
}

impl Runtime {
    /// The name users know it by.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "CRI-O",
            Runtime::Docker => "Docker",
        }
    }

    /// Its systemd service.
    pub fn service(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "crio",
            Runtime::Docker => "docker",
        }
    }

    /// The file edited when `--config` is not given (for CRI-O: the drop-in
    /// written).
    pub fn default_config(self) -> &'static Path {
        Path::new(match self {
            Runtime::Containerd => "/etc/containerd/config.toml",
            Runtime::Crio => "/etc/crio/crio.conf.d/99-tessera-cdi.conf",
            Runtime::Docker => "/etc/docker/daemon.json",
        })
    }

    /// The program asked for the version, and its arguments.
    pub fn version_command(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Runtime::Containerd => ("containerd", &["--version"]),
            Runtime::Crio => ("crio", &["--version"]),
            Runtime::Docker => ("docker", &["version", "--format", "{{.Server.Version}}"]),
        }
    }

    /// The first version with CDI: containerd 1.7 (`enable_cdi`), CRI-O 1.23
    /// (`cdi_spec_dirs`, always on), Docker 25 (`features.cdi`).
    pub fn first_cdi_version(self) -> Version {
        match self {
            Runtime::Containerd => Version::new(1, 7, 0),
            Runtime::Crio => Version::new(1, 23, 0),
            Runtime::Docker => Version::new(25, 0, 0),
        }
    }

    /// Refuses a version without CDI, with what to do instead.
    pub fn check_cdi(self, version: Version) -> Result<(), RuntimeError> {
        let first = self.first_cdi_version();
        if version >= first {
            return Ok(());
        }
        let hint = match self {
            Runtime::Containerd => {
                "use Tessera's native mode instead: run the device plugin with \
                 `tessera-device-plugin --cdi-mode native` and give runc the base runtime spec \
                 (/usr/share/doc/tessera-node/examples/containerd/config-fragment.toml)"
            }
            Runtime::Crio => "upgrade CRI-O, or register tessera-hook through hooks.d",
            Runtime::Docker => "upgrade Docker, or register tessera-hook as a prestart hook",
        };
        Err(RuntimeError::NoCdi {
            runtime: self,
            version,
            first,
            hint,
        })
    }
}

/// A runtime's version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major.
    pub major: u64,
    /// Minor.
    pub minor: u64,
    /// Patch (0 when not given).
    pub patch: u64,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// The version a `--version` output names: its first word that reads
    /// `[v]X.Y[.Z]` followed by anything (`1.7.24~ds1`, `v2.0.0`,
    /// `25.0.3`), words split at white space and `:`.
    pub fn find_in(output: &str) -> Option<Version> {
        output
            .split(|c: char| c.is_whitespace() || c == ':' || c == ',')
            .find_map(Version::leading)
    }

    /// The `[v]X.Y[.Z]` at the start of `word`, if it starts with one.
    fn leading(word: &str) -> Option<Version> {
        let word = word.strip_prefix('v').unwrap_or(word);
        let mut parts = [0u64; 3];
        let mut count = 0;
        let mut rest = word;
        while count < 3 {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits == 0 {
                break;
            }
            parts[count] = rest[..digits].parse().ok()?;
            count += 1;
            rest = &rest[digits..];
            match rest.strip_prefix('.') {
                Some(r) if count < 3 => rest = r,
                _ => break,
            }
        }
        (count >= 2).then(|| Version::new(parts[0], parts[1], parts[2]))
    }
}

impl FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::leading(s.trim())
            .ok_or_else(|| format!("{s:?} is not a version (want X.Y or X.Y.Z)"))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why `runtime configure` stopped; each renders as one line.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime's version predates CDI.
    #[error("{} {version} has no CDI support (it arrived in {first}): {hint}", runtime.name())]
    NoCdi {
        /// The runtime.
        runtime: Runtime,
        /// Its version.
        version: Version,
        /// The first version with CDI.
        first: Version,
        /// What to do instead.
        hint: &'static str,
    },
    /// A config file could not be parsed, or holds a value of the wrong type
    /// where CDI's keys go.
    #[error("{}: {reason}; nothing written", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column where known.
        reason: String,
    },
    /// The runtime's version could not be found out.
    #[error("cannot tell the {} version from `{command}`: {reason} (pass --runtime-version to say it)", runtime.name())]
    Version {
        /// The runtime.
        runtime: Runtime,
        /// The command run.
        command: String,
        /// What went wrong.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl RuntimeError {
    /// The process exit status for this error: [`EXIT_NO_CDI`] for a
    /// runtime without CDI, [`EXIT_CONFIG`] for a malformed config, 1 else.
    pub fn exit_code(&self) -> u8 {
        match self {
            RuntimeError::NoCdi { .. } => EXIT_NO_CDI,
            RuntimeError::Malformed { .. } => EXIT_CONFIG,
            RuntimeError::Version { .. } | RuntimeError::Io { .. } => 1,
        }
    }

    pub(crate) fn malformed(path: &Path, reason: impl Into<String>) -> Self {
        RuntimeError::Malformed {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}

/// Whether two CDI spec directory names mean the same directory
/// (`/var/run` is a link to `/run` on every current distribution; a
/// trailing slash changes nothing).
pub(crate) fn same_dir(a: &str, b: &str) -> bool {
    fn norm(d: &str) -> &str {
        let d = d.trim_end_matches('/');
        d.strip_prefix("/var")
            .filter(|r| r.starts_with("/run"))
            .unwrap_or(d)
    }
    norm(a) == norm(b)
}

/// The directories of `wanted` that `present` lacks, in `wanted`'s order.
pub(crate) fn missing_dirs<'a>(present: &[String], wanted: &'a [String]) -> Vec<&'a String> {
    wanted
        .iter()
        .filter(|w| !present.iter().any(|p| same_dir(p, w)))
        .collect()
}

/// A one-line description of a TOML parse error with its line and column.
pub(crate) fn toml_error(text: &str, err: &toml_edit::TomlError) -> String {
    let message = err.message().trim().replace('\n', "; ");
    match err.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("invalid TOML at line {line} column {column}: {message}")
        }
        None => format!("invalid TOML: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_found_in_each_runtimes_output() {
        let cases = [
            (
                "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1",
                Version::new(1, 7, 24),
            ),
            (
                "containerd github.com/containerd/containerd/v2 v2.0.0 207ad711eabd375a01713109a8a197d197ff6542",
                Version::new(2, 0, 0),
            ),
            (
                "containerd containerd.io 1.6.20 2806fc1057397dbaeefbea0e4e17bddfbd388f38",
                Version::new(1, 6, 20),
            ),
            ("crio version 1.23.2\ncommit: abc", Version::new(1, 23, 2)),
            (
                "Version:        1.30.1\nGitCommit:  1234",
                Version::new(1, 30, 1),
            ),
            ("25.0.3\n", Version::new(25, 0, 3)),
            ("24.0", Version::new(24, 0, 0)),
        ];
        for (output, want) in cases {
            assert_eq!(Version::find_in(output), Some(want), "{output}");
        }
        assert_eq!(
            Version::find_in("Cannot connect to the Docker daemon"),
            None
        );
    }

    #[test]
    fn versions_without_cdi_are_refused_with_what_to_do() {
        let err = Runtime::Containerd
            .check_cdi(Version::new(1, 6, 20))
            .expect_err("1.6 has no CDI");
        let line = err.to_string();
        assert!(line.contains("containerd 1.6.20 has no CDI"), "{line}");
        assert!(line.contains("--cdi-mode native"), "{line}");
        assert!(line.contains("config-fragment.toml"), "{line}");
        assert_eq!(err.exit_code(), EXIT_NO_CDI);
        assert!(!line.contains('\n'));
        assert!(Runtime::Containerd.check_cdi(Version::new(1, 7, 0)).is_ok());
        assert!(Runtime::Containerd.check_cdi(Version::new(2, 1, 0)).is_ok());
        assert!(Runtime::Docker.check_cdi(Version::new(24, 0, 9)).is_err());
        assert!(Runtime::Docker.check_cdi(Version::new(25, 0, 0)).is_ok());
        assert!(Runtime::Crio.check_cdi(Version::new(1, 22, 5)).is_err());
        assert!(Runtime::Crio.check_cdi(Version::new(1, 23, 0)).is_ok());
    }

    #[test]
    fn run_and_var_run_are_the_same_spec_dir() {
        assert!(same_dir("/var/run/cdi", "/run/cdi/"));
        assert!(same_dir("/etc/cdi/", "/etc/cdi"));
        assert!(!same_dir("/etc/cdi", "/var/run/cdi"));
        assert!(!same_dir("/variable/cdi", "/iable/cdi"));
    }
}
