//! Why a region could not be opened or a device named.

use std::io;
use std::path::PathBuf;

use super::{LAYOUT_VERSION, MAX_DEVICES, MAX_UUID_BYTES};

/// Why a region could not be opened or a device named; one line.
#[derive(Debug, thiserror::Error)]
pub enum AccountingError {
    /// A system call on the region file failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The region file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The failure.
        source: io::Error,
    },
    /// The file does not exist: the node side creates it, the library never does.
    #[error(
        "{}: accounting file does not exist (the node side creates it; the library never does)",
        path.display()
    )]
    Missing {
        /// The region file.
        path: PathBuf,
    },
    /// The directory holding the file may be written by group or others, so
    /// a workload could unlink or replace the file and split the budget.
    #[error(
        "{}: accounting directory has mode {mode:04o}: group or others could unlink or replace the accounting file",
        dir.display()
    )]
    UnsafeDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// The file is not a Tessera region (wrong magic or shape); it was left untouched.
    #[error("{}: not a Tessera accounting file ({reason}); left untouched", path.display())]
    NotOurs {
        /// The file.
        path: PathBuf,
        /// What did not match.
        reason: String,
    },
    /// The file is a Tessera region of another layout version; left untouched.
    #[error(
        "{}: accounting layout version {found}, this library uses {LAYOUT_VERSION}; left untouched",
        path.display()
    )]
    VersionMismatch {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// The file has this version's magic and version but another size.
    #[error("{}: accounting layout does not match ({reason}); left untouched", path.display())]
    LayoutMismatch {
        /// The file.
        path: PathBuf,
        /// What did not match.
        reason: String,
    },
    /// More devices than a region accounts for.
    #[error(
        "{}: {requested} devices, a region accounts for at most {MAX_DEVICES}",
        path.display()
    )]
    TooManyDevices {
        /// The file.
        path: PathBuf,
        /// How many were asked for.
        requested: usize,
    },
    /// A device UUID that cannot be recorded.
    #[error(
        "device UUID {:?}: empty or longer than {MAX_UUID_BYTES} bytes",
        uuid.chars().take(80).collect::<String>()
    )]
    BadUuid {
        /// The UUID.
        uuid: String,
    },
}
