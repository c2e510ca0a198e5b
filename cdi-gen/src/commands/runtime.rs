//! `tessera-cdi runtime configure`: the I/O around [`crate::runtime`] —
//! asking the runtime its version, reading the config files, writing the
//! one that changes atomically (same mode and owner), or printing a diff.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::runtime::{
    self, DEFAULT_CDI_SPEC_DIRS, Runtime, RuntimeError, Version, containerd, crio, docker,
};

/// Config files larger than this are refused before parsing.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Arguments of `runtime`.
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: RuntimeCommand,
}

/// The verbs of `runtime`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RuntimeCommand {
    /// Enable CDI in a container runtime's configuration, and nothing else.
    #[command(after_help = CONFIGURE_HELP)]
    Configure(ConfigureArgs),
}

const CONFIGURE_HELP: &str = "\
What changes:
  containerd >= 1.7  enable_cdi = true and cdi_spec_dirs in the CRI plugin's table
                     (config.toml, or a drop-in where `imports` covers a directory
                     and containerd's merge rules make one safe)
  CRI-O >= 1.23      cdi_spec_dirs under [crio.runtime] in a drop-in
  Docker >= 25       \"features\": {\"cdi\": true} in daemon.json
Comments, layout and every other setting are kept; the default runtime is never
changed. A second run finds nothing to do. Nothing is restarted: restart the
runtime to apply.

Exit status: 0 done or already configured, 1 a runtime or file could not be read
or written, 2 a malformed config file or bad arguments (nothing written),
3 the runtime's version has no CDI (containerd 1.6: use the device plugin's
native mode, `tessera-device-plugin --cdi-mode native`, and the base runtime
spec in /usr/share/doc/tessera-node/examples/containerd/).";

/// Arguments of `runtime configure`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigureArgs {
    /// The runtime to configure.
    #[arg(long, value_enum)]
    pub runtime: Runtime,
    /// Print a unified diff of what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The config file [default: /etc/containerd/config.toml,
    /// /etc/crio/crio.conf.d/99-tessera-cdi.conf, /etc/docker/daemon.json].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A CDI spec directory the runtime must read (repeatable)
    /// [default: /etc/cdi and /var/run/cdi].
    #[arg(long = "cdi-spec-dir", value_name = "DIR")]
    pub cdi_spec_dirs: Vec<String>,
    /// The runtime's program asked for its version [default: containerd,
    /// crio or docker on PATH].
    #[arg(long, value_name = "FILE", conflicts_with = "runtime_version")]
    pub runtime_binary: Option<PathBuf>,
    /// The runtime's version, instead of asking its program.
    #[arg(long, value_name = "X.Y.Z")]
    pub runtime_version: Option<Version>,
}

/// What `configure` found or did.
#[derive(Debug)]
pub struct Configured {
    /// The runtime.
    pub runtime: Runtime,
    /// Its version.
    pub version: Version,
    /// The file that holds (or would hold) the CDI settings.
    pub file: PathBuf,
    /// The outcome.
    pub outcome: Outcome,
}

/// The outcome of `configure`.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// CDI was already enabled; nothing was written.
    AlreadyConfigured,
    /// The file was written.
    Written,
    /// `--dry-run`: the diff of what would be written.
    WouldWrite(String),
}

/// Checks the runtime's version, edits its config, and writes it unless
/// `--dry-run` (then returns the diff).
pub fn configure(args: &ConfigureArgs) -> Result<Configured, RuntimeError> {
    let runtime = args.runtime;
    let version = match args.runtime_version {
        Some(v) => v,
        None => ask_version(runtime, args.runtime_binary.as_deref())?,
    };
    runtime.check_cdi(version)?;
    let dirs: Vec<String> = if args.cdi_spec_dirs.is_empty() {
        DEFAULT_CDI_SPEC_DIRS
            .iter()
            .map(|d| (*d).to_owned())
            .collect()
    } else {
        args.cdi_spec_dirs.clone()
    };
    if let Some(bad) = dirs.iter().find(|d| !d.starts_with('/')) {
        return Err(RuntimeError::malformed(
            Path::new("--cdi-spec-dir"),
            format!("{bad:?} is not an absolute path"),
        ));
    }
    let config = args
        .config
        .clone()
        .unwrap_or_else(|| runtime.default_config().to_owned());
    let (file, old, new) = match runtime {
        Runtime::Containerd => {
            let (file, old) = containerd_target(&config, version)?;
            let new = containerd::enable_cdi(
                &old,
                &file,
                version,
                containerd::new_file_version(version),
                &dirs,
            )?;
            (file, old, new)
        }
        Runtime::Crio => {
            let old = read_optional(&config)?.unwrap_or_default();
            let new = crio::enable_cdi(&old, &config, &dirs)?;
            (config, old, new)
        }
        Runtime::Docker => {
            let old = read_optional(&config)?.unwrap_or_default();
            let new = docker::enable_cdi(&old, &config, &dirs)?;
            (config, old, new)
        }
    };
    let outcome = match new {
        None => Outcome::AlreadyConfigured,
        Some(new) if args.dry_run => {
            let exists = file.exists();
            let label = file.display().to_string();
            let old_label = if exists {
                label.clone()
            } else {
                "/dev/null".to_owned()
            };
            Outcome::WouldWrite(runtime::diff::unified(&old, &new, &old_label, &label))
        }
        Some(new) => {
            write(&file, &new)?;
            Outcome::Written
        }
    };
    Ok(Configured {
        runtime,
        version,
        file,
        outcome,
    })
}

/// Runs the runtime's version command and finds the version in its output.
fn ask_version(runtime: Runtime, binary: Option<&Path>) -> Result<Version, RuntimeError> {
    let (program, args) = runtime.version_command();
    let program = binary.map_or_else(|| PathBuf::from(program), Path::to_owned);
    let command = format!("{} {}", program.display(), args.join(" "));
    let failed = |reason: String| RuntimeError::Version {
        runtime,
        command: command.clone(),
        reason,
    };
    let out = Command::new(&program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| failed(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr
            .lines()
            .chain(stdout.lines())
            .find(|l| !l.trim().is_empty());
        return Err(failed(format!(
            "{}{}",
            out.status,
            first.map(|l| format!(": {}", l.trim())).unwrap_or_default()
        )));
    }
    Version::find_in(&stdout).ok_or_else(|| {
        failed(format!(
            "no version in its output {:?}",
            stdout.lines().next().unwrap_or("")
        ))
    })
}

/// Reads a config file; `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, RuntimeError> {
    let io = |source| RuntimeError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_file() {
        return Err(RuntimeError::malformed(path, "not a regular file"));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(RuntimeError::malformed(
            path,
            format!("{} bytes is more than a config file has", meta.len()),
        ));
    }
    let bytes = fs::read(path).map_err(io)?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| RuntimeError::malformed(path, format!("not UTF-8 text: {e}")))
}

/// The containerd file that gets the CDI keys, and its current text (empty
/// for a file to create): config.toml and the files its `imports` name are
/// read and [`containerd::choose_target`] decides.
fn containerd_target(main: &Path, version: Version) -> Result<(PathBuf, String), RuntimeError> {
    let Some(text) = read_optional(main)? else {
        return Ok((main.to_owned(), String::new()));
    };
    let doc = containerd::parse(&text, main)?;
    let main_names_cri = containerd::names_cri_table(&doc, main)?;
    let mut loaded: Vec<(PathBuf, bool, String)> = Vec::new();
    let mut drop_in = None;
    for pattern in containerd::imports(&doc, main)? {
        let pattern = containerd::resolve_import(main, &pattern);
        if drop_in.is_none() {
            drop_in = containerd::drop_in_for(&pattern);
        }
        for file in expand(&pattern)? {
            if file == main || loaded.iter().any(|(p, _, _)| *p == file) {
                continue;
            }
            let Some(text) = read_optional(&file)? else {
                continue;
            };
            let names = containerd::names_cri_table(&containerd::parse(&text, &file)?, &file)?;
            loaded.push((file, names, text));
        }
    }
    let flags: Vec<(PathBuf, bool)> = loaded.iter().map(|(p, n, _)| (p.clone(), *n)).collect();
    let target =
        containerd::choose_target(version, main, main_names_cri, &flags, drop_in.as_deref());
    let text = if target == main {
        text
    } else if let Some((_, _, t)) = loaded.into_iter().find(|(p, _, _)| *p == target) {
        t
    } else {
        read_optional(&target)?.unwrap_or_default()
    };
    Ok((target, text))
}

/// The files an `imports` pattern names, sorted by name as containerd's
/// glob does; wildcards are honoured in the last component only.
fn expand(pattern: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    let Some(name) = pattern.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    if !name.contains(['*', '?']) {
        return Ok(vec![pattern.to_owned()]);
    }
    let dir = pattern.parent().unwrap_or(Path::new("/"));
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(RuntimeError::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| containerd::name_matches(name, n))
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

/// Writes `text` to `path` atomically: over a symlink, to the file it
/// points at; keeping an existing file's mode and owner (a new one: 0644).
fn write(path: &Path, text: &str) -> Result<(), RuntimeError> {
    let target = match fs::canonicalize(path) {
        Ok(real) => real,
        Err(_) => path.to_owned(),
    };
    let (mode, owner) = match fs::metadata(&target) {
        Ok(m) => (m.mode(), Some((m.uid(), m.gid()))),
        Err(_) => (0o644, None),
    };
    crate::writer::write_atomic_as(&target, text.as_bytes(), mode, owner).map_err(|e| match e {
        crate::CdiGenError::Io { path, source } => RuntimeError::Io { path, source },
        other => RuntimeError::Io {
            path: target.clone(),
            source: std::io::Error::other(other.to_string()),
        },
    })
}
