//! `tessera-sim cluster up|down|status`: a simulated Kubernetes cluster on
//! one machine — one simulated GPU node per Kubernetes node (each with its
//! own static `tessera.io/gpu` CDI spec and its own containerd), the
//! stand-in API server, the stand-in scheduler and one stand-in kubelet per
//! node, all children of one supervising process.
//!
//! Also the product code that a private containerd needs ([`containerd`]:
//! its config, start, image import, teardown) and the busybox image pods run
//! ([`image`]); the tests' containerd runner uses both.

pub mod containerd;
pub mod control;
pub mod image;
pub mod proc;
pub mod state;
pub mod up;

use std::fs;
use std::path::{Path, PathBuf};

/// Command-line options of `tessera-sim cluster`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: ClusterCommand,
}

/// The verbs of `tessera-sim cluster`.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Bring a cluster up under a directory and supervise it until Ctrl-C or
    /// SIGTERM (or, with --detach, in the background until `cluster down`).
    Up(up::UpArgs),
    /// Take down the cluster under a directory: every process it started,
    /// its containers and its mounts.
    Down(RootArgs),
    /// Print each service and node of the cluster under a directory.
    Status(RootArgs),
}

/// The one option of `down` and `status`.
#[derive(Debug, Clone, clap::Args)]
pub struct RootArgs {
    /// The cluster's root directory (as given to `cluster up`).
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
}

/// What stops `tessera-sim cluster`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad option value.
    #[error("{option}: {reason}")]
    Usage {
        /// The option.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or directory could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The state file.
    #[error(transparent)]
    State(#[from] state::StateError),
    /// A private containerd.
    #[error(transparent)]
    Containerd(#[from] containerd::ContainerdError),
    /// The busybox image.
    #[error(transparent)]
    Image(#[from] image::ImageError),
    /// A step of bringing the cluster up failed.
    #[error("{step}: {reason}")]
    Step {
        /// The step (`node-1: tessera-sim create`, `apiserver`, …).
        step: String,
        /// What happened (with the end of its log where there is one).
        reason: String,
    },
    /// A cluster is already up under the directory, or an earlier one left
    /// processes or mounts there.
    #[error("{root}: {what}; run `tessera-sim cluster down --root {root}` first")]
    AlreadyUp {
        /// Its root.
        root: PathBuf,
        /// What is still there.
        what: String,
    },
    /// SIGINT, SIGTERM or SIGHUP came while the cluster was coming up.
    #[error("interrupted while coming up; everything started was taken down")]
    Interrupted,
    /// Something was left running or mounted after `down`.
    #[error("left behind under {root}: {what}")]
    LeftBehind {
        /// The cluster's root.
        root: PathBuf,
        /// What is left.
        what: String,
    },
    /// The async runtime could not be built.
    #[error("tokio runtime: {0}")]
    Runtime(std::io::Error),
}

/// The root `cluster up` may use, canonical (symlinks resolved, as
/// `/proc/self/mountinfo` and command lines show it): created when missing;
/// refused when it is `/`, or a directory with something in it but no
/// [`state::FILE`] (a directory that is not a cluster's: `up`, `down` and the
/// sweeps would act below it).
pub fn root_for_up(root: &Path) -> Result<PathBuf, Error> {
    fs::create_dir_all(root).map_err(|source| Error::Io {
        path: root.to_owned(),
        source,
    })?;
    let root = canonical_root(root)?;
    let mut entries = fs::read_dir(&root).map_err(|source| Error::Io {
        path: root.clone(),
        source,
    })?;
    if entries.next().is_some() && !root.join(state::FILE).is_file() {
        return Err(Error::Usage {
            option: "--root",
            reason: format!(
                "{} is not empty and holds no {}: not a cluster's directory (give a new or empty one)",
                root.display(),
                state::FILE
            ),
        });
    }
    Ok(root)
}

/// The canonical form of an existing cluster root; `/` is refused.
pub fn canonical_root(root: &Path) -> Result<PathBuf, Error> {
    let canonical = fs::canonicalize(root).map_err(|e| Error::Usage {
        option: "--root",
        reason: format!("{}: {e}", root.display()),
    })?;
    if canonical.parent().is_none() {
        return Err(Error::Usage {
            option: "--root",
            reason: format!("{} is the file system's root", root.display()),
        });
    }
    Ok(canonical)
}

/// Runs `tessera-sim cluster <verb>`.
pub fn run(args: Args) -> Result<(), Error> {
    match args.command {
        ClusterCommand::Up(up_args) => up::run(up_args),
        ClusterCommand::Down(root) => control::down(&root.root),
        ClusterCommand::Status(root) => control::status(&root.root).map(|text| print!("{text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_system_root_is_refused() {
        let err = root_for_up(Path::new("/")).expect_err("/");
        assert!(err.to_string().starts_with("--root: "), "{err}");
        let err = canonical_root(Path::new("/tmp/..")).expect_err("/tmp/..");
        assert!(err.to_string().contains("file system's root"), "{err}");
    }

    #[test]
    fn a_non_empty_directory_without_a_state_is_refused_and_symlinks_resolved() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = fs::canonicalize(dir.path()).expect("canonical");
        // New and empty directories are fine; the answer is canonical.
        let fresh = real.join("new");
        let link = real.join("link");
        std::os::unix::fs::symlink(&fresh, &link).expect("symlink");
        fs::create_dir(&fresh).expect("mkdir");
        assert_eq!(root_for_up(&link).expect("empty"), fresh);
        assert_eq!(
            root_for_up(&real.join("a/b")).expect("missing"),
            real.join("a/b")
        );
        // Someone's directory.
        fs::write(real.join("notes.txt"), "mine").expect("write");
        let err = root_for_up(&real).expect_err("not empty");
        assert!(
            err.to_string().contains("not a cluster's directory"),
            "{err}"
        );
        // A cluster's directory.
        fs::write(real.join(state::FILE), "{}").expect("write");
        assert_eq!(root_for_up(&real).expect("a cluster's"), real);
    }
}
