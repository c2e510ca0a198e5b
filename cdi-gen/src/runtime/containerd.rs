//! containerd: `enable_cdi` and `cdi_spec_dirs` in the CRI plugin's table,
//! edited with `toml_edit` so comments, order and layout survive.
//!
//! Which file gets the keys depends on how containerd merges the files its
//! `imports` list names. containerd 1.x merges them **per plugin table**: a
//! later file that names `[plugins."io.containerd.grpc.v1.cri"]` replaces the
//! whole table of an earlier one (checked with containerd 1.7.24's
//! `config dump`; containerd issues 5837 and 7982). A drop-in holding only
//! the two CDI keys would therefore reset every other CRI setting of
//! config.toml to its default. containerd 2.0 merges imported plugin tables
//! key by key (containerd PR 9982), so a drop-in is safe there. Hence
//! ([`choose_target`]):
//! - containerd 1.x: the keys go into the last file, in load order, that
//!   names the CRI table (that table is the one containerd uses); only when
//!   no file names it, and `imports` covers a directory, into a new drop-in;
//! - containerd 2.x: into the drop-in when `imports` covers a directory;
//! - otherwise into config.toml itself.
//!
//! The CRI table's name follows the file's config `version`: 1 (or absent,
//! in a non-empty file) `plugins.cri`, 2 `plugins."io.containerd.grpc.v1.cri"`,
//! 3 (containerd 2.x only) `plugins."io.containerd.cri.v1.runtime"`.

use std::path::{Path, PathBuf};

use toml_edit::{Array, DocumentMut, Item, Table, Value};

use super::{RuntimeError, Version, missing_dirs, toml_error};

/// The name of the drop-in written into a directory `imports` covers; the
/// `99-` sorts it after the files an operator already has there.
pub const DROP_IN_STEM: &str = "99-tessera-cdi";

/// Parses a config file's text; a parse error is one line naming the file.
pub fn parse(text: &str, path: &Path) -> Result<DocumentMut, RuntimeError> {
    text.parse::<DocumentMut>()
        .map_err(|e| RuntimeError::malformed(path, toml_error(text, &e)))
}

/// The file's config version: its `version` key, `None` for a file with no
/// keys at all (a new or empty file: the caller picks), 1 for a non-empty
/// file without one (containerd's own rule).
pub fn config_version(doc: &DocumentMut, path: &Path) -> Result<Option<i64>, RuntimeError> {
    match doc.get("version") {
        None if doc.as_table().is_empty() => Ok(None),
        None => Ok(Some(1)),
        Some(item) => match item.as_integer() {
            Some(v @ 1..=3) => Ok(Some(v)),
            Some(v) => Err(RuntimeError::malformed(
                path,
                format!("version = {v}: containerd knows config versions 1 to 3"),
            )),
            None => Err(RuntimeError::malformed(
                path,
                format!("version: expected an integer, found {}", item.type_name()),
            )),
        },
    }
}

/// The CRI plugin's table name in a file of config version `version`.
pub fn cri_table(version: i64) -> &'static str {
    match version {
        1 => "cri",
        2 => "io.containerd.grpc.v1.cri",
        _ => "io.containerd.cri.v1.runtime",
    }
}

/// The config version a new file gets for containerd `runtime`.
pub fn new_file_version(runtime: Version) -> i64 {
    if runtime.major >= 2 { 3 } else { 2 }
}

/// The `imports` patterns of a config file (empty when absent).
pub fn imports(doc: &DocumentMut, path: &Path) -> Result<Vec<String>, RuntimeError> {
    let Some(item) = doc.get("imports") else {
        return Ok(Vec::new());
    };
    let bad = || RuntimeError::malformed(path, "imports: expected an array of strings");
    item.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
        .collect()
}

/// An `imports` pattern resolved against the file that names it (relative
/// patterns are relative to that file's directory, as containerd does).
pub fn resolve_import(config: &Path, pattern: &str) -> PathBuf {
    let p = Path::new(pattern);
    if p.is_absolute() {
        p.to_owned()
    } else {
        config.parent().unwrap_or(Path::new("/")).join(p)
    }
}

/// The drop-in path for an `imports` pattern that covers a directory: one
/// whose last component is `*<suffix>` (no other wildcard) below a directory
/// without wildcards, e.g. `/etc/containerd/conf.d/*.toml` →
/// `/etc/containerd/conf.d/99-tessera-cdi.toml`. `None` for any other pattern.
pub fn drop_in_for(pattern: &Path) -> Option<PathBuf> {
    let dir = pattern.parent()?;
    let last = pattern.file_name()?.to_str()?;
    let suffix = last.strip_prefix('*')?;
    let wild = |s: &str| s.contains(['*', '?', '[']);
    if wild(suffix) || wild(&dir.to_string_lossy()) {
        return None;
    }
    let suffix = if suffix.is_empty() { ".toml" } else { suffix };
    Some(dir.join(format!("{DROP_IN_STEM}{suffix}")))
}

/// Whether a file name matches a glob's last component (`*` and `?` only;
/// what containerd's imports use in practice).
pub fn name_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some(('*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some(('?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Hidden files match only a pattern that names the dot, as in Go's glob.
    go(&p, &n) && (!name.starts_with('.') || pattern.starts_with('.'))
}

/// Whether a config file names the CRI table (under its own version).
pub fn names_cri_table(doc: &DocumentMut, path: &Path) -> Result<bool, RuntimeError> {
    let version = config_version(doc, path)?.unwrap_or(1);
    Ok(doc
        .get("plugins")
        .and_then(Item::as_table_like)
        .is_some_and(|p| p.contains_key(cri_table(version))))
}

/// Which file gets the CDI keys (see the module's comment): `loaded` are the
/// imported files in containerd's load order (config.toml itself is
/// `main`), with whether each names the CRI table; `drop_in` the drop-in
/// path when `imports` covers a directory.
pub fn choose_target(
    runtime: Version,
    main: &Path,
    main_names_cri: bool,
    loaded: &[(PathBuf, bool)],
    drop_in: Option<&Path>,
) -> PathBuf {
    if runtime.major < 2 {
        if let Some((path, _)) = loaded.iter().rev().find(|(_, names)| *names) {
            return path.clone();
        }
        if main_names_cri {
            return main.to_owned();
        }
    }
    drop_in.map_or_else(|| main.to_owned(), Path::to_owned)
}

/// Sets `enable_cdi = true` and adds the missing `dirs` to `cdi_spec_dirs`
/// in the CRI table of the file `text` (empty: a new file, which gets
/// `version = new_version`). `None` when nothing needs to change.
pub fn enable_cdi(
    text: &str,
    path: &Path,
    runtime: Version,
    new_version: i64,
    dirs: &[String],
) -> Result<Option<String>, RuntimeError> {
    let mut doc = parse(text, path)?;
    let version = match config_version(&doc, path)? {
        Some(v) => v,
        None => {
            doc.insert("version", toml_edit::value(new_version));
            new_version
        }
    };
    if version == 3 && runtime.major < 2 {
        return Err(RuntimeError::malformed(
            path,
            format!("config version 3 needs containerd 2.0 or later, this is containerd {runtime}"),
        ));
    }
    let table_name = cri_table(version);
    let where_ = format!("plugins.\"{table_name}\"");
    let plugins = child_table(doc.as_table_mut(), "plugins", path, "plugins")?;
    let cri = child_table(plugins, table_name, path, &where_)?;
    set_true(cri, "enable_cdi", path, &where_)?;
    add_dirs(cri, "cdi_spec_dirs", dirs, path, &where_)?;
    let out = doc.to_string();
    Ok((out != text).then_some(out))
}

/// The table `key` of `parent`, created (implicit: no header of its own
/// unless it gets keys) when absent; a value of another type is malformed.
pub(crate) fn child_table<'a>(
    parent: &'a mut Table,
    key: &str,
    path: &Path,
    what: &str,
) -> Result<&'a mut Table, RuntimeError> {
    if !parent.contains_key(key) {
        let mut table = Table::new();
        table.set_implicit(true);
        parent.insert(key, Item::Table(table));
    }
    let item = parent
        .get_mut(key)
        .ok_or_else(|| RuntimeError::malformed(path, what))?;
    // An inline table (`plugins = { ... }`) becomes a regular one: keys
    // added to it then get lines of their own.
    if let Item::Value(Value::InlineTable(inline)) = item {
        let table = std::mem::take(inline).into_table();
        *item = Item::Table(table);
    }
    let type_name = item.type_name();
    item.as_table_mut().ok_or_else(|| {
        RuntimeError::malformed(path, format!("{what}: expected a table, found {type_name}"))
    })
}

/// Sets `table.key = true`, keeping the value's comments and spacing.
pub(crate) fn set_true(
    table: &mut Table,
    key: &str,
    path: &Path,
    what: &str,
) -> Result<(), RuntimeError> {
    match table.get_mut(key) {
        None => {
            insert_indented(table, key, toml_edit::value(true));
            Ok(())
        }
        Some(Item::Value(v)) => match v.as_bool() {
            Some(true) => Ok(()),
            Some(false) => {
                let decor = v.decor().clone();
                *v = Value::from(true);
                *v.decor_mut() = decor;
                Ok(())
            }
            None => Err(RuntimeError::malformed(
                path,
                format!("{what}.{key}: expected a boolean, found {}", v.type_name()),
            )),
        },
        Some(other) => Err(RuntimeError::malformed(
            path,
            format!(
                "{what}.{key}: expected a boolean, found {}",
                other.type_name()
            ),
        )),
    }
}

/// Appends the `dirs` that `table.key` (an array of strings) lacks; creates
/// it with `dirs` when absent.
pub(crate) fn add_dirs(
    table: &mut Table,
    key: &str,
    dirs: &[String],
    path: &Path,
    what: &str,
) -> Result<(), RuntimeError> {
    let Some(item) = table.get_mut(key) else {
        let array: Array = dirs.iter().map(String::as_str).collect();
        insert_indented(table, key, toml_edit::value(array));
        return Ok(());
    };
    let type_name = item.type_name();
    let bad = || {
        RuntimeError::malformed(
            path,
            format!("{what}.{key}: expected an array of strings, found {type_name}"),
        )
    };
    let array = item.as_array_mut().ok_or_else(bad)?;
    let present = array
        .iter()
        .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()?;
    for dir in missing_dirs(&present, dirs) {
        array.push(dir.as_str());
    }
    Ok(())
}

/// Inserts a new key indented like the file indents this table's keys.
fn insert_indented(table: &mut Table, key: &str, item: Item) {
    let indent = key_indent(table);
    table.insert(key, item);
    if let Some(mut k) = table.key_mut(key) {
        k.leaf_decor_mut().set_prefix(indent);
    }
}

/// How the file indents this table's keys: like its other keys; with none,
/// like the headers of its sub-tables (containerd's own layout puts keys
/// and sub-table headers at one depth); else two spaces deeper than its own
/// header if that is indented, else not at all.
fn key_indent(table: &Table) -> String {
    fn last_line_ws(prefix: Option<&str>) -> Option<String> {
        let prefix = prefix?;
        let tail = &prefix[prefix.rfind('\n').map_or(0, |i| i + 1)..];
        tail.chars()
            .all(|c| c == ' ' || c == '\t')
            .then(|| tail.to_owned())
    }
    let sibling = table.iter().find_map(|(k, item)| {
        item.is_value()
            .then(|| table.key(k))
            .flatten()
            .and_then(|key| last_line_ws(key.leaf_decor().prefix().and_then(|p| p.as_str())))
    });
    if let Some(indent) = sibling {
        return indent;
    }
    let child = table.iter().find_map(|(_, item)| match item {
        Item::Table(t) if !t.is_implicit() => {
            last_line_ws(t.decor().prefix().and_then(|p| p.as_str())).filter(|w| !w.is_empty())
        }
        _ => None,
    });
    if let Some(indent) = child {
        return indent;
    }
    match last_line_ws(table.decor().prefix().and_then(|p| p.as_str())) {
        Some(own) if !own.is_empty() => format!("{own}  "),
        _ => String::new(),
    }
}
