//! `tessera-hook`: the OCI hook named by every Tessera CDI spec.
//!
//! This first version only checks the OCI state the runtime hands it on
//! standard input and exits: containers from the static `tessera.io/gpu` spec
//! need nothing at run time. Binding to allocations and legacy injection come
//! with the hook issue; the contract (argv, stdin, explicit env) is fixed now so
//! specs generated today stay valid.

use std::io::Read;
use std::process::ExitCode;

/// Runtimes send a few hundred bytes; anything past this is not an OCI state.
const MAX_STATE_BYTES: u64 = 64 * 1024;

/// The fields of the OCI state this hook relies on; others (crun's `root`) are ignored.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    oci_version: String,
    id: String,
    #[serde(default)]
    pid: Option<i64>,
    bundle: String,
}

fn main() -> ExitCode {
    let verb = std::env::args().nth(1).unwrap_or_default();
    if !matches!(verb.as_str(), "prestart" | "poststop") {
        eprintln!("tessera-hook: usage: tessera-hook prestart|poststop (OCI state on stdin)");
        return ExitCode::from(2);
    }
    let mut raw = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_STATE_BYTES + 1)
        .read_to_end(&mut raw)
    {
        eprintln!("tessera-hook: reading OCI state from stdin: {e}");
        return ExitCode::FAILURE;
    }
    if raw.len() as u64 > MAX_STATE_BYTES {
        eprintln!("tessera-hook: OCI state on stdin is larger than {MAX_STATE_BYTES} bytes");
        return ExitCode::FAILURE;
    }
    match serde_json::from_slice::<State>(&raw) {
        Ok(state) if !state.id.is_empty() && !state.bundle.is_empty() => {
            let _ = (state.oci_version, state.pid);
            ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!("tessera-hook: OCI state: empty id or bundle");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tessera-hook: OCI state: {e}");
            ExitCode::FAILURE
        }
    }
}
