//! Allocation ids: the `<pod-uid>-<container-index>` names that tie a container
//! to its transient CDI spec, its binding record and its accounting directory.
//!
//! An id travels through annotations, environment variables and file names, and
//! every reader validates it with [`AllocId::new`] before using it: a file name
//! built from an unchecked id (`../../etc/x`, a NUL byte) is how a path escapes
//! its directory. The rules are the contract's charset, `[a-z0-9-]`, a length of
//! 1 to [`MAX_LEN`] bytes, and a letter or digit at both ends (the id is also a
//! CDI device name, which must be alphanumeric at both ends).

use std::fmt;

use crate::contract::cdi::ALLOC_KIND;

/// The longest id accepted, in bytes. A pod uid (36) plus `-` and an index fits
/// with a wide margin; the bound keeps file names well under `NAME_MAX`.
pub const MAX_LEN: usize = 100;

/// A validated allocation id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocId(String);

/// Why a string is not an allocation id; each renders as one line naming the
/// offending character, position or length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocIdError {
    /// The id is empty.
    #[error("allocation id is empty")]
    Empty,
    /// The id is longer than [`MAX_LEN`] bytes.
    #[error("allocation id is {len} bytes long, more than {max}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit, [`MAX_LEN`].
        max: usize,
    },
    /// A character outside `[a-z0-9-]`.
    #[error(
        "allocation id {shown}: character {found:?} at byte {position} is not allowed; use a-z, 0-9 and '-'"
    )]
    BadCharacter {
        /// The id, quoted and escaped for one line.
        shown: String,
        /// The offending character.
        found: char,
        /// Its byte offset.
        position: usize,
    },
    /// The first or last character is `-`.
    #[error(
        "allocation id {shown}: must start and end with a letter or digit, found '-' at byte {position}"
    )]
    BadEnd {
        /// The id, quoted and escaped for one line.
        shown: String,
        /// Byte offset of the `-`.
        position: usize,
    },
}

impl AllocId {
    /// Validates `id`: 1 to [`MAX_LEN`] bytes of `[a-z0-9-]`, with a letter or
    /// digit at both ends.
    pub fn new(id: &str) -> Result<AllocId, AllocIdError> {
        if id.is_empty() {
            return Err(AllocIdError::Empty);
        }
        if id.len() > MAX_LEN {
            return Err(AllocIdError::TooLong {
                len: id.len(),
                max: MAX_LEN,
            });
        }
        if let Some((position, found)) = id
            .char_indices()
            .find(|(_, c)| !matches!(c, 'a'..='z' | '0'..='9' | '-'))
        {
            return Err(AllocIdError::BadCharacter {
                shown: format!("{id:?}"),
                found,
                position,
            });
        }
        for position in [0, id.len() - 1] {
            if id.as_bytes()[position] == b'-' {
                return Err(AllocIdError::BadEnd {
                    shown: format!("{id:?}"),
                    position,
                });
            }
        }
        Ok(AllocId(id.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// File name of the allocation's transient spec: `tessera.io-alloc_<id>.json`.
    pub fn spec_file_name(&self) -> String {
        crate::contract::cdi::transient_spec_file(&self.0)
    }

    /// The qualified CDI device name, `tessera.io/alloc=<id>`.
    pub fn qualified_name(&self) -> String {
        format!("{ALLOC_KIND}={}", self.0)
    }
}

impl fmt::Display for AllocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for AllocId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for AllocId {
    type Err = AllocIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocId::new(s)
    }
}

/// What the hook's binding record (`<state_dir>/alloc/<id>/binding.json`)
/// holds: which container holds which allocation. The hook writes it at
/// container creation and removes it at poststop; the device plugin reads it
/// (the reconciler, and the node monitor, which maps NVML's host pids to
/// allocations by the init pid's pid namespace or by the cgroup).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BindingRecord {
    /// The allocation.
    pub alloc_id: String,
    /// The OCI container id.
    pub container_id: String,
    /// The container's init pid in the host's pid namespace.
    pub pid: u32,
    /// The container's cgroup: the v2 path where the host has one in use, else
    /// the `memory` (or first) v1 controller's path.
    pub cgroup: String,
    /// Every line of `/proc/<pid>/cgroup`: controllers (`""` for v2) → path.
    pub cgroups: std::collections::BTreeMap<String, String>,
    /// The bundle directory.
    pub bundle: String,
    /// `cdi` when the runtime applied the spec, `legacy` when the hook did,
    /// `binding` when the hook only recorded the binding.
    pub mode: String,
    /// When the record was written, seconds since the Unix epoch.
    pub bound_at: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uid_and_index_is_an_id_and_names_its_spec() {
        let id = AllocId::new("3f2b7c1a-9d4e-4f6a-8b1c-2d3e4f5a6b7c-0").expect("valid");
        assert_eq!(
            id.spec_file_name(),
            "tessera.io-alloc_3f2b7c1a-9d4e-4f6a-8b1c-2d3e4f5a6b7c-0.json"
        );
        assert_eq!(
            id.qualified_name(),
            "tessera.io/alloc=3f2b7c1a-9d4e-4f6a-8b1c-2d3e4f5a6b7c-0"
        );
    }

    #[test]
    fn errors_name_character_position_and_length() {
        let e = AllocId::new("ab/c").expect_err("slash");
        assert_eq!(
            e.to_string(),
            "allocation id \"ab/c\": character '/' at byte 2 is not allowed; use a-z, 0-9 and '-'"
        );
        let e = AllocId::new(&"a".repeat(300)).expect_err("long");
        assert_eq!(
            e.to_string(),
            "allocation id is 300 bytes long, more than 100"
        );
        let e = AllocId::new("a\0b").expect_err("nul");
        assert!(e.to_string().contains("'\\0' at byte 1"), "{e}");
        assert!(!e.to_string().contains('\n'));
    }
}
