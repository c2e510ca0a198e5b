//! What the driver's simulated-node tests share: a node of a shipped
//! profile (or a skip by the one prerequisite rule) and the NVML stand-in
//! loaded from it.

use std::path::Path;

use tessera_driver::devices::find_nvml_library;
use tessera_driver::nvml::NvmlDriver;

/// A node of shipped profile `$profile` (`tessera-test-support`'s builder),
/// or a skip by the one prerequisite rule. The stand-in is loaded in this
/// process, so a `TESSERA_SIM_ROOT` in its environment would serve another
/// node.
macro_rules! node_or_skip {
    ($profile:literal) => {{
        let unset = std::env::var_os("TESSERA_SIM_ROOT").is_none_or(|v| v.is_empty());
        let Ok(()) = ::tessera_test_support::require(&[
            ::tessera_test_support::Need::condition(
                unset,
                "TESSERA_SIM_ROOT unset (the stand-in would serve that node instead)",
                "unset TESSERA_SIM_ROOT",
            ),
            ::tessera_test_support::Need::Built("tessera-sim"),
        ]) else {
            return;
        };
        let Ok(node) = ::tessera_test_support::node::SimNode::profile($profile).build() else {
            return;
        };
        node
    }};
}

/// The demo node (profile `demo`), or a skip, as [`node_or_skip`].
macro_rules! demo_node_or_skip {
    () => {
        node_or_skip!("demo")
    };
}

/// The NVML stand-in the node at `root` installs, loaded as the real
/// library is.
pub fn load(root: &Path) -> NvmlDriver {
    let lib = find_nvml_library(root).expect("the sim node has libnvidia-ml.so.1");
    assert_eq!(lib, root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"));
    NvmlDriver::load(&lib).expect("load the NVML stand-in")
}
