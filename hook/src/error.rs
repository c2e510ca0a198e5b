//! The hook's errors: one line each (runtimes show the hook's stderr to the
//! user), grouped by what went wrong so the exit code tells it too.

use std::path::{Path, PathBuf};

/// Exit codes of `tessera-hook`; see the README's table.
pub mod exit {
    /// Done, or nothing to do.
    pub const OK: u8 = 0;
    /// Bad command line.
    pub const USAGE: u8 = 2;
    /// Malformed input: the OCI state, the bundle's `config.json`, `hook.toml`.
    pub const INPUT: u8 = 3;
    /// The request was refused: bad allocation id, missing, untrusted or invalid
    /// spec, unresolvable `NVIDIA_VISIBLE_DEVICES`.
    pub const REFUSED: u8 = 4;
    /// The host or container cannot be served safely this way (cgroup v2
    /// without CDI, unsupported edits, shared mount propagation).
    pub const UNSUPPORTED: u8 = 5;
    /// Applying failed midway; what this run created was undone (best effort).
    pub const APPLY: u8 = 6;
    /// A bug: the hook panicked.
    pub const INTERNAL: u8 = 70;
}

/// Everything that makes the hook fail; each variant renders as one line.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),
    /// The OCI state on stdin is unusable.
    #[error("OCI state on stdin: {0}")]
    State(String),
    /// A file the hook reads (bundle `config.json`, `hook.toml`) is unreadable or malformed.
    #[error("{path}: {reason}")]
    Input {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The container's request cannot be honoured as asked.
    #[error("{0}")]
    Refused(String),
    /// A spec or directory failed the trust checks, or a spec is invalid.
    #[error("{path}: {reason}")]
    Untrusted {
        /// The offending file or directory.
        path: PathBuf,
        /// Which check failed.
        reason: String,
    },
    /// The host or container setup is one the hook will not touch.
    #[error("{0}")]
    Unsupported(String),
    /// A system call failed while applying.
    #[error("{what}: {source}")]
    Apply {
        /// What was being done, naming the path.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl HookError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            HookError::Usage(_) => exit::USAGE,
            HookError::State(_) | HookError::Input { .. } => exit::INPUT,
            HookError::Refused(_) | HookError::Untrusted { .. } => exit::REFUSED,
            HookError::Unsupported(_) => exit::UNSUPPORTED,
            HookError::Apply { .. } => exit::APPLY,
        }
    }

    /// An [`HookError::Input`] for `path`.
    pub fn input(path: impl AsRef<Path>, reason: impl Into<String>) -> HookError {
        HookError::Input {
            path: path.as_ref().to_path_buf(),
            reason: reason.into(),
        }
    }

    /// An [`HookError::Untrusted`] for `path`.
    pub fn untrusted(path: impl AsRef<Path>, reason: impl Into<String>) -> HookError {
        HookError::Untrusted {
            path: path.as_ref().to_path_buf(),
            reason: reason.into(),
        }
    }

    /// An [`HookError::Apply`] for an I/O error while doing `what`.
    pub fn apply(what: impl Into<String>, source: impl Into<std::io::Error>) -> HookError {
        HookError::Apply {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// Result alias of the hook.
pub type Result<T, E = HookError> = std::result::Result<T, E>;

/// Makes any text fit on one line (newlines and other control characters become spaces).
pub fn one_line(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    while out.contains("  ") {
        out = out.replace("  ", " ");
    }
    out.trim().to_owned()
}
