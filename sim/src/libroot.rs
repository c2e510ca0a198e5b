//! Which simulated node a stand-in driver library serves: the rule shared by
//! the NVML and CUDA stand-ins (each links this crate into its own shared
//! object, so [`own_library_path`] names whichever of them calls it).
//!
//! 1. `TESSERA_SIM_ROOT`, when set and not empty, names the node root.
//! 2. Otherwise the root follows from where the library itself was loaded
//!    from (`dladdr` on a function of ours): the node builder installs the
//!    stand-ins as `<root>/usr/lib/x86_64-linux-gnu/lib….so.1`, so a program
//!    that loads them from a simulated root sees that root exactly as a
//!    program on a real host sees `/`. The library directories recognised are
//!    [`LIBRARY_DIRS`]; the file name does not matter. The path is tried as
//!    the loader reports it and, failing that, with symlinks resolved.

use std::ffi::{CStr, OsStr, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Environment variable naming the node root explicitly.
pub const ROOT_ENV: &str = "TESSERA_SIM_ROOT";

/// Environment variable that makes a stand-in explain itself on stderr (the
/// node it serves, and why a state file could not be read).
pub const DEBUG_ENV: &str = "TESSERA_SIM_DEBUG";

/// Library directories, relative to a root, that a stand-in may be installed
/// in; longest first, so `<root>/usr/lib/x86_64-linux-gnu` is not read as
/// `<root>/usr` + `lib/x86_64-linux-gnu`.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "lib/x86_64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
    "lib",
];

/// Where a node root candidate came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootSource {
    /// `TESSERA_SIM_ROOT`.
    Env(PathBuf),
    /// The library's own install path.
    LibraryPath(PathBuf),
    /// Neither; `library` is the library's own path when it could be told.
    Unknown {
        /// Where the library was loaded from.
        library: Option<PathBuf>,
    },
}

/// The node root candidate: `TESSERA_SIM_ROOT`, or the root the calling
/// library was installed under (whether or not it holds a node).
pub fn discover() -> RootSource {
    if let Some(root) = std::env::var_os(ROOT_ENV).filter(|v| !v.is_empty()) {
        return RootSource::Env(absolute(PathBuf::from(root)));
    }
    let Some(lib) = own_library_path() else {
        return RootSource::Unknown { library: None };
    };
    let lib = absolute(lib);
    let root = root_of_library(&lib).or_else(|| {
        std::fs::canonicalize(&lib)
            .ok()
            .and_then(|real| root_of_library(&real))
    });
    match root {
        Some(root) => RootSource::LibraryPath(root),
        None => RootSource::Unknown { library: Some(lib) },
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

/// A function whose address lies inside the shared object this crate is
/// linked into; private, so no symbol of the same name elsewhere can stand in
/// for it.
#[inline(never)]
fn anchor() {}

/// The path the dynamic loader loaded the calling shared object from (the
/// stand-in library this crate is linked into; the executable when linked
/// into a program).
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
    // the object contains this code, which is running. It is copied out at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let name = OsStr::from_bytes(name.to_bytes());
    (!name.is_empty()).then(|| PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(lib: &str) -> Option<PathBuf> {
        root_of_library(Path::new(lib))
    }

    #[test]
    fn debian_multiarch_path_gives_the_prefix() {
        assert_eq!(
            root("/tmp/node/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
            Some(PathBuf::from("/tmp/node"))
        );
    }

    #[test]
    fn other_library_dirs_give_the_prefix() {
        for lib in [
            "/n/usr/lib64/libcuda.so.1",
            "/n/usr/lib/libcuda.so.1",
            "/n/lib64/libcuda.so.1",
        ] {
            assert_eq!(root(lib), Some(PathBuf::from("/n")), "{lib}");
        }
    }

    #[test]
    fn a_real_hosts_library_dir_gives_slash() {
        assert_eq!(
            root("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
            Some(PathBuf::from("/"))
        );
    }

    #[test]
    fn a_build_dir_is_no_root() {
        assert_eq!(root("/work/main/target/debug/libtessera_sim_nvml.so"), None);
        assert_eq!(root("libnvidia-ml.so.1"), None);
    }
}
