//! CRI-O: a drop-in under `/etc/crio/crio.conf.d/` with `cdi_spec_dirs`
//! under `[crio.runtime]`. CRI-O resolves CDI devices itself from 1.23 on
//! (there is no switch to turn on); its drop-ins override the main file key
//! by key, so the drop-in holds only this key.

use std::path::Path;

use super::RuntimeError;
use super::containerd::{add_dirs, child_table, parse};

/// The first lines of a drop-in this command creates.
const HEADER: &str = "# Written by `tessera-cdi runtime configure --runtime crio`: the directories\n\
# CRI-O reads CDI specs from (Tessera writes its specs to /var/run/cdi).\n";

/// Adds the missing `dirs` to `[crio.runtime] cdi_spec_dirs` in the drop-in
/// `text` (empty: a new file). `None` when nothing needs to change.
pub fn enable_cdi(
    text: &str,
    path: &Path,
    dirs: &[String],
) -> Result<Option<String>, RuntimeError> {
    let mut doc = parse(text, path)?;
    let new_file = text.trim().is_empty();
    let crio = child_table(doc.as_table_mut(), "crio", path, "crio")?;
    let runtime = child_table(crio, "runtime", path, "crio.runtime")?;
    if new_file {
        runtime.decor_mut().set_prefix(HEADER);
    }
    add_dirs(runtime, "cdi_spec_dirs", dirs, path, "crio.runtime")?;
    let out = doc.to_string();
    Ok((out != text).then_some(out))
}
