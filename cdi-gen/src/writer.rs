//! Serializing specs and writing them atomically.
//!
//! A runtime may read the spec directory at any moment, so a spec is written to
//! a temporary file in the target directory and renamed over the old one: a
//! reader sees the old file or the new one, never a half-written one.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tessera_model::cdi::Spec;

use crate::CdiGenError;

/// Output format of a spec file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// JSON (the default; what the transient specs use).
    Json,
    /// YAML.
    Yaml,
}

/// Renders a spec in the given format, newline-terminated.
pub fn render(spec: &Spec, format: Format) -> Result<String, CdiGenError> {
    let mut text = match format {
        Format::Json => serde_json::to_string_pretty(spec).map_err(|e| e.to_string()),
        Format::Yaml => serde_yaml::to_string(spec).map_err(|e| e.to_string()),
    }
    .map_err(|reason| CdiGenError::Parse {
        path: PathBuf::from("<spec>"),
        reason,
    })?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// Writes `contents` to `path` atomically with mode 0644: a temporary file in
/// the same directory, flushed to disk, then renamed over `path`. On any error
/// the temporary file is removed and `path` is left as it was.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), CdiGenError> {
    write_atomic_as(path, contents, 0o644, None)
}

/// [`write_atomic`] with the file's permission bits `mode` and, when given,
/// its owner `(uid, gid)`: what replacing someone else's config file needs,
/// so the new file has the old one's mode and owner.
pub fn write_atomic_as(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), CdiGenError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CdiGenError::Io { path, source }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| CdiGenError::Io {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
    })?;
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    // A leading dot keeps runtimes from loading the temporary file: they read
    // only `*.json` and `*.yaml`, and this name ends in `.tmp`.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode & 0o7777)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(&tmp))?;
    // From here on the temporary file is ours to remove if anything fails.
    let result = (|| {
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io(&tmp))?;
        }
        // The umask may have narrowed the mode given at creation (and chown
        // clears set-id bits): set it last.
        file.set_permissions(fs::Permissions::from_mode(mode & 0o7777))
            .map_err(io(&tmp))?;
        file.write_all(contents).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        fs::rename(&tmp, path).map_err(io(path))?;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn atomic_write_replaces_content_with_mode_0644_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join(tessera_model::contract::cdi::STATIC_SPEC_FILE);
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o644);
        let entries: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "temporary file left behind");
    }

    #[test]
    fn failed_write_leaves_the_old_file_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        write_atomic(&path, b"old").unwrap();
        // A directory where the temp file would go makes creation fail.
        let tmp = dir
            .path()
            .join(format!(".spec.json.{}.tmp", std::process::id()));
        fs::create_dir(&tmp).unwrap();
        assert!(write_atomic(&path, b"new").is_err());
        assert_eq!(fs::read(&path).unwrap(), b"old");
    }
}
