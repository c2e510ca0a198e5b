//! Root filesystems for the library-visibility tests (`ldcache_runc.rs`,
//! `ldcache_cri.rs`), built from the host's glibc (no registry): a
//! Debian-layout one and a lib64-layout one (a RHEL/UBI-like image: glibc in
//! `/usr/lib64`, found through the image's own `/etc/ld.so.cache` made with
//! `ldconfig -r`), each with a small program that `dlopen`s libraries by name
//! and the host's static `ldconfig`.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::hookenv::c_helper;

/// dlopens each argument by name and prints `DLOPEN <name> ok <path>` or
/// `DLOPEN <name> FAIL <error>`.
pub const DLOPEN_C: &str = "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <link.h>\n#include <stdio.h>\n\
    int main(int argc, char **argv) {\n\
      for (int i = 1; i < argc; i++) {\n\
        void *h = dlopen(argv[i], RTLD_LAZY);\n\
        struct link_map *m = 0;\n\
        if (h && dlinfo(h, RTLD_DI_LINKMAP, &m) == 0 && m)\n\
          printf(\"DLOPEN %s ok %s\\n\", argv[i], m->l_name);\n\
        else\n\
          printf(\"DLOPEN %s FAIL %s\\n\", argv[i], h ? \"no link map\" : dlerror());\n\
      }\n\
      return 0;\n}\n";

/// The host's static `ldconfig`.
pub const LDCONFIG: &str = "/sbin/ldconfig";

/// Where the [`DLOPEN_C`] program is in the root filesystems.
pub const PROBE_IN_ROOTFS: &str = "/usr/bin/dlopen-probe";

/// The [`DLOPEN_C`] program, compiled once per machine.
pub fn dlopen_probe() -> Result<PathBuf> {
    c_helper("dlopen-probe", DLOPEN_C, &["-O2"])
}

/// Where an image keeps glibc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Debian/Ubuntu: `/lib/x86_64-linux-gnu`.
    Debian,
    /// RHEL/UBI: `/usr/lib64`.
    Lib64,
}

impl Layout {
    /// Where glibc lives in the image, relative to its root.
    pub fn libc_dir(self) -> &'static str {
        match self {
            Layout::Debian => "lib/x86_64-linux-gnu",
            Layout::Lib64 => "usr/lib64",
        }
    }
}

/// A driver library of a simulated node: its host file and SONAME.
#[derive(Debug, Clone)]
pub struct Library {
    /// The regular file on the host.
    pub host: PathBuf,
    /// Its SONAME (its file name without one).
    pub soname: String,
}

/// The ELF libraries of the node's library directory (regular files; the
/// SONAME links a real install has are left out), each with its SONAME as
/// `readelf` reads it (its file name without one), by SONAME.
pub fn node_libraries(node_root: &Path) -> Result<Vec<Library>> {
    let dir = node_root.join("usr/lib/x86_64-linux-gnu");
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let meta = fs::symlink_metadata(&path)?;
        let head = fs::read(&path).unwrap_or_default();
        if !meta.is_file() || !name.starts_with("lib") || !head.starts_with(b"\x7fELF") {
            continue;
        }
        let dynamic = Command::new("readelf")
            .arg("-d")
            .arg(&path)
            .output()
            .context("readelf")?;
        let soname = String::from_utf8_lossy(&dynamic.stdout)
            .lines()
            .find(|l| l.contains("(SONAME)"))
            .and_then(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_owned()))
            .unwrap_or(name);
        out.push(Library { host: path, soname });
    }
    out.sort_by(|a, b| a.soname.cmp(&b.soname));
    ensure!(
        out.iter().any(|l| l.soname == "libcuda.so.1"),
        "the node has no libcuda.so.1 ELF library: {out:?}"
    );
    Ok(out)
}

/// The shared objects `files` need, as `ldd` lists them (the loader apart).
pub fn dependencies(files: &[PathBuf]) -> Result<BTreeSet<PathBuf>> {
    let mut deps = BTreeSet::new();
    for f in files {
        let out = Command::new("ldd").arg(f).output().context("ldd")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((_, rest)) = line.split_once("=> ")
                && let Some(path) = rest.split_whitespace().next()
                && path.starts_with('/')
            {
                deps.insert(PathBuf::from(path));
            }
        }
    }
    Ok(deps)
}

/// Fills `rootfs` (busybox already there) with glibc and the dependencies of
/// `program` and of `libraries` in `layout`'s directory, the loader at
/// `/lib64/ld-linux-x86-64.so.2`, the host's `ldconfig` at `/sbin/ldconfig`,
/// `program` at [`PROBE_IN_ROOTFS`] and the image's own cache.
pub fn build_rootfs(
    rootfs: &Path,
    layout: Layout,
    program: &Path,
    libraries: &[Library],
) -> Result<()> {
    let libc_dir = rootfs.join(layout.libc_dir());
    fs::create_dir_all(&libc_dir)?;
    let mut files: Vec<PathBuf> = libraries.iter().map(|l| l.host.clone()).collect();
    files.push(program.to_owned());
    for dep in dependencies(&files)? {
        let name = dep.file_name().context("a dependency without a name")?;
        fs::copy(&dep, libc_dir.join(name)).with_context(|| dep.display().to_string())?;
    }
    fs::create_dir_all(rootfs.join("lib64"))?;
    fs::copy(
        "/lib64/ld-linux-x86-64.so.2",
        rootfs.join("lib64/ld-linux-x86-64.so.2"),
    )
    .context("the loader")?;
    if layout == Layout::Debian {
        let name = rootfs.join("lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
        if !name.exists() {
            symlink("/lib64/ld-linux-x86-64.so.2", name)?;
        }
    }
    for dir in ["sbin", "usr/bin", "etc"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::copy(LDCONFIG, rootfs.join("sbin/ldconfig")).context("ldconfig")?;
    fs::copy(
        program,
        rootfs.join(PROBE_IN_ROOTFS.trim_start_matches('/')),
    )
    .context("the probe")?;
    fs::write(
        rootfs.join("etc/ld.so.conf"),
        format!("/{}\n", layout.libc_dir()),
    )?;
    // The image's own cache, as its build would have made it.
    let out = Command::new(LDCONFIG)
        .arg("-r")
        .arg(rootfs)
        .output()
        .context("ldconfig -r")?;
    ensure!(
        out.status.success(),
        "ldconfig -r: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        rootfs.join("etc/ld.so.cache").is_file(),
        "ldconfig -r wrote no cache"
    );
    Ok(())
}
