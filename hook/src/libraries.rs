//! Making the injected driver libraries findable by name in the container,
//! with any image's loader: SONAME and development links next to each
//! library, and entries in the container's `/etc/ld.so.cache`.
//!
//! **Which libraries** ([`library_targets`]): every bind mount of the spec
//! (applied by the runtime, or by the hook itself) whose container path's
//! file name matches `lib*.so*`, and which, in the container, is a regular
//! file holding an x86-64 or i386 ELF shared object ([`crate::elf`]).
//! Anything else named like a library (a text stand-in, a file of another
//! architecture) is skipped, as `ldconfig` skips it.
//!
//! **For each library** `<dir>/<file>` with SONAME `S` (its `DT_SONAME`, or
//! its file name when it has none):
//!
//! 1. the link `<dir>/S -> <file>` when `file != S` (a symlink already
//!    there is replaced; any other entry is left and the cache names
//!    `<dir>/<file>` instead);
//! 2. the development link of [`DEV_LINKS`] (`libcuda.so -> libcuda.so.1`),
//!    as NVIDIA's container toolkit makes it (Triton looks for it);
//! 3. cache entries `S -> <dir>/S` and `libcuda.so -> <dir>/libcuda.so`,
//!    flags `libc6,x86-64` (or `libc6` for i386), replacing the image's
//!    entries of the same names and flags.
//!
//! Links are made only in a directory on the container's root mount (its
//! mount id is the root's): never in a bind-mounted host directory. The cache
//! is read from `/etc/ld.so.cache` (a malformed one is rebuilt from our
//! entries, with a warning), and written atomically (temp file + rename in
//! `/etc`), again only when `/etc` is on the root mount. Every path is
//! resolved in the container root fd ([`crate::rootfs`]); nothing from the
//! container is executed.
//!
//! Nothing here fails the container: each problem becomes a warning in the
//! [`Report`], and the container starts as it would have without it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, OFlags, ResolveFlags, StatxFlags};
use rustix::io::Errno;
use tessera_model::cdi::ContainerEdits;

use crate::elf::{self, Arch};
use crate::fsutil::{Durability, read_bounded, write_atomic};
use crate::journal::Journal;
use crate::ldcache::{self, Cache, Entry, FLAGS_I386, FLAGS_X86_64};
use crate::oci::OciConfig;
use crate::plan::ContainerPath;
use crate::rootfs::ContainerRoot;

/// The container's cache: `/etc/ld.so.cache`.
pub const CACHE_DIR: &str = "etc";
/// The cache's file name in [`CACHE_DIR`].
pub const CACHE_FILE: &str = "ld.so.cache";
/// Development links made next to a library: (SONAME, link name).
pub const DEV_LINKS: &[(&str, &str)] = &[
    ("libcuda.so.1", "libcuda.so"),
    ("libnvidia-opticalflow.so.1", "libnvidia-opticalflow.so"),
];

/// What [`refresh`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Libraries registered (one per library file).
    pub libraries: usize,
    /// Links created or replaced.
    pub links: usize,
    /// Entries put in the cache.
    pub entries: usize,
    /// Whether `/etc/ld.so.cache` was written.
    pub cache_written: bool,
    /// What could not be done, one line each.
    pub warnings: Vec<String>,
}

/// Whether `name` matches `lib*.so*`.
pub fn is_library_name(name: &str) -> bool {
    name.strip_prefix("lib")
        .is_some_and(|rest| rest.contains(".so"))
}

/// The container paths of the libraries among `edits`' mounts (see the
/// module doc), in spec order, without duplicates.
pub fn library_targets(edits: &ContainerEdits) -> Vec<ContainerPath> {
    let mut out: Vec<ContainerPath> = Vec::new();
    for m in &edits.mounts {
        let bind = m.mount_type.as_deref().is_none_or(|t| t == "bind")
            && m.options.iter().any(|o| o == "bind" || o == "rbind");
        let Ok(path) = ContainerPath::parse(&m.container_path) else {
            continue;
        };
        if bind && is_library_name(path.name()) && !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// Whether the container's config has a mount from a host path to a file
/// named `lib*.so*`: the cheap test that lets a container that asks the hook
/// for nothing skip reading `hook.toml` and the specs.
pub fn config_has_library_mounts(oci: &OciConfig) -> bool {
    oci.mounts.iter().any(|m| {
        m.source.is_some()
            && ContainerPath::parse(&m.destination).is_ok_and(|p| is_library_name(p.name()))
    })
}

fn mount_id(fd: impl AsFd) -> io::Result<u64> {
    let stx = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
    if stx.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        // Kernels before 5.8: fall back to the device number.
        return Ok(u64::from(stx.stx_dev_major) << 32 | u64::from(stx.stx_dev_minor));
    }
    Ok(stx.stx_mnt_id)
}

fn display(components: &[String]) -> String {
    format!("/{}", components.join("/"))
}

/// What a directory entry is, not following a symlink.
enum Found {
    Missing,
    Link(String),
    Other,
}

fn look(dir: &OwnedFd, name: &str) -> io::Result<Found> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(Found::Missing),
        Err(e) => Err(e.into()),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
            let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
            Ok(Found::Link(target.to_string_lossy().into_owned()))
        }
        Ok(_) => Ok(Found::Other),
    }
}

/// Makes `dir/name -> target`: created when missing, replaced (atomically)
/// when a symlink to something else; `Ok(false)` when another kind of entry
/// is there (left alone). `Ok(true)` when the link is (now) ours.
fn ensure_link(dir: &OwnedFd, name: &str, target: &str, made: &mut usize) -> io::Result<bool> {
    match look(dir, name)? {
        Found::Link(t) if t == target => Ok(true),
        Found::Other => Ok(false),
        Found::Missing => {
            rustix::fs::symlinkat(target, dir, name)?;
            *made += 1;
            Ok(true)
        }
        Found::Link(_) => {
            let tmp = format!(".{name}.tessera-{}", std::process::id());
            let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
            rustix::fs::symlinkat(target, dir, tmp.as_str())?;
            if let Err(e) = rustix::fs::renameat(dir, tmp.as_str(), dir, name) {
                let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
                return Err(e.into());
            }
            *made += 1;
            Ok(true)
        }
    }
}

/// One library found in the container.
struct Library {
    dir: Vec<String>,
    file: String,
    soname: String,
    flags: i32,
}

fn inspect(root: &ContainerRoot, target: &ContainerPath) -> Result<Option<Library>, String> {
    let fd = root
        .open_regular(target.components())
        .map_err(|e| format!("{target}: {e}"))?;
    let file = std::fs::File::from(fd);
    let Some(so) = elf::shared_object(&file) else {
        crate::debug!("{target} is not an x86-64 or i386 shared object; not registered");
        return Ok(None);
    };
    let name = target.name();
    let soname = match so.soname {
        Some(s) => s,
        None if elf::valid_soname(name) => name.to_owned(),
        None => return Ok(None),
    };
    Ok(Some(Library {
        dir: target.parent().to_vec(),
        file: name.to_owned(),
        soname,
        flags: match so.arch {
            Arch::X86_64 => FLAGS_X86_64,
            Arch::I386 => FLAGS_I386,
        },
    }))
}

/// Links the libraries at `targets` and registers them in the container's
/// cache. Call in the container's mount namespace, with its mounts in place.
pub fn refresh(root: &ContainerRoot, targets: &[ContainerPath]) -> Report {
    let mut report = Report::default();
    if targets.is_empty() {
        return report;
    }
    let root_mnt = match mount_id(root.fd()) {
        Ok(id) => id,
        Err(e) => {
            report
                .warnings
                .push(format!("statx of the container root: {e}"));
            return report;
        }
    };
    let mut entries = Vec::new();
    for target in targets {
        let lib = match inspect(root, target) {
            Ok(Some(lib)) => lib,
            Ok(None) => continue,
            Err(w) => {
                report.warnings.push(w);
                continue;
            }
        };
        report.libraries += 1;
        let dir_path = display(&lib.dir);
        let path_of = |name: &str| format!("{}/{name}", dir_path.trim_end_matches('/'));
        let dir = root
            .open(&lib.dir, OFlags::DIRECTORY)
            .and_then(|fd| Ok((mount_id(&fd)?, fd)));
        let dir = match dir {
            Ok((mnt, fd)) if mnt == root_mnt => Some(fd),
            Ok(_) => {
                report.warnings.push(format!(
                    "{dir_path} is not on the container's root mount; no links made there"
                ));
                None
            }
            Err(e) => {
                report.warnings.push(format!("{dir_path}: {e}"));
                None
            }
        };
        let mut soname_path = path_of(&lib.file);
        if lib.soname != lib.file
            && let Some(dir) = &dir
        {
            match ensure_link(dir, &lib.soname, &lib.file, &mut report.links) {
                Ok(true) => soname_path = path_of(&lib.soname),
                Ok(false) => report.warnings.push(format!(
                    "{} exists and is not a link; the cache names {soname_path}",
                    path_of(&lib.soname)
                )),
                Err(e) => report
                    .warnings
                    .push(format!("link {}: {e}", path_of(&lib.soname))),
            }
        }
        entries.push(Entry {
            flags: lib.flags,
            ..Entry::x86_64(&lib.soname, &soname_path)
        });
        let dev = DEV_LINKS.iter().find(|(s, _)| *s == lib.soname);
        if let (Some((soname, dev)), Some(dir)) = (dev, &dir) {
            let linked = soname_path == path_of(soname);
            match ensure_link(
                dir,
                dev,
                if linked { soname } else { &lib.file },
                &mut report.links,
            ) {
                Ok(true) => entries.push(Entry {
                    flags: lib.flags,
                    ..Entry::x86_64(dev, &path_of(dev))
                }),
                Ok(false) => {}
                Err(e) => report.warnings.push(format!("link {}: {e}", path_of(dev))),
            }
        }
    }
    if entries.is_empty() {
        return report;
    }
    report.entries = entries.len();
    match write_cache(root, root_mnt, entries, &mut report.warnings) {
        Ok(()) => report.cache_written = true,
        Err(e) => report
            .warnings
            .push(format!("/{CACHE_DIR}/{CACHE_FILE} not updated: {e}")),
    }
    report
}

fn write_cache(
    root: &ContainerRoot,
    root_mnt: u64,
    entries: Vec<Entry>,
    warnings: &mut Vec<String>,
) -> io::Result<()> {
    let etc = [CACHE_DIR.to_owned()];
    let mut journal = Journal::default();
    root.make_dir(&etc, &mut journal)?;
    journal.commit();
    let dir = root.open(&etc, OFlags::DIRECTORY)?;
    if mount_id(&dir)? != root_mnt {
        return Err(io::Error::other(format!(
            "/{CACHE_DIR} is not on the container's root mount"
        )));
    }
    let mut cache = match read_existing(&dir) {
        Ok(Some(raw)) => match ldcache::parse(&raw) {
            Ok(cache) => cache,
            Err(e) => {
                warnings.push(format!(
                    "the image's /{CACHE_DIR}/{CACHE_FILE} is malformed ({e}); rebuilt with the driver's libraries only"
                ));
                Cache::default()
            }
        },
        Ok(None) => Cache::default(),
        Err(e) => {
            warnings.push(format!(
                "the image's /{CACHE_DIR}/{CACHE_FILE} could not be read ({e}); rebuilt with the driver's libraries only"
            ));
            Cache::default()
        }
    };
    for e in entries {
        cache.insert(e);
    }
    write_atomic(
        &dir,
        CACHE_FILE,
        &cache.to_bytes(),
        Durability::WhileRunning,
    )
}

/// The image's cache, when it has one as a regular file (a symlink is not
/// followed: it is replaced by the rename).
fn read_existing(dir: &OwnedFd) -> io::Result<Option<Vec<u8>>> {
    let fd = rustix::fs::openat2(
        dir,
        CACHE_FILE,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    );
    let fd = match fd {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        return Ok(None);
    }
    read_bounded(fd, ldcache::MAX_FILE).map(Some)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use tessera_model::cdi::Mount;
    use tessera_test_support::rootfs::RootBesideHost as Tree;

    use super::*;

    fn mount(container: &str, options: &[&str]) -> Mount {
        Mount {
            host_path: "/host".into(),
            container_path: container.into(),
            options: options.iter().map(|s| (*s).to_owned()).collect(),
            mount_type: None,
        }
    }

    fn so(soname: Option<&str>) -> Vec<u8> {
        crate::elf::tests_support::tiny_so(soname, 0)
    }

    fn paths(t: &[ContainerPath]) -> Vec<String> {
        t.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn libraries_are_the_bind_mounts_named_lib_so() {
        let edits = ContainerEdits {
            mounts: vec![
                mount(
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                    &["ro", "bind"],
                ),
                mount(
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                    &["ro", "bind"],
                ),
                mount("/usr/local/tessera/libtessera_vgpu.so", &["rbind"]),
                mount("/usr/bin/nvidia-smi", &["bind"]),
                mount("/etc/ld.so.preload", &["bind"]),
                mount("/lib/firmware/nvidia/gsp.bin", &["bind"]),
                mount("/usr/lib64/libnvidia-ml.so.1", &["tmpfs"]),
                mount("relative/libx.so", &["bind"]),
            ],
            ..ContainerEdits::default()
        };
        assert_eq!(
            paths(&library_targets(&edits)),
            [
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                "/usr/local/tessera/libtessera_vgpu.so"
            ]
        );
        assert!(is_library_name("libEGL_nvidia.so.0"));
        assert!(!is_library_name("nvidia_drv.so"));
        assert!(!is_library_name("libfoo"));
    }

    #[test]
    fn only_a_mount_from_a_source_to_a_library_name_needs_the_specs_read() {
        let config = |mounts: serde_json::Value| {
            crate::oci::parse_config(
                serde_json::json!({ "mounts": mounts })
                    .to_string()
                    .as_bytes(),
            )
            .expect("config")
        };
        assert!(config_has_library_mounts(&config(serde_json::json!([
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
        ]))));
        assert!(!config_has_library_mounts(&config(serde_json::json!([
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/usr/lib/libcuda.so.1", "type": "tmpfs"},
            {"destination": "/etc/hosts", "source": "/var/lib/hosts"},
        ]))));
    }

    fn cache_of(t: &Tree) -> Cache {
        ldcache::parse(&std::fs::read(t.p("rootfs/etc/ld.so.cache")).expect("cache"))
            .expect("parse")
    }

    fn link(t: &Tree, rel: &str) -> String {
        std::fs::read_link(t.p(rel))
            .expect("link")
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn versioned_libraries_get_soname_and_dev_links_and_cache_entries() {
        let t = Tree::new();
        let dir = "rootfs/usr/local/nvidia/lib64";
        t.write(
            &format!("{dir}/libcuda.so.550.54.15"),
            so(Some("libcuda.so.1")),
        );
        t.write(
            &format!("{dir}/libnvidia-ml.so.550.54.15"),
            so(Some("libnvidia-ml.so.1")),
        );
        t.write(&format!("{dir}/libnvidia-foo.so.1"), so(None));
        t.write(&format!("{dir}/libnot-elf.so.1"), b"stand-in text");
        // The image's own cache, kept.
        let mut image = Cache::default();
        image.insert(Entry::x86_64("libc.so.6", "/lib64/libc.so.6"));
        image.insert(Entry::x86_64(
            "libcuda.so.1",
            "/usr/local/cuda/compat/libcuda.so.1",
        ));
        t.write("rootfs/etc/ld.so.cache", image.to_bytes());
        let root = ContainerRoot::new(t.open_root());
        let targets: Vec<ContainerPath> = [
            "libcuda.so.550.54.15",
            "libnvidia-ml.so.550.54.15",
            "libnvidia-foo.so.1",
            "libnot-elf.so.1",
            "libmissing.so.1",
        ]
        .iter()
        .map(|f| ContainerPath::parse(&format!("/usr/local/nvidia/lib64/{f}")).expect("path"))
        .collect();
        let report = refresh(&root, &targets);
        assert_eq!(report.libraries, 3, "{report:?}");
        assert_eq!(
            report.links, 3,
            "two SONAME links and libcuda.so: {report:?}"
        );
        assert!(report.cache_written);
        assert_eq!(report.warnings.len(), 1, "the missing library: {report:?}");
        assert_eq!(
            link(&t, &format!("{dir}/libcuda.so.1")),
            "libcuda.so.550.54.15"
        );
        assert_eq!(link(&t, &format!("{dir}/libcuda.so")), "libcuda.so.1");
        assert_eq!(
            link(&t, &format!("{dir}/libnvidia-ml.so.1")),
            "libnvidia-ml.so.550.54.15"
        );
        let cache = cache_of(&t);
        let d = "/usr/local/nvidia/lib64";
        for (key, value) in [
            ("libcuda.so.1", format!("{d}/libcuda.so.1")),
            ("libcuda.so", format!("{d}/libcuda.so")),
            ("libnvidia-ml.so.1", format!("{d}/libnvidia-ml.so.1")),
            ("libnvidia-foo.so.1", format!("{d}/libnvidia-foo.so.1")),
            ("libc.so.6", "/lib64/libc.so.6".to_owned()),
        ] {
            assert_eq!(
                cache.lookup(key),
                [(value.as_bytes(), FLAGS_X86_64)],
                "{key}"
            );
        }
        assert!(cache.lookup("libnot-elf.so.1").is_empty());

        // A second run (prestart and createContainer both registered)
        // changes nothing and makes no link.
        let again = refresh(&root, &targets);
        assert_eq!(again.links, 0);
        assert_eq!(cache_of(&t), cache);
    }

    #[test]
    fn a_stale_link_is_replaced_and_a_file_in_the_way_is_left() {
        let t = Tree::new();
        let dir = "rootfs/usr/lib64";
        t.write(
            &format!("{dir}/libcuda.so.550.54.15"),
            so(Some("libcuda.so.1")),
        );
        symlink("libcuda.so.470.1", t.p(&format!("{dir}/libcuda.so.1"))).expect("stale");
        t.write(&format!("{dir}/libcuda.so"), b"the image's own file");
        t.write("rootfs/etc/ld.so.cache", b"glibc-ld.so.cache1.1 garbage");
        let root = ContainerRoot::new(t.open_root());
        let target = ContainerPath::parse("/usr/lib64/libcuda.so.550.54.15").expect("path");
        let report = refresh(&root, &[target]);
        assert_eq!(
            link(&t, &format!("{dir}/libcuda.so.1")),
            "libcuda.so.550.54.15"
        );
        assert_eq!(
            std::fs::read(t.p(&format!("{dir}/libcuda.so"))).expect("kept"),
            b"the image's own file"
        );
        assert!(
            report.warnings.iter().any(|w| w.contains("malformed")),
            "{report:?}"
        );
        let cache = cache_of(&t);
        assert_eq!(cache.entries.len(), 1, "rebuilt from ours only");
        assert_eq!(
            cache.lookup("libcuda.so.1"),
            [(&b"/usr/lib64/libcuda.so.1"[..], FLAGS_X86_64)]
        );
    }

    #[test]
    fn an_etc_symlink_out_of_the_root_writes_nothing_outside() {
        let t = Tree::new();
        t.write("rootfs/usr/lib/libx.so.1", so(Some("libx.so.1")));
        // /etc -> the host directory beside the root: resolved in the root,
        // it names /<host dir>, which does not exist there.
        symlink(t.p("host"), t.p("rootfs/etc")).expect("symlink");
        let root = ContainerRoot::new(t.open_root());
        let report = refresh(
            &root,
            &[ContainerPath::parse("/usr/lib/libx.so.1").expect("path")],
        );
        assert!(!report.cache_written, "{report:?}");
        assert!(t.host_names().is_empty(), "{:?}", t.host_names());
    }
}
