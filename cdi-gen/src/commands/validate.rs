//! `tessera-cdi validate FILE`: strict check of a spec file.

use std::path::{Path, PathBuf};

use tessera_model::cdi::Spec;

use crate::CdiGenError;

/// Arguments of `validate`.
#[derive(Debug, Clone, clap::Args)]
pub struct ValidateArgs {
    /// Spec file (`.json`, `.yaml` or `.yml`).
    pub file: PathBuf,
}

/// Specs larger than this are refused before parsing; real ones are a few KiB.
const MAX_SPEC_BYTES: u64 = 16 << 20;

/// Reads, parses (unknown fields rejected) and validates a spec file.
pub fn run(args: &ValidateArgs) -> Result<Spec, CdiGenError> {
    let spec = load(&args.file)?;
    spec.validate().map_err(|problems| CdiGenError::Invalid {
        path: args.file.clone(),
        problems: problems.iter().map(ToString::to_string).collect(),
    })?;
    Ok(spec)
}

/// Reads and parses a spec file, choosing the format by extension.
pub fn load(path: &Path) -> Result<Spec, CdiGenError> {
    let io = |source| CdiGenError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.len() > MAX_SPEC_BYTES {
        return Err(CdiGenError::Parse {
            path: path.to_owned(),
            reason: format!(
                "{} bytes is larger than the {MAX_SPEC_BYTES}-byte limit",
                meta.len()
            ),
        });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let parse_err = |reason: String| CdiGenError::Parse {
        path: path.to_owned(),
        reason,
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("yaml" | "yml") => serde_yaml::from_str(&text).map_err(|e| parse_err(e.to_string())),
        Some("json") => serde_json::from_str(&text).map_err(|e| parse_err(e.to_string())),
        _ => Err(parse_err(
            "unknown extension: CDI loads only .json and .yaml files".to_owned(),
        )),
    }
}
