//! Lays out a simulated node under a root directory.
//!
//! ```text
//! <root>/
//!   dev/nvidia<minor>                 c 195:<minor>   0666   one per GPU
//!   dev/nvidiactl                     c 195:255       0666
//!   dev/nvidia-uvm                    c <uvm>:0       0666
//!   dev/nvidia-uvm-tools              c <uvm>:1       0666
//!   dev/nvidia-caps/nvidia-cap1       c <caps>:1      0400   mig config
//!   dev/nvidia-caps/nvidia-cap2       c <caps>:2      0444   mig monitor
//!   dev/nvidia-caps/nvidia-cap<m>     c <caps>:<m>    0444   GI and CI access of each pre-created instance
//!   proc/devices                      majors: 195 nvidia-frontend, 195 nvidia, <caps> nvidia-caps, <uvm> nvidia-uvm
//!   proc/driver/nvidia/version        NVRM version line
//!   proc/driver/nvidia-caps/mig-minors  the full static table (see crate::caps)
//!   usr/bin/{nvidia-smi, nvidia-debugdump, nvidia-persistenced}   stand-in scripts
//!   usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<ver>   the NVML stand-in (tessera-sim-nvml)
//!   usr/lib/x86_64-linux-gnu/libcuda.so.<ver>        the CUDA driver stand-in (tessera-sim-cuda)
//!   usr/lib/x86_64-linux-gnu/lib<name>.so.<ver>      every other driver library of
//!                                                    [`DRIVER_LIBRARIES`]: a minimal ELF
//!                                                    shared object (crate::elf) with its SONAME
//!   usr/lib/x86_64-linux-gnu/<soname> -> lib<name>.so.<ver>   the SONAME link, where the
//!                                                    SONAME is not the versioned name itself
//!   run/tessera-sim/state.json, state.lock       the GI/CI state (crate::state)
//!   run/tessera-sim/util/                        1777: GPU processes' utilization files
//!                                                (written by the CUDA stand-in, read by NVML)
//! ```
//!
//! `<ver>` is the profile's driver version. The library files are laid out
//! as a driver install lays them out: the versioned file, named
//! `lib<name>.so.<ver>`, carries the SONAME, and `ldconfig` (or the
//! installer) makes the SONAME link next to it; libraries whose SONAME is the
//! versioned name (`libnvidia-glcore.so.<ver>`, …) get no link.
//!
//! Both stand-in libraries are copies of the cdylibs cargo builds
//! (`libtessera_sim_nvml.so`, `libtessera_sim_cuda.so`), taken from
//! [`BuildOptions`] or found next to the running executable; a build
//! without them fails, naming the missing file and the cargo command that
//! makes it.
//!
//! `<caps>` and `<uvm>` are dynamic majors on a real host; here they default
//! to 508 and 511 (values seen on real hosts) and can be set in
//! [`BuildOptions`].

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::SimError;
use crate::caps;
use crate::devnode::{self, CAP_ACCESS_MODE, CAP_CONFIG_MODE, GPU_NODE_MODE};
use crate::elf;
use crate::profile::NodeProfile;
use crate::state::{NodeState, StateStore};

/// Major of `/dev/nvidia*`.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Default major of `nvidia-caps`.
pub const DEFAULT_CAPS_MAJOR: u32 = 508;
/// Default major of `nvidia-uvm`.
pub const DEFAULT_UVM_MAJOR: u32 = 511;
/// File name of the NVML stand-in as cargo builds it.
pub const NVML_STANDIN_FILE: &str = "libtessera_sim_nvml.so";
/// File name of the CUDA driver stand-in as cargo builds it.
pub const CUDA_STANDIN_FILE: &str = "libtessera_sim_cuda.so";
/// Directory, relative to the root, of the utilization files GPU processes publish.
pub const UTIL_DIR: &str = "run/tessera-sim/util";
/// Library directory under the root.
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

pub use tessera_model::driver_files::{DRIVER_LIBRARIES, DriverLibrary, Soname};

/// The driver's command-line tools a node has, under `usr/bin`.
pub const DRIVER_BINARIES: &[&str] = &["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"];

/// How to build a node.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The NVML stand-in to install; `None`: `libtessera_sim_nvml.so` next to
    /// the current executable (or one directory up when the executable sits in
    /// cargo's `deps/`, as test binaries do).
    pub nvml_library: Option<PathBuf>,
    /// The CUDA driver stand-in to install as `libcuda.so.1`; `None`:
    /// `libtessera_sim_cuda.so` next to the current executable (or one
    /// directory up from cargo's `deps/`).
    pub cuda_library: Option<PathBuf>,
    /// Replace the tessera-sim parts of a non-empty root.
    pub force: bool,
    /// Major of `nvidia-caps` in `proc/devices` and of the cap nodes.
    pub caps_major: u32,
    /// Major of `nvidia-uvm`.
    pub uvm_major: u32,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            nvml_library: None,
            cuda_library: None,
            force: false,
            caps_major: DEFAULT_CAPS_MAJOR,
            uvm_major: DEFAULT_UVM_MAJOR,
        }
    }
}

/// What [`build_node`] made.
#[derive(Debug, Clone)]
pub struct BuiltNode {
    /// The node root.
    pub root: PathBuf,
    /// The initial state written to the state file.
    pub state: NodeState,
    /// Every device node made, in creation order.
    pub device_nodes: Vec<PathBuf>,
    /// Where the NVML stand-in was installed.
    pub nvml_library: PathBuf,
    /// Where the CUDA driver stand-in was installed.
    pub cuda_library: PathBuf,
}

/// Builds the node described by `profile` under `root`.
///
/// Refuses a non-empty root unless `opts.force`; then removes only what a
/// build makes (the paths listed in the module docs) before making them anew.
/// Refuses `/` in any case.
pub fn build_node(
    profile: &NodeProfile,
    root: &Path,
    opts: &BuildOptions,
) -> Result<BuiltNode, SimError> {
    let state = profile.node_state(&profile.name)?;
    let nvml_source = resolve_nvml_library(opts)?;
    let cuda_source = resolve_cuda_library(opts)?;
    let was_empty = prepare_root(root, opts.force)?;
    let sources = Sources {
        nvml: &nvml_source,
        cuda: &cuda_source,
    };
    match lay_out(root, opts, &state, &sources) {
        Ok((device_nodes, nvml_library, cuda_library)) => Ok(BuiltNode {
            root: root.to_path_buf(),
            state,
            device_nodes,
            nvml_library,
            cuda_library,
        }),
        Err(e) => {
            // Leave an empty root as it was found, so a second try needs no --force.
            if was_empty {
                let _ = clear_dir(root);
            }
            Err(e)
        }
    }
}

/// The stand-in libraries to install.
struct Sources<'a> {
    nvml: &'a Path,
    cuda: &'a Path,
}

/// Makes every file of the node; returns the device nodes made and the
/// installed NVML and CUDA libraries.
fn lay_out(
    root: &Path,
    opts: &BuildOptions,
    state: &NodeState,
    sources: &Sources<'_>,
) -> Result<(Vec<PathBuf>, PathBuf, PathBuf), SimError> {
    let mut device_nodes = Vec::new();
    let mut node = |path: PathBuf, major: u32, minor: u32, mode: u32| -> Result<(), SimError> {
        devnode::make_char_node(&path, major, minor, mode)?;
        device_nodes.push(path);
        Ok(())
    };
    mkdir(&root.join("dev/nvidia-caps"))?;
    for gpu in &state.gpus {
        node(
            root.join(format!("dev/nvidia{}", gpu.minor)),
            NVIDIA_MAJOR,
            gpu.minor,
            GPU_NODE_MODE,
        )?;
    }
    node(
        root.join("dev/nvidiactl"),
        NVIDIA_MAJOR,
        NVIDIACTL_MINOR,
        GPU_NODE_MODE,
    )?;
    node(
        root.join("dev/nvidia-uvm"),
        opts.uvm_major,
        0,
        GPU_NODE_MODE,
    )?;
    node(
        root.join("dev/nvidia-uvm-tools"),
        opts.uvm_major,
        1,
        GPU_NODE_MODE,
    )?;
    let mut cap_node = |minor: u32, mode: u32| {
        node(
            caps::cap_node_path(root, minor),
            opts.caps_major,
            minor,
            mode,
        )
    };
    cap_node(caps::CONFIG_MINOR, CAP_CONFIG_MODE)?;
    cap_node(caps::MONITOR_MINOR, CAP_ACCESS_MODE)?;
    for gpu in &state.gpus {
        for gi in &gpu.gpu_instances {
            let minor = caps::gi_access_minor(gpu.minor, gi.id)
                .ok_or_else(|| table_error(root, gpu.minor, gi.id, None))?;
            cap_node(minor, CAP_ACCESS_MODE)?;
            for ci in &gi.compute_instances {
                let minor = caps::ci_access_minor(gpu.minor, gi.id, ci.id)
                    .ok_or_else(|| table_error(root, gpu.minor, gi.id, Some(ci.id)))?;
                cap_node(minor, CAP_ACCESS_MODE)?;
            }
        }
    }

    write(
        &root.join("proc/devices"),
        &proc_devices(opts.caps_major, opts.uvm_major),
        0o444,
    )?;
    write(
        &root.join("proc/driver/nvidia/version"),
        &nvrm_version(&state.driver_version),
        0o444,
    )?;
    write(
        &root.join("proc/driver/nvidia-caps/mig-minors"),
        &caps::mig_minors_table(),
        0o444,
    )?;

    let lib_dir = root.join(LIB_DIR);
    mkdir(&lib_dir)?;
    let version = &state.driver_version;
    let mut nvml_library = PathBuf::new();
    let mut cuda_library = PathBuf::new();
    for library in DRIVER_LIBRARIES {
        let file = lib_dir.join(library.file_name(version));
        let soname = library.soname(version);
        match library.name {
            "libnvidia-ml" => {
                install(sources.nvml, &file, "NVML")?;
                nvml_library = lib_dir.join(&soname);
            }
            "libcuda" => {
                install(sources.cuda, &file, "CUDA driver")?;
                cuda_library = lib_dir.join(&soname);
            }
            _ => write_bytes(
                &file,
                &elf::shared_object(
                    &soname,
                    &format!(
                        "tessera-sim placeholder for the NVIDIA {} {version}",
                        library.what
                    ),
                ),
                0o755,
            )?,
        }
        if library.soname != Soname::Versioned {
            let link = lib_dir.join(&soname);
            std::os::unix::fs::symlink(library.file_name(version), &link)
                .map_err(|e| SimError::io(&link, e))?;
        }
    }
    for tool in DRIVER_BINARIES {
        write(
            &root.join("usr/bin").join(tool),
            &tool_script(tool, state),
            0o755,
        )?;
    }

    StateStore::write_new(root, state)?;
    let util = root.join(UTIL_DIR);
    mkdir(&util)?;
    // Any user's CUDA process may publish its utilization here (sticky, like /tmp).
    fs::set_permissions(&util, fs::Permissions::from_mode(0o1777))
        .map_err(|e| SimError::io(&util, e))?;
    Ok((device_nodes, nvml_library, cuda_library))
}

/// Copies a stand-in library to `target`, mode 0755.
fn install(source: &Path, target: &Path, what: &str) -> Result<PathBuf, SimError> {
    fs::copy(source, target).map_err(|e| SimError::Build {
        path: source.to_path_buf(),
        reason: format!(
            "cannot copy the {what} stand-in to {}: {e}",
            target.display()
        ),
    })?;
    fs::set_permissions(target, fs::Permissions::from_mode(0o755))
        .map_err(|e| SimError::io(target, e))?;
    Ok(target.to_path_buf())
}

fn clear_dir(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if fs::symlink_metadata(&path)?.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

fn table_error(root: &Path, gpu_minor: u32, gi: u32, ci: Option<u32>) -> SimError {
    SimError::Build {
        path: root.to_path_buf(),
        reason: format!(
            "gpu{gpu_minor}/gi{gi}{} has no minor in the mig-minors table",
            ci.map(|c| format!("/ci{c}")).unwrap_or_default()
        ),
    }
}

/// The NVML stand-in to install, by [`BuildOptions::nvml_library`] or next to
/// the current executable.
pub fn resolve_nvml_library(opts: &BuildOptions) -> Result<PathBuf, SimError> {
    resolve_library(
        opts.nvml_library.as_deref(),
        NVML_STANDIN_FILE,
        "NVML",
        "tessera-sim-nvml",
        "--nvml-lib",
    )
}

/// The CUDA driver stand-in to install, by [`BuildOptions::cuda_library`]
/// or next to the current executable.
pub fn resolve_cuda_library(opts: &BuildOptions) -> Result<PathBuf, SimError> {
    resolve_library(
        opts.cuda_library.as_deref(),
        CUDA_STANDIN_FILE,
        "CUDA driver",
        "tessera-sim-cuda",
        "--cuda-lib",
    )
}

/// A stand-in library: `explicit` if given (it must exist), else `file`
/// next to the current executable, or one directory up when the executable
/// sits in cargo's `deps/` (test binaries do).
fn resolve_library(
    explicit: Option<&Path>,
    file: &str,
    what: &str,
    package: &str,
    flag: &str,
) -> Result<PathBuf, SimError> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(SimError::Build {
                path: p.to_path_buf(),
                reason: format!(
                    "{what} stand-in library not found (build it with `cargo build -p {package}`)"
                ),
            })
        };
    }
    let exe = std::env::current_exe().map_err(|e| SimError::io("/proc/self/exe", e))?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut candidates = vec![dir.join(file)];
    if dir.file_name().is_some_and(|n| n == "deps")
        && let Some(up) = dir.parent()
    {
        candidates.push(up.join(file));
    }
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| SimError::Build {
        path: candidates[0].clone(),
        reason: format!(
            "{what} stand-in library not found next to the executable; build it with `cargo build -p {package}` or pass {flag} PATH"
        ),
    })
}

/// Paths under the root that a build owns (removed by `--force`).
const OWNED: &[&str] = &[
    "dev/nvidiactl",
    "dev/nvidia-uvm",
    "dev/nvidia-uvm-tools",
    "dev/nvidia-caps",
    "proc/devices",
    "proc/driver/nvidia/version",
    "proc/driver/nvidia-caps",
    "run/tessera-sim",
];

/// Whether a file in the library directory is one a build makes: a driver
/// library's versioned file or SONAME link, of any driver version.
fn is_owned_library(file_name: &str) -> bool {
    DRIVER_LIBRARIES.iter().any(|library| {
        file_name
            .strip_prefix(library.name)
            .and_then(|rest| rest.strip_prefix(".so."))
            .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
    })
}

/// Checks and clears the root; returns whether it was absent or empty.
fn prepare_root(root: &Path, force: bool) -> Result<bool, SimError> {
    if root.as_os_str().is_empty() {
        return Err(SimError::Build {
            path: root.to_path_buf(),
            reason: "the root must not be empty".into(),
        });
    }
    match fs::canonicalize(root) {
        Ok(c) if c == Path::new("/") => {
            return Err(SimError::Build {
                path: root.to_path_buf(),
                reason: "refusing to build a simulated node over the real root /".into(),
            });
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(SimError::io(root, e)),
    }
    let non_empty = match fs::read_dir(root) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(SimError::io(root, e)),
    };
    if non_empty {
        if !force {
            return Err(SimError::Build {
                path: root.to_path_buf(),
                reason: "root is not empty; pass --force to replace the tessera-sim parts".into(),
            });
        }
        for rel in OWNED {
            remove(&root.join(rel))?;
        }
        for tool in DRIVER_BINARIES {
            remove(&root.join("usr/bin").join(tool))?;
        }
        if let Ok(entries) = fs::read_dir(root.join(LIB_DIR)) {
            for entry in entries.flatten() {
                if is_owned_library(&entry.file_name().to_string_lossy()) {
                    remove(&entry.path())?;
                }
            }
        }
        let dev = root.join("dev");
        if let Ok(entries) = fs::read_dir(&dev) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name
                    .strip_prefix("nvidia")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                {
                    remove(&entry.path())?;
                }
            }
        }
    }
    mkdir(root)?;
    Ok(!non_empty)
}

fn remove(path: &Path) -> Result<(), SimError> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| SimError::io(path, e))
}

fn mkdir(path: &Path) -> Result<(), SimError> {
    fs::create_dir_all(path).map_err(|e| SimError::io(path, e))
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), SimError> {
    write_bytes(path, text.as_bytes(), mode)
}

fn write_bytes(path: &Path, bytes: &[u8], mode: u32) -> Result<(), SimError> {
    if let Some(dir) = path.parent() {
        mkdir(dir)?;
    }
    fs::write(path, bytes).map_err(|e| SimError::io(path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| SimError::io(path, e))
}

/// The stand-in script of a driver tool. `nvidia-smi` answers `-L` with the
/// node's GPUs as they were built (`GPU <index>: <product> (UUID: GPU-…)`)
/// and prints the driver version otherwise; the others say what they stand
/// in for and succeed.
fn tool_script(tool: &str, state: &NodeState) -> String {
    let version = &state.driver_version;
    let mut script = format!("#!/bin/sh\n# tessera-sim stand-in for {tool} (driver {version})\n");
    if tool == "nvidia-smi" {
        script.push_str("if [ \"$1\" = \"-L\" ] || [ \"$1\" = \"--list-gpus\" ]; then\n");
        for gpu in &state.gpus {
            let product =
                crate::catalogue::find(&gpu.model).map_or(gpu.model.as_str(), |m| m.product_name);
            script.push_str(&format!(
                "  echo 'GPU {}: {product} (UUID: {})'\n",
                gpu.index, gpu.uuid
            ));
        }
        script.push_str("  exit 0\nfi\n");
        script.push_str(&format!(
            "echo 'NVIDIA-SMI {version} (tessera-sim): {} GPU(s)'\n",
            state.gpus.len()
        ));
    } else {
        script.push_str(&format!("echo '{tool} {version} (tessera-sim stand-in)'\n"));
    }
    script
}

/// `/proc/devices` as a host with the NVIDIA driver shows it: majors right
/// aligned in three columns, character devices then block devices, sorted by
/// major, one name per line (a major may repeat: `195 nvidia-frontend` and
/// `195 nvidia`).
pub fn proc_devices(caps_major: u32, uvm_major: u32) -> String {
    let mut chr: Vec<(u32, &str)> = vec![
        (1, "mem"),
        (4, "/dev/vc/0"),
        (4, "tty"),
        (4, "ttyS"),
        (5, "/dev/tty"),
        (5, "/dev/console"),
        (5, "/dev/ptmx"),
        (7, "vcs"),
        (10, "misc"),
        (13, "input"),
        (29, "fb"),
        (128, "ptm"),
        (136, "pts"),
        (180, "usb"),
        (189, "usb_device"),
        (NVIDIA_MAJOR, "nvidia-frontend"),
        (NVIDIA_MAJOR, "nvidia"),
        (226, "drm"),
        (caps_major, "nvidia-caps"),
        (uvm_major, "nvidia-uvm"),
    ];
    chr.sort_by_key(|(m, _)| *m);
    let block: &[(u32, &str)] = &[
        (7, "loop"),
        (8, "sd"),
        (9, "md"),
        (11, "sr"),
        (253, "device-mapper"),
        (259, "blkext"),
    ];
    let mut out = String::from("Character devices:\n");
    for (m, name) in chr {
        out.push_str(&format!("{m:>3} {name}\n"));
    }
    out.push_str("\nBlock devices:\n");
    for (m, name) in block {
        out.push_str(&format!("{m:>3} {name}\n"));
    }
    out
}

fn nvrm_version(driver_version: &str) -> String {
    format!(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  (tessera-sim)\nGCC version:  simulated\n"
    )
}
