//! Publishing this process's utilization for the NVML stand-in.
//!
//! Only when a node is served. On the first successful `cuInit` the library
//! pins itself in memory (`RTLD_NODELETE`: a thread and an exit hook must
//! not outlive its code), removes the files of dead processes, and starts
//! a thread that every [`PERIOD_NS`] writes one sample per physical GPU this
//! process has a context on (see [`crate::utilfile`]). Synchronisation
//! calls and process exit add a sample. The launch path writes nothing: the
//! thread reads the devices' timelines and memory counters.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Mutex, Once, PoisonError};
use std::time::Duration;

use tessera_model::proc;

use crate::clock;
use crate::driver::{self, Driver};
use crate::root;
use crate::utilfile::{self, PERIOD_NS, Sample, UTIL_DIR, UtilFile};

struct Publisher {
    dir: PathBuf,
    /// The pid the files are named and stamped with: the host's, as the
    /// real driver reports processes to NVML (see [`host_pid`]).
    pid: u32,
    /// `getpid()` of the process that made the files (a forked child does
    /// not write them).
    own_pid: u32,
    start_time: u64,
    files: HashMap<u32, UtilFile>,
    last_busy: HashMap<u32, u64>,
    failed: bool,
}

/// One physical GPU's use by this process, summed over its CUDA devices.
struct GpuUse {
    busy: u64,
    mem: u64,
    /// The MIG device in use, if all the process's devices on the GPU are that one.
    instance: Option<(u32, u32)>,
}

static PUBLISHER: Mutex<Option<Publisher>> = Mutex::new(None);
static STARTED: Once = Once::new();
/// Set once publishing has started: synchronisation calls skip the lock otherwise.
static PUBLISHING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Starts publishing for `driver`'s node, once per process.
pub fn start(driver: &'static Driver) {
    let Some(root) = driver.config.node_root.clone() else {
        return;
    };
    STARTED.call_once(|| {
        if !pin_library() {
            if driver.config.debug {
                eprintln!(
                    "tessera-sim-cuda: cannot pin the library in memory; not publishing utilization"
                );
            }
            return;
        }
        let dir = root.join(UTIL_DIR);
        if std::fs::create_dir_all(&dir).is_ok() {
            use std::os::unix::fs::PermissionsExt;
            // Any user's process may publish; the builder makes it so too.
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
        }
        utilfile::remove_stale(&dir);
        *lock() = Some(Publisher {
            dir,
            pid: host_pid(),
            own_pid: std::process::id(),
            start_time: utilfile::own_start_time(),
            files: HashMap::new(),
            last_busy: HashMap::new(),
            failed: false,
        });
        PUBLISHING.store(true, std::sync::atomic::Ordering::Release);
        // SAFETY: registers a function of this library, which pin_library
        // made non-unloadable, to run at exit.
        unsafe { libc::atexit(at_exit) };
        let spawned = std::thread::Builder::new()
            .name("tessera-sim-cuda-util".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_nanos(PERIOD_NS));
                    publish_now();
                }
            });
        if let Err(e) = spawned {
            eprintln!("tessera-sim-cuda: cannot start the utilization thread: {e}");
        }
    });
}

/// This process's pid in the outermost pid namespace its `/proc` shows (the
/// first `NSpid:` field of `/proc/self/status`): the real driver reports a
/// containerized process to NVML by its host pid, not by the pid it sees.
/// Where `/proc` belongs to the process's own namespace, that is all it
/// can know: its own pid.
pub(crate) fn host_pid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        // The kernel's format, parsed as every component parses it (model::proc).
        .and_then(|status| proc::parse_nspid(&status))
        .and_then(|pids| pids.first().copied())
        .unwrap_or_else(std::process::id)
}

fn lock() -> std::sync::MutexGuard<'static, Option<Publisher>> {
    PUBLISHER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes this shared object non-unloadable. `false` when the loader does
/// not know it (linked statically into a program: then nothing can unload
/// it either, and that is fine).
fn pin_library() -> bool {
    let Some(path) = root::own_library_path() else {
        return true;
    };
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD only looks up an already loaded object (this
    // one) and adds a reference and the NODELETE flag; it runs no code.
    let handle = unsafe {
        libc::dlopen(
            path.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        )
    };
    !handle.is_null()
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(publish_now);
}

/// Writes one sample per active physical GPU now (no-op without a node).
pub fn publish_now() {
    if !PUBLISHING.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    let Some(driver) = driver::get_if_ready() else {
        return;
    };
    let mut guard = lock();
    let Some(publisher) = guard.as_mut() else {
        return;
    };
    // A child of fork() shares the mappings: only the process that made
    // them writes.
    if publisher.own_pid != std::process::id() || publisher.failed {
        return;
    }
    publisher.tick(driver);
}

impl Publisher {
    fn tick(&mut self, driver: &Driver) {
        let mono_ns = clock::monotonic_ns();
        let real_us = clock::realtime_us();
        let mut gpus: HashMap<u32, GpuUse> = HashMap::new();
        for device in driver.devices.iter() {
            if device.contexts.load(std::sync::atomic::Ordering::Acquire) == 0 {
                continue;
            }
            let entry = gpus.entry(device.spec.nvml_index).or_insert(GpuUse {
                busy: 0,
                mem: 0,
                instance: device.spec.mig,
            });
            entry.busy = entry.busy.saturating_add(device.timeline.busy_ns(mono_ns));
            entry.mem = entry
                .mem
                .saturating_add(device.used.load(std::sync::atomic::Ordering::Acquire));
            if entry.instance != device.spec.mig {
                entry.instance = None;
            }
        }
        // A GPU this process no longer has a context on: it is no GPU
        // process there any more.
        let gone: Vec<u32> = self
            .files
            .keys()
            .filter(|g| !gpus.contains_key(g))
            .copied()
            .collect();
        for gpu in gone {
            self.files.remove(&gpu);
            self.last_busy.remove(&gpu);
            let _ = std::fs::remove_file(self.dir.join(utilfile::file_name(gpu, self.pid)));
        }
        for (
            gpu,
            GpuUse {
                busy,
                mem,
                instance,
            },
        ) in gpus
        {
            let busy = {
                let last = self.last_busy.entry(gpu).or_insert(0);
                *last = (*last).max(busy);
                *last
            };
            if !self.files.contains_key(&gpu) {
                let path = self.dir.join(utilfile::file_name(gpu, self.pid));
                match UtilFile::create(&path, gpu, self.pid, self.start_time) {
                    Ok(mut file) => {
                        // Watchers of memory read single changes, not 5 ms summaries.
                        file.set_every_sample(driver.config.publish_on_memory);
                        self.files.insert(gpu, file);
                    }
                    Err(e) => {
                        eprintln!(
                            "tessera-sim-cuda: cannot publish utilization to {}: {e}",
                            path.display()
                        );
                        self.failed = true;
                        return;
                    }
                }
            }
            if let Some(file) = self.files.get_mut(&gpu) {
                file.set_instance(instance);
                file.record(Sample {
                    mono_ns,
                    real_us,
                    busy_ns: busy,
                    mem_bytes: mem,
                });
            }
        }
    }
}
