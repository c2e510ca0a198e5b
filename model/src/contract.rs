//! The contract: every name, path and limit that more than one component (or a
//! user, or a peer's tooling) relies on, written once.
//!
//! This is the "Names and paths" table of the architecture document in code.
//! Components import from here and nowhere else; a value that two crates
//! spell on their own is a value that drifts. Where a name is Kubernetes- or
//! HAMi-facing (resource names, annotation keys, environment names), it is
//! the peer's spelling, because users already write it.

/// CDI: vendor, kinds, spec file names and the device names in them.
pub mod cdi {
    /// Tessera's CDI vendor.
    pub const VENDOR: &str = "tessera.io";
    /// The kind of the static per-node spec (whole GPUs and existing MIG devices).
    pub const GPU_KIND: &str = "tessera.io/gpu";
    /// The kind of the transient per-allocation specs.
    pub const ALLOC_KIND: &str = "tessera.io/alloc";
    /// The CDI spec directory runtimes read and Tessera writes to.
    pub const SPEC_DIR: &str = "/var/run/cdi";
    /// File name of the static per-node spec inside [`SPEC_DIR`].
    pub const STATIC_SPEC_FILE: &str = "tessera.io-gpu.json";
    /// Full path of the static per-node spec.
    pub const STATIC_SPEC_PATH: &str = "/var/run/cdi/tessera.io-gpu.json";
    /// The static spec's device naming every GPU at once.
    pub const ALL_DEVICES: &str = "all";
    /// Prefix of the CDI annotation keys (`cdi.k8s.io/<plugin>_<device-id>`).
    pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
    /// The plugin part of Tessera's CDI annotation keys (`cdi.k8s.io/tessera_<alloc-id>`).
    pub const ANNOTATION_PLUGIN: &str = "tessera";
    /// Longest annotation name after [`ANNOTATION_PREFIX`] (a Kubernetes name).
    pub const MAX_ANNOTATION_NAME_LEN: usize = 63;

    /// File name of an allocation's transient spec: `tessera.io-alloc_<id>.json`.
    /// The caller passes a validated id ([`crate::alloc::AllocId`]).
    pub fn transient_spec_file(alloc_id: &str) -> String {
        format!("{}_{alloc_id}.json", ALLOC_KIND.replace('/', "-"))
    }

    /// The static spec's name of MIG device `mig_index` on GPU `gpu_index`:
    /// `<gpu>:<mig>`, as `nvidia-smi -L` numbers them.
    pub fn mig_device_name(gpu_index: u32, mig_index: u32) -> String {
        format!("{gpu_index}:{mig_index}")
    }
}

/// The OCI hook.
pub mod hook {
    /// Installed location of the hook binary.
    pub const BINARY_PATH: &str = "/usr/bin/tessera-hook";
    /// The hook binary's file name (how a spec's hook entry is recognised).
    pub const BINARY_NAME: &str = "tessera-hook";
    /// The `PATH` every emitted hook entry gets; nothing leaks in from the container.
    pub const PATH_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
    /// The hook's configuration file.
    pub const CONFIG_PATH: &str = "/etc/tessera/hook.toml";
}

/// The vGPU interception library and its files.
pub mod vgpu {
    /// The library on the host.
    pub const HOST_LIBRARY: &str = "/usr/lib/tessera/libtessera_vgpu.so";
    /// The library's path inside a container.
    pub const CONTAINER_LIBRARY: &str = "/usr/local/tessera/libtessera_vgpu.so";
    /// The preload list inside a container (a read-only bind of a host file).
    pub const LD_SO_PRELOAD: &str = "/etc/ld.so.preload";
    /// The limits file inside a container (mounted read-only; authoritative).
    pub const CONTAINER_CONFIG_PATH: &str = "/usr/local/tessera/vgpu.json";
    /// The per-allocation accounting directory inside a container (read-write).
    pub const ACCOUNTING_DIR: &str = "/var/run/tessera";
    /// Name of the shared accounting file inside the accounting directory.
    pub const ACCOUNTING_FILE: &str = "vgpu.accounting";
    /// Most devices one container's limits (and its accounting region) name;
    /// HAMi-core's limit as well.
    pub const MAX_DEVICES: usize = 16;
}

/// Node-side state.
pub mod node {
    /// Node state: device plugin checkpoint, per-allocation directories.
    pub const STATE_DIR: &str = "/var/lib/tessera";
    /// The per-allocation directories under [`STATE_DIR`]: `alloc/<alloc-id>/`.
    pub const ALLOC_DIR: &str = "alloc";
    /// The hook's binding record inside an allocation's directory.
    pub const BINDING_FILE: &str = "binding.json";
    /// The accounting directory inside an allocation's directory (bound to
    /// [`super::vgpu::ACCOUNTING_DIR`] in the container).
    pub const ACCOUNTING_SUBDIR: &str = "accounting";
}

/// Environment variables Tessera reads or sets.
pub mod env {
    /// Set by a transient spec to the allocation's id.
    pub const ALLOC_ID: &str = "TESSERA_ALLOC_ID";
    /// NVIDIA's device selection variable, honoured by the hook where enabled.
    pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
    /// Log filter of Tessera's binaries (`tracing` env-filter syntax).
    pub const LOG: &str = "TESSERA_LOG";

    /// The HAMi-core names, read by the library only where the limits file
    /// is absent.
    pub mod hami {
        /// Memory limit of every device (bytes, or with a `k`/`m`/`g` suffix).
        pub const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
        /// Prefix of the per-device memory limit, `CUDA_DEVICE_MEMORY_LIMIT_<i>`.
        pub const MEMORY_LIMIT_PREFIX: &str = "CUDA_DEVICE_MEMORY_LIMIT_";
        /// SM share of every device, in percent.
        pub const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
        /// Prefix of the per-device SM share, `CUDA_DEVICE_SM_LIMIT_<i>`.
        pub const SM_LIMIT_PREFIX: &str = "CUDA_DEVICE_SM_LIMIT_";
        /// Path of the shared accounting file (a directory is accepted too).
        pub const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
        /// `true`/`1`: allocations that do not fit physically may use host memory.
        pub const OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
        /// HAMi-core's numeric log level, or a level name.
        pub const LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
    }
}

/// Annotation keys on pods, containers and nodes.
pub mod annotations {
    /// Container annotation naming the allocation, for engines without CDI.
    pub const ALLOC_ID: &str = "tessera.io/alloc-id";
    /// Pod (user): `share` or `mig` (`hami-core` is accepted as `share`).
    pub const VGPU_MODE: &str = "nvidia.com/vgpu-mode";
    /// Pod (user): GPU models to use.
    pub const USE_GPU_TYPE: &str = "nvidia.com/use-gputype";
    /// Pod (user): GPU models to avoid.
    pub const NOUSE_GPU_TYPE: &str = "nvidia.com/nouse-gputype";
    /// Pod (user): GPU uuids to use.
    pub const USE_GPU_UUID: &str = "nvidia.com/use-gpuuuid";
    /// Pod (user): GPU uuids to avoid.
    pub const NOUSE_GPU_UUID: &str = "nvidia.com/nouse-gpuuuid";
    /// Pod (user): `binpack` or `spread`, among a node's GPUs.
    pub const GPU_POLICY: &str = "tessera.io/gpu-policy";
    /// Pod (user): `binpack` or `spread`, among nodes.
    pub const NODE_POLICY: &str = "tessera.io/node-policy";
    /// Pod (system): the allocation, JSON.
    pub const ALLOCATION: &str = "tessera.io/allocation";
    /// Pod (system): `allocating`, `success` or `failed`.
    pub const BIND_PHASE: &str = "tessera.io/bind-phase";
    /// Pod (system): when the extender bound the pod (RFC 3339).
    pub const BIND_TIME: &str = "tessera.io/bind-time";

    /// The values of [`BIND_PHASE`].
    pub mod bind_phase {
        /// The extender bound the pod; the device plugin has not answered yet.
        pub const ALLOCATING: &str = "allocating";
        /// The device plugin realized every container's reservation.
        pub const SUCCESS: &str = "success";
        /// The device plugin could not realize the reservation.
        pub const FAILED: &str = "failed";
    }
    /// Node: the GPU inventory written by the device plugin (JSON).
    pub const NODE_GPUS: &str = "tessera.io/node-gpus";
    /// Node: the device plugin's last handshake (RFC 3339).
    pub const NODE_HANDSHAKE: &str = "tessera.io/node-handshake";
}

/// Extended resource names, as HAMi users already write them.
pub mod resources {
    /// GPU slices.
    pub const GPU: &str = "nvidia.com/gpu";
    /// GPU memory, MiB.
    pub const GPU_MEMORY: &str = "nvidia.com/gpumem";
    /// GPU memory, percent of the device.
    pub const GPU_MEMORY_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
    /// SM share, percent.
    pub const GPU_CORES: &str = "nvidia.com/gpucores";
}

/// Cluster coordination.
pub mod cluster {
    /// The namespace Tessera runs in unless configured otherwise.
    pub const DEFAULT_NAMESPACE: &str = "kube-system";
    /// Prefix of the per-node bind lock Lease (`tessera-bind.<node>`).
    pub const BIND_LEASE_PREFIX: &str = "tessera-bind.";
    /// How long a bind lock holds, seconds.
    pub const BIND_LEASE_SECONDS: u32 = 300;
    /// Default path of the cluster configuration file (extender and device plugin).
    pub const CONFIG_PATH: &str = "/etc/tessera/cluster.yaml";
    /// The extender's port: its verbs, `/metrics`, `/inspect`, `/healthz`, `/readyz`.
    pub const EXTENDER_METRICS_PORT: u16 = 31993;
    /// The device plugin's node-monitor metrics port.
    pub const PLUGIN_METRICS_PORT: u16 = 31992;
}

/// The kubelet device plugin API as Tessera's device plugin uses it.
pub mod kubelet {
    /// kubelet's directory on a node.
    pub const DIR: &str = "/var/lib/kubelet";
    /// The device plugin sockets' directory inside [`DIR`] (wiped by kubelet at start).
    pub const DEVICE_PLUGINS_SUBDIR: &str = "device-plugins";
    /// kubelet's Registration socket inside [`DEVICE_PLUGINS_SUBDIR`].
    pub const REGISTRATION_SOCKET: &str = "kubelet.sock";
    /// kubelet's PodResources directory inside [`DIR`].
    pub const POD_RESOURCES_SUBDIR: &str = "pod-resources";
    /// kubelet's PodResources socket inside [`POD_RESOURCES_SUBDIR`].
    pub const POD_RESOURCES_SOCKET: &str = "kubelet.sock";
    /// The device plugin's own socket inside [`DEVICE_PLUGINS_SUBDIR`].
    pub const PLUGIN_SOCKET: &str = "tessera-gpu.sock";
    /// The device plugin API version registered.
    pub const API_VERSION: &str = "v1beta1";
    /// A device's health as ListAndWatch reports it: healthy.
    pub const HEALTHY: &str = "Healthy";
    /// A device's health as ListAndWatch reports it: unhealthy.
    pub const UNHEALTHY: &str = "Unhealthy";
    /// The environment naming the node (the downward API's `spec.nodeName`).
    pub const NODE_NAME_ENV: &str = "NODE_NAME";
    /// XIDs that say nothing about the GPU itself (application errors), the
    /// list NVIDIA's device plugin skips: logged, the GPU stays healthy.
    pub const IGNORED_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];
    /// Overrides [`IGNORED_XIDS`]: a comma-separated list (empty: none ignored).
    pub const IGNORED_XIDS_ENV: &str = "TESSERA_IGNORED_XIDS";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_file_names_follow_the_kinds() {
        // The CDI rule: a spec's file name is its kind with `/` made `-`.
        assert_eq!(
            cdi::STATIC_SPEC_FILE,
            format!("{}.json", cdi::GPU_KIND.replace('/', "-"))
        );
        assert_eq!(
            cdi::STATIC_SPEC_PATH,
            format!("{}/{}", cdi::SPEC_DIR, cdi::STATIC_SPEC_FILE)
        );
        assert_eq!(
            cdi::transient_spec_file("abc-0"),
            "tessera.io-alloc_abc-0.json"
        );
    }

    #[test]
    fn kinds_share_the_vendor() {
        for kind in [cdi::GPU_KIND, cdi::ALLOC_KIND] {
            assert_eq!(kind.split_once('/').map(|(v, _)| v), Some(cdi::VENDOR));
        }
    }

    #[test]
    fn the_hook_path_ends_in_its_name() {
        assert!(hook::BINARY_PATH.ends_with(&format!("/{}", hook::BINARY_NAME)));
    }

    #[test]
    fn mig_devices_are_gpu_colon_index() {
        assert_eq!(cdi::mig_device_name(1, 3), "1:3");
    }
}
