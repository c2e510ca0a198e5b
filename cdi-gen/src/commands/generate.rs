//! `tessera-cdi generate`: discover the node and write its static spec.

use std::path::{Path, PathBuf};

use tessera_model::contract;
use tessera_model::edits::HookSettings;
use tessera_model::facts::LibraryGroups;

use super::NodeArgs;
use crate::CdiGenError;
use crate::writer::{self, Format};

/// Arguments of `generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    /// Where the node is.
    pub node: NodeArgs,
    /// Spec file to write (atomically, mode 0644); `-` writes to standard output.
    #[arg(long, short, value_name = "FILE", default_value = contract::cdi::STATIC_SPEC_PATH)]
    pub output: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "json")]
    pub format: Format,
    /// Host path of the hook binary named in the spec.
    #[arg(long, value_name = "FILE", default_value = contract::hook::BINARY_PATH)]
    pub hook_path: String,
    /// `hook.toml` the hook reads, written into its args as `--config FILE`
    /// (a node whose CDI or state directory is not the default needs one).
    #[arg(long, value_name = "FILE")]
    pub hook_config: Option<String>,
    /// Driver-file groups the spec mounts: a comma-separated list of compute,
    /// video, graphics, utilities, or all.
    #[arg(long, value_name = "GROUPS", default_value_t = LibraryGroups::default())]
    pub library_groups: LibraryGroups,
    /// Succeed on a node with nothing to describe (no GPU, or only GPUs in
    /// MIG mode without instances: dynamic MIG's starting point, whose
    /// devices come from the device plugin's transient specs), removing the
    /// spec at --output if there is one: it can only describe devices that
    /// are gone. Without it such a node is an error and the file is kept.
    #[arg(long)]
    pub allow_empty: bool,
}

/// What `generate` did, for the caller to report.
#[derive(Debug)]
pub enum Generated {
    /// A spec was written.
    Written {
        /// Where the spec went (`-` for standard output).
        output: PathBuf,
        /// Number of devices in the spec.
        devices: usize,
        /// The spec's `cdiVersion`.
        cdi_version: String,
    },
    /// The node had nothing to describe and `--allow-empty` was given.
    Empty {
        /// The spec file that was removed, if there was one.
        removed: Option<PathBuf>,
    },
}

/// Discovers the node, builds the static spec and writes it.
pub fn run(args: &GenerateArgs) -> Result<Generated, CdiGenError> {
    if !args.hook_path.starts_with('/') {
        return Err(CdiGenError::Parse {
            path: PathBuf::from("--hook-path"),
            reason: format!("{:?} is not an absolute path", args.hook_path),
        });
    }
    if let Some(config) = &args.hook_config
        && (!config.starts_with('/') || config.contains('\0'))
    {
        return Err(CdiGenError::Parse {
            path: PathBuf::from("--hook-config"),
            reason: format!("{config:?} is not an absolute path"),
        });
    }
    let facts = crate::discover_node(&args.node.layout(), args.node.nvml_lib.as_deref())?;
    let hook = HookSettings {
        path: args.hook_path.clone(),
        env: vec![contract::hook::PATH_ENV.to_owned()],
        config: args.hook_config.clone(),
    };
    let spec = match crate::static_spec(&facts, &hook, &args.library_groups) {
        Err(CdiGenError::NoDevices) if args.allow_empty => return remove_stale(&args.output),
        other => other?,
    };
    let text = writer::render(&spec, args.format)?;
    if args.output.as_os_str() == "-" {
        use std::io::Write;
        std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|source| CdiGenError::Io {
                path: PathBuf::from("<stdout>"),
                source,
            })?;
    } else {
        writer::write_atomic(&args.output, text.as_bytes())?;
    }
    tracing::info!(
        output = %args.output.display(),
        devices = spec.devices.len(),
        cdi_version = %spec.cdi_version,
        "spec written"
    );
    Ok(Generated::Written {
        output: args.output.clone(),
        devices: spec.devices.len(),
        cdi_version: spec.cdi_version,
    })
}

/// Removes the spec at `output` (if any) of a node that has nothing to
/// describe now; standard output gets nothing.
fn remove_stale(output: &Path) -> Result<Generated, CdiGenError> {
    if output.as_os_str() == "-" {
        return Ok(Generated::Empty { removed: None });
    }
    let removed = match std::fs::remove_file(output) {
        Ok(()) => Some(output.to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(CdiGenError::Io {
                path: output.to_owned(),
                source,
            });
        }
    };
    tracing::info!(removed = ?removed, "nothing to describe: no static spec");
    Ok(Generated::Empty { removed })
}
