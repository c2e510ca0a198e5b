//! `tessera-hook`: the OCI hook named by every Tessera CDI spec, and the way
//! into containers for engines without CDI.
//!
//! - **Fast path**: a container that asks Tessera for nothing (no
//!   `tessera.io/alloc-id` annotation, no `tessera.io/alloc=` CDI annotation, no
//!   `TESSERA_ALLOC_ID` or live `NVIDIA_VISIBLE_DEVICES` in its env) costs one
//!   bounded read of the state and of `config.json`, and nothing else.
//! - **Binding**: a container whose allocation's transient spec the runtime
//!   applied gets a binding record under `<state_dir>/alloc/<id>/`.
//! - **Legacy injection**: where the runtime did not apply the spec, the hook
//!   applies its device nodes, device-cgroup rules and bind mounts itself,
//!   inside the container's mount namespace, every path resolved in the
//!   container root fd.
//!
//! The binary (`src/main.rs`) only clears the environment, parses argv and
//! maps errors to exit codes; everything else is here, so tests and the fuzz
//! targets in `fuzz/` reach the parsers. See `README.md` for the command line,
//! `hook.toml`, files, exit codes and the injection steps.

pub mod apply;
pub mod binding;
pub mod cgroup;
pub mod cli;
pub mod commands;
pub mod config;
pub mod container_fs;
pub mod decision;
pub mod elf;
pub mod error;
pub mod fsutil;
pub mod identity;
pub mod journal;
pub mod ldcache;
pub mod libraries;
pub mod log;
pub mod mounts;
pub mod ns;
pub mod oci;
pub mod plan;
pub mod procfs;
pub mod request;
pub mod rootfs;
pub mod specs;
pub mod state;
pub mod sys;
pub mod trust;

pub use commands::{Outcome, run};
pub use error::{HookError, exit};

#[cfg(test)]
pub(crate) mod testing;
