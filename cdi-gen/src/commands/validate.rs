//! `tessera-cdi validate FILE...`: strict check of spec files, CDI's rules
//! plus the contract of Tessera's own kinds (a `tessera.io/alloc` spec must
//! carry `TESSERA_ALLOC_ID` and both hook entries).

use std::path::{Path, PathBuf};

use tessera_model::cdi::Spec;

use crate::CdiGenError;

/// Arguments of `validate`.
#[derive(Debug, Clone, clap::Args)]
pub struct ValidateArgs {
    /// Spec files (`.json`, `.yaml` or `.yml`).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Specs larger than this are refused before parsing; real ones are a few KiB.
const MAX_SPEC_BYTES: u64 = 16 << 20;

/// Reads, parses (unknown fields rejected) and validates each file; every
/// file is checked even after one fails. Returns each file's outcome in order.
pub fn run(args: &ValidateArgs) -> Vec<(PathBuf, Result<Spec, CdiGenError>)> {
    args.files
        .iter()
        .map(|file| (file.clone(), check(file)))
        .collect()
}

/// Reads, parses and validates one spec file.
pub fn check(file: &Path) -> Result<Spec, CdiGenError> {
    let spec = load(file)?;
    spec.validate_tessera()
        .map_err(|problems| CdiGenError::Invalid {
            path: file.to_owned(),
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
