//! A simulated GPU node.
//!
//! A node profile ([`profile`]) names GPU models, counts and MIG layouts; the
//! builder ([`builder`]) turns it into a root directory with real device nodes
//! (`dev/`), the driver's `/proc` files and a state file; the state file
//! ([`state`]) holds the GPUs and their MIG instances and is shared by every
//! process that plays a part of the node, in particular the NVML stand-in
//! (`tessera-sim-nvml`), which applies the simulated driver's rules from
//! [`mig`] to it.
//! [`health`] holds XID errors and lost GPUs, injected with `tessera-sim
//! inject-xid` and `tessera-sim lose-gpu`.
//! [`timeline`] reads the device timelines the CUDA stand-in
//! (`tessera-sim-cuda`) shares between processes: the device time each
//! process's kernels took, for judges that must not trust NVML's figure.
//!
//! The crate depends on `tessera-model` (for the MIG catalogue) and on nothing
//! of `tessera-driver`: a stand-in that shared code with what it stands in for
//! could hide that code's bugs.

pub mod builder;
pub mod caps;
mod catalogue;
pub mod clock;
pub mod devnode;
pub mod elf;
pub mod error;
pub mod health;
pub mod ids;
pub mod libroot;
pub mod mig;
pub mod profile;
pub mod report;
pub mod shm;
pub mod state;
pub mod timeline;

pub use error::SimError;

/// Driver version a node reports unless its profile says otherwise.
pub const DEFAULT_DRIVER_VERSION: &str = "570.133.20";
/// CUDA driver version (`cuDriverGetVersion` encoding) the node reports: 12.8.
pub const DEFAULT_CUDA_DRIVER_VERSION: i32 = 12080;
