//! The one prerequisite rule of every Tessera test.
//!
//! A test that needs something of the machine (root, a program, a build
//! output) says so first, with [`require`]. What happens when it is missing
//! depends on the mode:
//!
//! - **required** (`CI` set, or `TESSERA_REQUIRE_ALL=1`, as `scripts/test.sh`
//!   and `.ci/run` set it): the test fails with one line,
//!   `missing prerequisite: <what> (<how to get it>)`;
//! - **local** (anything else): the test skips. It writes
//!   `SKIPPED <test>: missing <what> (<how to get it>)` straight to the
//!   process's stderr (cargo's capture only takes `print!`/`eprint!`, so the
//!   line shows even for a passing test) and appends it to the skip ledger
//!   ([`ledger_path`]), which `scripts/test.sh` counts.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Something a test needs of the machine it runs on.
#[derive(Debug, Clone)]
pub enum Need {
    /// Running as root (trust checks on root-owned files, namespaces, mounts).
    Root,
    /// Making character device nodes (`mknod`: root with `CAP_MKNOD`).
    DeviceNodes,
    /// A program on `PATH` or in the sbin directories.
    Program(&'static str),
    /// A workspace build output in `target/<profile>/` (see [`crate::artefact`]).
    Built(&'static str),
    /// A file at a fixed path, and how to get it.
    File {
        /// The path.
        path: PathBuf,
        /// How to get it, e.g. `apt-get install runc`.
        fix: String,
    },
    /// Any other condition the test checked itself.
    Condition {
        /// Whether it holds.
        holds: bool,
        /// What must hold, e.g. `unshare --pid works`.
        what: String,
        /// How to make it hold.
        fix: String,
    },
}

impl Need {
    /// A condition the caller checked: `holds`, described by `what`, made to
    /// hold by `fix`.
    pub fn condition(holds: bool, what: impl Into<String>, fix: impl Into<String>) -> Need {
        Need::Condition {
            holds,
            what: what.into(),
            fix: fix.into(),
        }
    }

    /// A file that must not exist on this machine (`why`: what it would spoil).
    pub fn absent(path: impl AsRef<Path>, why: &str) -> Need {
        let path = path.as_ref();
        Need::condition(
            !path.exists(),
            format!("{} absent ({why})", path.display()),
            format!("remove {} or run on another machine", path.display()),
        )
    }

    /// `None` when met; else what is missing and how to get it.
    fn missing(&self) -> Option<(String, String)> {
        match self {
            Need::Root => (!is_root()).then(|| ("root".to_owned(), "run as root".to_owned())),
            Need::DeviceNodes => can_mknod().err().map(|e| {
                (
                    format!("device nodes (mknod: {e})"),
                    "run as root with CAP_MKNOD".to_owned(),
                )
            }),
            Need::Program(name) => which(name).is_none().then(|| {
                (
                    format!("program {name}"),
                    format!("install: apt-get install {}", package_of(name)),
                )
            }),
            Need::Built(name) => {
                let path = crate::target_dir().join(name);
                (!path.exists()).then(|| {
                    (
                        format!("build output {}", path.display()),
                        build_hint(name).to_owned(),
                    )
                })
            }
            Need::File { path, fix } => {
                (!path.exists()).then(|| (format!("file {}", path.display()), fix.clone()))
            }
            Need::Condition { holds, what, fix } => (!holds).then(|| (what.clone(), fix.clone())),
        }
    }
}

/// Why a test did not run: returned by [`require`] after it printed and
/// recorded the skip. Return from the test on it.
#[derive(Debug, Clone)]
#[must_use = "a skipped test must return"]
pub struct Skip {
    /// The skip line (without `SKIPPED <test>: `).
    pub reason: String,
}

/// Checks `needs`, in order. All met: `Ok(())`. Something missing: in
/// required mode the test fails here with one line naming what to install;
/// otherwise the skip is printed where `cargo test` shows it, recorded in
/// the ledger, and returned.
///
/// ```text
/// let Ok(()) = require(&[Need::Root, Need::Program("runc")]) else { return };
/// ```
#[track_caller]
pub fn require(needs: &[Need]) -> Result<(), Skip> {
    let missing: Vec<(String, String)> = needs.iter().filter_map(Need::missing).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let reason = missing
        .iter()
        .map(|(what, fix)| format!("{what} ({fix})"))
        .collect::<Vec<_>>()
        .join("; ");
    if required() {
        panic!("missing prerequisite: {reason}");
    }
    let test = test_name();
    let line = format!("SKIPPED {test}: missing {reason}\n");
    // Straight to the handle: libtest's capture takes only the print macros.
    let _ = std::io::stderr().write_all(line.as_bytes());
    record(&line);
    Err(Skip { reason })
}

/// [`require`] for a test function: returns from it when something is missing.
///
/// ```text
/// require!(Need::Root, Need::Program("runc"));
/// ```
#[macro_export]
macro_rules! require {
    ($($need:expr),+ $(,)?) => {
        if $crate::prereq::require(&[$($need),+]).is_err() {
            return;
        }
    };
}

/// Whether a missing prerequisite fails the test (`CI`, or
/// `TESSERA_REQUIRE_ALL`, set to anything but empty, `0` or `false`).
pub fn required() -> bool {
    let set =
        |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set("CI") || set("TESSERA_REQUIRE_ALL")
}

/// Where skips are recorded: `$TESSERA_SKIP_LOG`, else `tessera-skips.log`
/// in cargo's target directory (the test executable's ancestor holding
/// `CACHEDIR.TAG`), else in the temporary directory.
pub fn ledger_path() -> PathBuf {
    if let Some(path) = std::env::var_os("TESSERA_SKIP_LOG").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .skip(1)
                .find(|dir| dir.join("CACHEDIR.TAG").is_file())
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(std::env::temp_dir)
        .join("tessera-skips.log")
}

fn record(line: &str) {
    let path = ledger_path();
    let written = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        let _ = writeln!(
            std::io::stderr(),
            "(could not record the skip in {}: {e})",
            path.display()
        );
    }
}

/// `<test binary>::<test>`: libtest runs each test on a thread named after it.
fn test_name() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => s,
        })
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    format!("{binary}::{test}")
}

/// Whether the effective uid is root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether this process may make device nodes; why not when it may not.
fn can_mknod() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    tessera_sim::devnode::make_char_node(&dir.path().join("probe"), 1, 3, 0o666)
        .map_err(|e| e.to_string())
}

/// Looks a program up in `PATH` and the sbin directories.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .filter(|d| !d.is_empty())
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// The Debian package that ships `program`.
fn package_of(program: &str) -> &str {
    match program {
        "cc" | "gcc" => "build-essential",
        "unshare" | "flock" | "mount" | "nsenter" => "util-linux",
        "busybox" => "busybox-static",
        other => other,
    }
}

fn build_hint(name: &str) -> &'static str {
    if name.contains("tessera-hook") {
        "build: bash scripts/build-hook.sh debug"
    } else {
        "build: cargo build --workspace"
    }
}
