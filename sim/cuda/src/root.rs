//! Which simulated node this library serves, if any.
//!
//! 1. `TESSERA_SIM_ROOT`, when set and not empty, names the node root; its
//!    state file must exist (a named node that cannot be read is an error,
//!    reported by `cuInit`).
//! 2. Otherwise the root follows from where the library itself was loaded
//!    from (`dladdr` on a function of ours): the node builder installs it as
//!    `<root>/usr/lib/x86_64-linux-gnu/libcuda.so.1`. A root found this way
//!    counts only if it holds a node state file: a stand-in copied anywhere
//!    else (into `/usr/lib/x86_64-linux-gnu` of a container, say) serves the
//!    default one-GPU configuration.
//!
//! The same rules as the NVML stand-in's, written again here: each stand-in
//! is its own shared object and neither links the other.

use std::ffi::{CStr, OsStr, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Environment variable naming the node root explicitly.
pub const ROOT_ENV: &str = "TESSERA_SIM_ROOT";

/// Library directories, relative to a root, that the library may be
/// installed in; longest first, so `<root>/usr/lib/x86_64-linux-gnu` is not
/// read as `<root>/usr` + `lib/x86_64-linux-gnu`.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "lib/x86_64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
    "lib",
];

/// Where the node root came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootSource {
    /// `TESSERA_SIM_ROOT`.
    Env(PathBuf),
    /// The library's own path.
    LibraryPath(PathBuf),
    /// Neither: the default configuration.
    None,
}

/// The node root candidate: `TESSERA_SIM_ROOT`, or the root the library
/// was installed under (whether or not it holds a node).
pub fn discover() -> RootSource {
    if let Some(root) = std::env::var_os(ROOT_ENV).filter(|v| !v.is_empty()) {
        return RootSource::Env(absolute(PathBuf::from(root)));
    }
    let Some(lib) = own_library_path() else {
        return RootSource::None;
    };
    let lib = absolute(lib);
    if let Some(root) = root_of_library(&lib) {
        return RootSource::LibraryPath(root);
    }
    match std::fs::canonicalize(&lib)
        .ok()
        .and_then(|real| root_of_library(&real))
    {
        Some(root) => RootSource::LibraryPath(root),
        None => RootSource::None,
    }
}

/// The root a library at `lib` belongs to: `lib`'s directory with one of
/// [`LIBRARY_DIRS`] taken off its end.
pub fn root_of_library(lib: &Path) -> Option<PathBuf> {
    let dir = lib.parent()?;
    LIBRARY_DIRS.iter().find_map(|suffix| {
        let mut root = dir.to_path_buf();
        for component in Path::new(suffix).components().rev() {
            if root.file_name()? != component.as_os_str() {
                return None;
            }
            root.pop();
        }
        Some(if root.as_os_str().is_empty() {
            PathBuf::from("/")
        } else {
            root
        })
    })
}

fn absolute(path: PathBuf) -> PathBuf {
    if path.is_absolute() {
        return path;
    }
    match std::env::current_dir() {
        Ok(cwd) => cwd.join(path),
        Err(_) => path,
    }
}

/// A function whose address lies inside this shared object; private, so no
/// symbol of the same name elsewhere can stand in for it.
#[inline(never)]
fn anchor() {}

/// The path the dynamic loader loaded this library from.
pub fn own_library_path() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let address = anchor as fn() as *const c_void;
    // SAFETY: dladdr only looks the address up in the loader's tables and
    // fills `info`, a valid, exclusively borrowed Dl_info.
    let found = unsafe { libc::dladdr(address, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is non-null and points to the loader's NUL-terminated
    // copy of the object's path, which lives as long as the object is loaded;
    // the object is this library, which is running this code. It is copied
    // out at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let name = OsStr::from_bytes(name.to_bytes());
    (!name.is_empty()).then(|| PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_library_paths_give_their_root() {
        let root = |lib: &str| root_of_library(Path::new(lib));
        assert_eq!(
            root("/tmp/node/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            Some(PathBuf::from("/tmp/node"))
        );
        assert_eq!(root("/n/usr/lib64/libcuda.so.1"), Some(PathBuf::from("/n")));
        assert_eq!(
            root("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            Some(PathBuf::from("/"))
        );
        assert_eq!(root("/work/main/target/debug/libtessera_sim_cuda.so"), None);
    }
}
