//! Fork handling and process identity: after `fork` the child gets a file
//! description of its own (so the parent's slot lock dies with the parent)
//! and registers anew before its first charge.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use super::layout;

/// Bumped in the child of every `fork` (pthread_atfork): a handle whose
/// registration generation differs registers anew before its next charge.
pub(super) static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Descriptors of the open regions, for the fork handler (-1: unused entry).
pub(super) static REGION_FDS: [AtomicI32; 8] = [const { AtomicI32::new(-1) }; 8];
/// Addresses of their mappings, entry for entry.
pub(super) static REGION_MAPS: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

extern "C" fn on_fork_child() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
    for (fd, map) in REGION_FDS.iter().zip(&REGION_MAPS) {
        let fd = fd.load(Ordering::Relaxed);
        if fd >= 0 {
            give_child_its_own_description(fd, map.load(Ordering::Relaxed));
        }
    }
}

/// Gives a forked child a file description of its own for the region: the
/// inherited descriptor `fd` and the inherited mapping at `map` both
/// reference the parent's open file description, and so keep the parent's
/// slot lock alive after the parent dies. The file is opened anew (through
/// `/proc/self/fd`), mapped over the old mapping at the same address (same
/// file, same contents: every pointer stays valid), and put under the same
/// descriptor number. Async-signal-safe system calls only, no allocation.
/// Without `/proc` the inherited descriptor is closed (the mapping stays,
/// and with it the parent's lock until the child exits or `exec`s).
pub(super) fn give_child_its_own_description(fd: i32, map: usize) {
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 10];
    let mut n = fd as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        path[14 + i] = digits[len - 1 - i];
    }
    // SAFETY: `path` is NUL-terminated (zero-filled past the digits, at most
    // 10 of 12 spare bytes used); open, mmap, dup3 and close are plain system
    // calls, valid in a forked child, and touch only this library's
    // descriptors and its own mapping (`map`, layout::SIZE bytes, replaced
    // in place by a mapping of the same file).
    unsafe {
        let fresh = libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY,
        );
        if fresh >= 0 {
            if map != 0 {
                libc::mmap(
                    map as *mut libc::c_void,
                    layout::SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fresh,
                    0,
                );
            }
            libc::dup3(fresh, fd, libc::O_CLOEXEC);
            libc::close(fresh);
        } else {
            libc::close(fd);
        }
    }
}

pub(super) fn install_fork_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured
        // state; it does only atomics and plain system calls (open, mmap,
        // dup3, close), valid in the single-threaded child. The library is never
        // unloaded (ld.so.preload), so the function outlives the registration.
        unsafe {
            libc::pthread_atfork(None, None, Some(on_fork_child));
        }
    });
}

pub(super) fn current_pid() -> u32 {
    std::process::id()
}

pub(super) fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Start time (field 22) from `/proc/self/stat`; 0 when unknown.
pub(super) fn own_start_time() -> u64 {
    std::fs::read("/proc/self/stat")
        .ok()
        .and_then(|text| tessera_model::proc::parse_stat(&text))
        .map_or(0, |stat| stat.start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_read() {
        assert!(own_start_time() > 0, "own /proc/self/stat");
    }
}
