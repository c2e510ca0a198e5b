//! The one image simulated pods run: a busybox-static root filesystem as an
//! OCI archive, for `ctr images import` into a private containerd. It is
//! also the sandbox ("pause") image: its default command is `sleep`.
//!
//! No registry is reachable from the machines this runs on, so the image is
//! made locally from the host's `busybox-static`: a rootfs tarball turned
//! into an image by `podman import`, written out by `podman save --format
//! oci-archive`. It is built once per cache directory, keyed by the busybox
//! binary and the recipe, under an exclusive lock (several clusters or test
//! processes may ask at once).

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::containerd::{ContainerdError, run};

/// The name every daemon holds the image under, and pods' YAML names.
pub const IMAGE: &str = "localhost/tessera-sim/busybox:latest";

/// The image that can run a CUDA program (`cluster up --cuda-probe FILE`):
/// the busybox applets, the host's glibc (dynamic loader and the libraries
/// the probe needs) and `tessera-cuda-probe` at [`CUDA_PROBE_PATH`]. The
/// container gets `libcuda.so.1` (the simulator's stand-in) from its CDI
/// spec, as from the NVIDIA driver on a real node.
pub const CUDA_PROBE_IMAGE: &str = "localhost/tessera-sim/cuda-probe:latest";

/// Where the cuda-probe image holds `tessera-cuda-probe`.
pub const CUDA_PROBE_PATH: &str = "/usr/bin/tessera-cuda-probe";

/// The host libraries the cuda-probe image always carries (those present),
/// beside what `ldd` lists for the probe: glibc's loader and the libraries
/// a preloaded or dlopened Rust cdylib needs.
const GLIBC_LIBRARIES: &[&str] = &[
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "libgcc_s.so.1",
];

/// Where the cuda-probe image's libraries go (and where the host's are).
const LIBRARY_DIR: &str = "lib/x86_64-linux-gnu";

/// What changes the cuda-probe image (beside the bytes of its files).
const CUDA_PROBE_RECIPE: &str =
    "v1: busybox image + /lib/x86_64-linux-gnu glibc + /lib64 loader + /usr/bin/tessera-cuda-probe";

/// Where the host's static busybox may be (`apt-get install busybox-static`).
pub const BUSYBOX_PATHS: [&str; 2] = ["/bin/busybox", "/usr/bin/busybox"];

/// What changes the image: bump when the build below changes.
const RECIPE: &str = "v2: busybox --list in /bin; dev proc sys etc tmp run; CMD sleep infinity";

/// Serializes builds between the threads of one process (the file lock
/// serializes processes).
static BUILD: Mutex<()> = Mutex::new(());

/// What went wrong building the image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// No static busybox on the host (a dynamically linked one would not
    /// run in the image, which has no libc).
    #[error("no statically linked busybox (looked at {0:?}; apt-get install busybox-static)")]
    NoBusybox([&'static str; 2]),
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `tar` or `podman` failed.
    #[error(transparent)]
    Tool(#[from] ContainerdError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_owned(),
        source,
    }
}

/// An OCI archive of the busybox image and the name it holds the image under.
#[derive(Debug, Clone)]
pub struct ImageArchive {
    /// The `oci-archive` file.
    pub path: PathBuf,
    /// The image's name in it (a build tag; daemons tag it [`IMAGE`]).
    pub name: String,
}

/// The busybox image as an OCI archive in `cache_dir`, built there unless
/// an archive of the same busybox and recipe already is.
pub fn busybox_archive(cache_dir: &Path) -> Result<ImageArchive, ImageError> {
    let busybox = static_busybox()?;
    let key = fnv(&[
        &fs::read(&busybox).map_err(io(&busybox))?,
        RECIPE.as_bytes(),
    ]);
    cached(cache_dir, "busybox", key, |rootfs| {
        busybox_rootfs(&busybox, rootfs)
    })
}

/// The cuda-probe image ([`CUDA_PROBE_IMAGE`]) as an OCI archive in
/// `cache_dir`, with `probe` (a dynamically linked `tessera-cuda-probe`) at
/// [`CUDA_PROBE_PATH`]; built there unless an archive of the same files
/// and recipe already is.
pub fn cuda_probe_archive(cache_dir: &Path, probe: &Path) -> Result<ImageArchive, ImageError> {
    let busybox = static_busybox()?;
    let mut libraries: Vec<PathBuf> = GLIBC_LIBRARIES
        .iter()
        .map(|name| Path::new("/").join(LIBRARY_DIR).join(name))
        .filter(|p| p.exists())
        .collect();
    for lib in ldd(probe)? {
        if !libraries.iter().any(|l| l.file_name() == lib.file_name()) {
            libraries.push(lib);
        }
    }
    let mut parts: Vec<Vec<u8>> = vec![
        fs::read(&busybox).map_err(io(&busybox))?,
        fs::read(probe).map_err(io(probe))?,
        CUDA_PROBE_RECIPE.as_bytes().to_vec(),
    ];
    for lib in &libraries {
        parts.push(lib.display().to_string().into_bytes());
        parts.push(fs::read(lib).map_err(io(lib))?);
    }
    let key = fnv(&parts.iter().map(Vec::as_slice).collect::<Vec<_>>());
    cached(cache_dir, "cuda-probe", key, |rootfs| {
        busybox_rootfs(&busybox, rootfs)?;
        let lib_dir = rootfs.join(LIBRARY_DIR);
        fs::create_dir_all(&lib_dir).map_err(io(&lib_dir))?;
        for lib in &libraries {
            let name = lib.file_name().unwrap_or_default();
            let to = lib_dir.join(name);
            // `fs::copy` follows the host's symlinks: the image gets files.
            fs::copy(lib, &to).map_err(io(&to))?;
        }
        let lib64 = rootfs.join("lib64");
        fs::create_dir_all(&lib64).map_err(io(&lib64))?;
        let loader = lib64.join("ld-linux-x86-64.so.2");
        symlink("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", &loader).map_err(io(&loader))?;
        for dir in ["usr/bin", "usr/lib/x86_64-linux-gnu", "usr/local/tessera"] {
            let d = rootfs.join(dir);
            fs::create_dir_all(&d).map_err(io(&d))?;
        }
        let to = rootfs.join(CUDA_PROBE_PATH.trim_start_matches('/'));
        fs::copy(probe, &to).map_err(io(&to))?;
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).map_err(io(&to))?;
        Ok(())
    })
}

/// A busybox image with more in it, as an OCI archive in `cache_dir` named
/// after `kind`: [`busybox_archive`]'s root filesystem, then `populate` adds
/// to it. Built unless an archive of the same busybox, `kind` and `key_parts`
/// already is, so `key_parts` must hold everything `populate` reads (file
/// contents, the recipe's version).
pub fn busybox_archive_with(
    cache_dir: &Path,
    kind: &str,
    key_parts: &[&[u8]],
    populate: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<ImageArchive, ImageError> {
    let busybox = static_busybox()?;
    let mut parts: Vec<Vec<u8>> = vec![
        fs::read(&busybox).map_err(io(&busybox))?,
        RECIPE.as_bytes().to_vec(),
        kind.as_bytes().to_vec(),
    ];
    parts.extend(key_parts.iter().map(|p| p.to_vec()));
    let key = fnv(&parts.iter().map(Vec::as_slice).collect::<Vec<_>>());
    cached(cache_dir, kind, key, |rootfs| {
        busybox_rootfs(&busybox, rootfs)?;
        populate(rootfs).map_err(io(rootfs))
    })
}

/// The libraries `ldd` resolves for `program` (absolute paths only: not
/// the vDSO).
fn ldd(program: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(io(program))?;
    if !out.status.success() {
        return Err(io(program)(std::io::Error::other(format!(
            "ldd failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or
            // `/lib64/ld-linux-x86-64.so.2 (0x…)`.
            let path = line.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

fn static_busybox() -> Result<PathBuf, ImageError> {
    BUSYBOX_PATHS
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file() && is_static_elf(p))
        .map(Path::to_path_buf)
        .ok_or(ImageError::NoBusybox(BUSYBOX_PATHS))
}

/// FNV-1a over the parts, in order.
fn fnv(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

/// The archive `<cache_dir>/<kind>-<key>.oci.tar`, built with `populate`
/// (which fills the root filesystem) unless it exists; under the cache
/// directory's lock.
fn cached(
    cache_dir: &Path,
    kind: &str,
    key: u64,
    populate: impl FnOnce(&Path) -> Result<(), ImageError>,
) -> Result<ImageArchive, ImageError> {
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    fs::create_dir_all(cache_dir).map_err(io(cache_dir))?;
    let lock_path = cache_dir.join(".lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io(&lock_path)(e.into()))?;
    // A tag of its own, so a build never clobbers an image someone else uses.
    let tag = format!("localhost/tessera-sim/{kind}-build:{key:016x}");
    let archive = ImageArchive {
        path: cache_dir.join(format!("{kind}-{key:016x}.oci.tar")),
        name: tag.clone(),
    };
    if archive.path.exists() {
        return Ok(archive);
    }
    tracing::info!(archive = %archive.path.display(), "building the {kind} image");

    let work = cache_dir.join(format!(".work-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let rootfs = work.join("rootfs");
    let result = fs::create_dir_all(&rootfs)
        .map_err(io(&rootfs))
        .and_then(|()| populate(&rootfs))
        .and_then(|()| build(&work, &tag, &archive));
    let _ = fs::remove_dir_all(&work);
    result.map(|()| archive)
}

/// Whether `path` is an ELF executable without a program interpreter
/// (`PT_INTERP`): statically linked, so it runs in an image without libc.
fn is_static_elf(path: &Path) -> bool {
    fs::read(path).is_ok_and(|bytes| elf_is_static(&bytes))
}

/// [`is_static_elf`] on the file's bytes (64- and 32-bit, either endianness).
fn elf_is_static(b: &[u8]) -> bool {
    if b.len() < 52 || b[..4] != *b"\x7fELF" {
        return false;
    }
    let wide = b[4] == 2;
    let little = b[5] == 1;
    let int = |at: usize, len: usize| -> Option<u64> {
        let s = b.get(at..at + len)?;
        Some(if little {
            s.iter().rev().fold(0, |v, x| (v << 8) | u64::from(*x))
        } else {
            s.iter().fold(0, |v, x| (v << 8) | u64::from(*x))
        })
    };
    let (phoff, phentsize, phnum) = if wide {
        (int(0x20, 8), int(0x36, 2), int(0x38, 2))
    } else {
        (int(0x1c, 4), int(0x2a, 2), int(0x2c, 2))
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else {
        return false;
    };
    const PT_INTERP: u64 = 3;
    (0..phnum).all(|i| {
        usize::try_from(phoff + i * phentsize)
            .ok()
            .and_then(|at| int(at, 4))
            .is_some_and(|kind| kind != PT_INTERP)
    })
}

/// The busybox root filesystem: `/bin/busybox` and a link per applet, the
/// usual empty directories.
fn busybox_rootfs(busybox: &Path, rootfs: &Path) -> Result<(), ImageError> {
    let bin = rootfs.join("bin");
    fs::create_dir_all(&bin).map_err(io(&bin))?;
    fs::copy(busybox, bin.join("busybox")).map_err(io(&bin))?;
    let list = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|e| io(busybox)(e))?;
    if !list.status.success() || list.stdout.is_empty() {
        return Err(io(busybox)(std::io::Error::other(format!(
            "`busybox --list` failed ({}): {}",
            list.status,
            String::from_utf8_lossy(&list.stderr).trim()
        ))));
    }
    for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
        if applet == "busybox" || applet.contains('/') {
            continue;
        }
        let link = bin.join(applet);
        symlink("busybox", &link).map_err(io(&link))?;
    }
    for dir in ["dev", "proc", "sys", "etc", "tmp", "run"] {
        let d = rootfs.join(dir);
        fs::create_dir_all(&d).map_err(io(&d))?;
    }
    let tmp = rootfs.join("tmp");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).map_err(io(&tmp))?;
    Ok(())
}

/// `<work>/rootfs` → an image tagged `tag` → the OCI archive.
fn build(work: &Path, tag: &str, archive: &ImageArchive) -> Result<(), ImageError> {
    let rootfs = work.join("rootfs");
    let tar = work.join("rootfs.tar");
    run(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("--numeric-owner")
            .arg("-cf")
            .arg(&tar)
            .arg("."),
        "tar (image rootfs)",
    )?;
    run(
        Command::new("podman")
            .args([
                "import",
                "-q",
                "--change",
                r#"CMD ["/bin/sleep", "infinity"]"#,
            ])
            .arg(&tar)
            .arg(tag),
        "podman import",
    )?;
    let partial = work.join("image.oci.tar");
    let saved = run(
        Command::new("podman")
            .args(["save", "-q", "--format", "oci-archive", "-o"])
            .arg(&partial)
            .arg(tag),
        "podman save",
    );
    let _ = Command::new("podman")
        .args(["rmi", "-f", tag])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    saved?;
    fs::rename(&partial, &archive.path).map_err(io(&archive.path))?;
    Ok(())
}

/// Loads the archive into podman's image store (the host's, shared by every
/// user of podman) and tags the image [`IMAGE`], for kubelets running pods
/// with podman.
pub fn load_into_podman(archive: &ImageArchive) -> Result<(), ImageError> {
    load_into_podman_as(archive, IMAGE)
}

/// Loads the archive into podman's image store and tags the image `name`.
pub fn load_into_podman_as(archive: &ImageArchive, name: &str) -> Result<(), ImageError> {
    run(
        Command::new("podman")
            .args(["load", "-q", "-i"])
            .arg(&archive.path),
        "podman load",
    )?;
    run(
        Command::new("podman").args(["tag", &archive.name, name]),
        "podman tag",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamically_linked_program_is_not_static_and_text_is_not_elf() {
        // /bin/sh is dynamically linked on every distribution this runs on.
        let sh = fs::canonicalize("/bin/sh").expect("/bin/sh");
        let bytes = fs::read(&sh).expect("read");
        assert!(!elf_is_static(&bytes), "{}", sh.display());
        assert!(!elf_is_static(b"#!/bin/sh\necho hi\n"));
        // The same header with its PT_INTERP entries turned into PT_NULL.
        let mut patched = bytes.clone();
        assert_eq!(patched[4], 2, "a 64-bit /bin/sh");
        let num = |at: usize, len: usize| {
            patched[at..at + len]
                .iter()
                .rev()
                .fold(0usize, |v, x| (v << 8) | usize::from(*x))
        };
        let (phoff, size, count) = (num(0x20, 8), num(0x36, 2), num(0x38, 2));
        for i in 0..count {
            let at = phoff + i * size;
            if patched[at..at + 4] == [3, 0, 0, 0] {
                patched[at] = 0;
            }
        }
        assert!(elf_is_static(&patched));
    }
}
