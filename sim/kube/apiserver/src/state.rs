//! `--state FILE`: the store saved as JSON so the stand-in survives a
//! restart (objects and the resourceVersion counter; the watch history is
//! not kept). Written atomically (temporary file, fsync, rename, fsync of
//! the directory), debounced after changes and once more at shutdown.
//!
//! A crash loses the changes made since the last save, and with them
//! resourceVersions clients may have seen. So a loaded store does not go on
//! from the saved counter: it starts past anything the crashed server could
//! have handed out ([`resume_rv`]), and every watch or continue token from
//! before the restart gets 410 (clients relist), and an update carrying a
//! lost version gets 409, never succeeds.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

use crate::resources::RESOURCES;
use crate::store::Store;
use crate::types;

/// How long after a change the state is written (changes in between are
/// written together).
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// A state file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading failed.
    #[error("state file {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The contents are not a state file.
    #[error("state file {path}: {what} (remove or fix the file to start afresh)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        what: String,
    },
    /// Writing failed.
    #[error("state file {path}: writing: {error}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

/// Loads the store saved at `path`; `Ok(None)` when there is no file.
pub fn load(path: &Path, window: usize) -> Result<Option<Store>, StateError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(StateError::Read {
                path: path.to_owned(),
                error,
            });
        }
    };
    let corrupt = |what: String| StateError::Corrupt {
        path: path.to_owned(),
        what,
    };
    let doc: Value =
        serde_json::from_slice(&text).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    let rv = doc
        .get("resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| {
            corrupt("\"resourceVersion\" is missing or not a number in a string".into())
        })?;
    let items = doc
        .get("objects")
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt("\"objects\" is missing or not a list".into()))?;
    let mut objects = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let api_version = item.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = item.get("kind").and_then(Value::as_str).unwrap_or("");
        let idx = RESOURCES
            .iter()
            .position(|r| r.kind == kind && r.api_version() == api_version)
            .ok_or_else(|| {
                corrupt(format!(
                    "objects[{i}]: unknown apiVersion/kind {api_version:?}/{kind:?}"
                ))
            })?;
        let value = types::normalize(&RESOURCES[idx], item.clone())
            .map_err(|e| corrupt(format!("objects[{i}]: {}", e.message)))?;
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let object_rv = value
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<u64>().ok());
        if name.is_empty() || object_rv.is_none_or(|r| r > rv) {
            return Err(corrupt(format!(
                "objects[{i}]: missing name, or resourceVersion missing or above the file's"
            )));
        }
        objects.push((idx, value));
    }
    Ok(Some(Store::from_objects(resume_rv(rv), objects, window)))
}

/// The counter a store loaded from a file saved at `saved` starts at: the
/// current time in microseconds since the epoch, or `saved + 1` if that is
/// larger. A server hands out far fewer than one version per microsecond,
/// so no version from before a crash (saved or not) reaches it.
pub fn resume_rv(saved: u64) -> u64 {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2))
        .unwrap_or(0);
    micros.max(saved.saturating_add(1))
}

/// Writes the store to `path` atomically.
pub fn save(store: &Store, path: &Path) -> Result<(), StateError> {
    let (rv, objects) = store.dump();
    let mut body =
        Vec::with_capacity(objects.iter().map(|o| o.bytes.len() + 2).sum::<usize>() + 64);
    body.extend_from_slice(format!("{{\"resourceVersion\":\"{rv}\",\"objects\":[").as_bytes());
    for (i, o) in objects.iter().enumerate() {
        if i > 0 {
            body.extend_from_slice(b",\n");
        }
        body.extend_from_slice(&o.bytes);
    }
    body.extend_from_slice(b"]}\n");
    write_atomic(path, &body).map_err(|error| StateError::Write {
        path: path.to_owned(),
        error,
    })
}

/// Writes `contents` to a temporary file beside `path`, syncs it and
/// renames it over `path`.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself survives a power cut only once the directory is synced.
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Saves the store [`DEBOUNCE`] after changes until shutdown (the final
/// save at shutdown is the caller's).
pub async fn saver(store: Arc<Store>, path: PathBuf, mut shutdown: watch::Receiver<bool>) {
    let mut changes = store.subscribe();
    let mut saved = store.current_rv();
    loop {
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(DEBOUNCE) => {}
            _ = shutdown.changed() => return,
        }
        changes.borrow_and_update();
        let rv = store.current_rv();
        if rv == saved {
            continue;
        }
        let (store2, path2) = (store.clone(), path.clone());
        match tokio::task::spawn_blocking(move || save(&store2, &path2)).await {
            Ok(Ok(())) => saved = rv,
            Ok(Err(e)) => tracing::error!("{e}"),
            Err(e) => tracing::error!("saving the state: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn round_trip_keeps_objects_and_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let store = Store::with_default_namespaces(10);
        let cms = RESOURCES
            .iter()
            .find(|r| r.plural == "configmaps")
            .expect("configmaps");
        let cm = types::normalize(cms, json!({"metadata": {"name": "c"}, "data": {"k": "v"}}))
            .expect("cm");
        store.create(cms, Some("default"), cm).expect("created");
        save(&store, &path).expect("saved");
        let loaded = load(&path, 10).expect("loads").expect("present");
        assert!(loaded.current_rv() > store.current_rv());
        let got = loaded.get(cms, Some("default"), "c").expect("kept");
        assert_eq!(got.value["data"]["k"], "v");
        assert_eq!(got.rv, 5);
        assert!(
            load(&dir.path().join("none"), 10)
                .expect("absent is fine")
                .is_none()
        );
    }

    #[test]
    fn a_loaded_store_never_reuses_versions_and_refuses_old_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let cms = RESOURCES
            .iter()
            .find(|r| r.plural == "configmaps")
            .expect("configmaps");
        let store = Store::with_default_namespaces(100);
        let c = store
            .create(
                cms,
                Some("default"),
                types::normalize(cms, json!({"metadata": {"name": "c"}})).expect("cm"),
            )
            .expect("created");
        save(&store, &path).expect("saved");
        // Sets data.k of ConfigMap c.
        let set_k = |store: &Store, k: &str| {
            store
                .patch(
                    cms,
                    Some("default"),
                    "c",
                    crate::patch::PatchType::Merge,
                    json!({"data": {"k": k}}).to_string().as_bytes(),
                    false,
                )
                .expect("patched")
        };
        // Written after the save, then lost in a crash.
        let lost = set_k(&store, "lost");
        assert!(lost.rv > c.rv);

        let loaded = load(&path, 100).expect("loads").expect("present");
        assert!(
            loaded.current_rv() > lost.rv,
            "past every version handed out"
        );
        // A watch from a version the crashed server handed out, or from one
        // before the restart, must relist.
        assert_eq!(loaded.changes_since(lost.rv).expect_err("lost").code, 410);
        assert_eq!(loaded.changes_since(c.rv).expect_err("old").code, 410);
        // The next write does not reuse the lost version, so an update
        // carrying it conflicts.
        let next = set_k(&loaded, "after");
        assert_ne!(next.rv, lost.rv);
        let mut stale = lost.value.clone();
        stale["data"]["k"] = json!("stale");
        let e = loaded
            .update(cms, Some("default"), "c", stale, false)
            .expect_err("stale");
        assert_eq!(e.code, 409);
    }

    #[test]
    fn corrupt_file_is_one_line_error_and_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        for bad in [
            "{not json",
            r#"{"resourceVersion":"x","objects":[]}"#,
            r#"{"resourceVersion":"3","objects":[{"apiVersion":"v9","kind":"Pod"}]}"#,
        ] {
            std::fs::write(&path, bad).expect("written");
            let e = load(&path, 10).err().expect("refused");
            let text = e.to_string();
            assert!(
                !text.contains('\n') && text.contains("state.json"),
                "{text}"
            );
            assert_eq!(std::fs::read_to_string(&path).expect("still there"), bad);
        }
    }
}
