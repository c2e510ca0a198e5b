//! Which simulated node this library serves, if any: `tessera_sim::libroot`'s
//! rule (`TESSERA_SIM_ROOT`, else the directory this library was installed
//! in). Unlike NVML, a root found from the install path counts only if it
//! holds a node state file: a stand-in copied anywhere else (into
//! `/usr/lib/x86_64-linux-gnu` of a container, say) serves the default one-GPU
//! configuration; a root named by `TESSERA_SIM_ROOT` that cannot be read is an
//! error, reported by `cuInit`.

pub use tessera_sim::libroot::{ROOT_ENV, RootSource, discover, own_library_path};
