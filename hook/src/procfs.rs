//! `/proc`, opened once and checked to be procfs, and the few files read from
//! it: `<pid>/cgroup`, `<pid>/status`, `<pid>/mountinfo`, namespace links.
//!
//! Every access goes through the fd opened before the hook changes mount
//! namespace, so `self` keeps meaning the hook in the host's pid namespace even
//! after `setns` (the container's own `/proc` may be mounted by then).

use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, Mode, OFlags, PROC_SUPER_MAGIC};

use crate::fsutil::read_bounded;

pub use tessera_model::proc::{Status, parse_nspid, parse_status};

/// The most bytes of a procfs text file read (mountinfo of a busy node is tens of KiB).
const MAX_PROC_FILE: usize = 4 * 1024 * 1024;

/// An open, verified `/proc`.
#[derive(Debug)]
pub struct Procfs {
    fd: OwnedFd,
}

/// A namespace's identity: the nsfs inode of `/proc/<pid>/ns/<kind>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsId {
    dev: u64,
    ino: u64,
}

impl Procfs {
    /// Opens `/proc` and checks it is a procfs mount.
    pub fn open() -> io::Result<Procfs> {
        let fd = rustix::fs::open(
            "/proc",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        if rustix::fs::fstatfs(&fd)?.f_type != PROC_SUPER_MAGIC {
            return Err(io::Error::other("/proc is not a procfs mount"));
        }
        Ok(Procfs { fd })
    }

    /// Reads `/proc/<rel>` (bounded).
    pub fn read(&self, rel: &str) -> io::Result<String> {
        read_text(&self.fd, rel, "")
    }

    /// Opens `/proc/<pid>` (`self` allowed) as a directory fd: every later
    /// read through it concerns that very process, or fails with `ESRCH` once
    /// it is gone, even if its pid is reused meanwhile.
    pub fn process(&self, pid: &str) -> io::Result<ProcessDir> {
        let fd = rustix::fs::openat(
            &self.fd,
            pid,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(ProcessDir {
            fd,
            label: pid.to_owned(),
        })
    }

    /// The procfs directory fd itself (for `fchdir` when unmounting by fd).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// A second handle on the same checked `/proc` (the fd duplicated).
    pub fn try_clone(&self) -> io::Result<Procfs> {
        Ok(Procfs {
            fd: self.fd.try_clone()?,
        })
    }
}

/// Reads the text file `rel` under the procfs directory `dir` (bounded);
/// `shown` is what sits between `/proc/` and `rel` in messages.
fn read_text(dir: &OwnedFd, rel: &str, shown: &str) -> io::Result<String> {
    let fd = rustix::fs::openat(
        dir,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    let raw = read_bounded(fd, MAX_PROC_FILE)?;
    String::from_utf8(raw).map_err(|_| io::Error::other(format!("/proc/{shown}{rel} is not UTF-8")))
}

/// One process's `/proc/<pid>` directory, pinned by its fd.
#[derive(Debug)]
pub struct ProcessDir {
    fd: OwnedFd,
    label: String,
}

impl ProcessDir {
    /// How the process was named when opened (`self` or a pid), for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Reads `/proc/<pid>/<rel>` (bounded).
    pub fn read(&self, rel: &str) -> io::Result<String> {
        read_text(&self.fd, rel, &format!("{}/", self.label))
    }

    /// Opens `/proc/<pid>/<rel>` following its magic link (`root`, `ns/mnt`).
    pub fn open_link(&self, rel: &str, flags: OFlags) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            &self.fd,
            rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The identity of the process's namespace of `kind` (`mnt`, `pid`, `cgroup`).
    pub fn ns_id(&self, kind: &str) -> io::Result<NsId> {
        let st = rustix::fs::statat(&self.fd, format!("ns/{kind}"), AtFlags::empty())?;
        Ok(NsId::from_stat(&st))
    }

    /// The pid and the parent pid (as this procfs numbers them) and the
    /// `NSpid` list (the pid in each pid namespace from this procfs's down to
    /// the process's own), from one read of `status`.
    pub fn status(&self) -> io::Result<Status> {
        let status = self.read("status")?;
        parse_status(&status).ok_or_else(|| {
            io::Error::other(format!(
                "/proc/{}/status: no Pid, PPid or NSpid line",
                self.label
            ))
        })
    }
}

impl NsId {
    /// The identity of the nsfs inode `st` describes.
    pub fn from_stat(st: &rustix::fs::Stat) -> NsId {
        NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }

    /// An identity made up for tests of the rules over namespaces.
    pub fn fake(ino: u64) -> NsId {
        NsId { dev: 4, ino }
    }
}

/// One line of `/proc/<pid>/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupEntry {
    /// Hierarchy id (0 for cgroup v2).
    pub hierarchy: u32,
    /// Controllers (`devices`, `name=systemd`; empty for v2).
    pub controllers: Vec<String>,
    /// Path relative to the hierarchy's root, as the reader's cgroup namespace sees it.
    pub path: String,
}

/// Parses `/proc/<pid>/cgroup`; malformed lines are skipped.
pub fn parse_cgroup(text: &str) -> Vec<CgroupEntry> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?.parse().ok()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            Some(CgroupEntry {
                hierarchy,
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                path: path.to_owned(),
            })
        })
        .collect()
}

/// One line of `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Mount id.
    pub id: u64,
    /// The mounted filesystem's subtree shown here.
    pub root: String,
    /// Where it is mounted, relative to the reader's root.
    pub mount_point: String,
    /// Optional fields (`shared:N`, `master:N`, …).
    pub optional: Vec<String>,
    /// Filesystem type.
    pub fstype: String,
    /// Per-superblock options.
    pub super_options: Vec<String>,
}

impl MountInfo {
    /// Whether mount events under this mount propagate to peers.
    pub fn is_shared(&self) -> bool {
        self.optional.iter().any(|o| o.starts_with("shared:"))
    }
}

/// Parses `/proc/<pid>/mountinfo`; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let id = fields.next()?.parse().ok()?;
            let _parent = fields.next()?;
            let _dev = fields.next()?;
            let root = unescape(fields.next()?);
            let mount_point = unescape(fields.next()?);
            let _options = fields.next()?;
            let mut optional = Vec::new();
            loop {
                match fields.next()? {
                    "-" => break,
                    field => optional.push(field.to_owned()),
                }
            }
            let fstype = fields.next()?.to_owned();
            let _source = fields.next()?;
            let super_options = fields
                .next()
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect();
            Some(MountInfo {
                id,
                root,
                mount_point,
                optional,
                fstype,
                super_options,
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_read_through_the_pinned_process_dir() {
        let procfs = Procfs::open().expect("/proc");
        let me = procfs.process("self").expect("self");
        let status = me.status().expect("status");
        assert_eq!(status.pid, std::process::id());
        assert_eq!(status.nspid.first(), Some(&status.pid));
        assert_eq!(me.label(), "self");
    }

    #[test]
    fn a_gone_process_is_not_found() {
        let procfs = Procfs::open().expect("/proc");
        // Above the kernel's pid_max limit (4194304): never a live pid.
        let e = procfs.process("4194305").expect_err("no such pid");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn cgroup_v1_and_v2_lines() {
        let e = parse_cgroup(
            "5:devices:/t4\n4:memory:/a/b\n9:name=systemd:/x\n0::/kubepods/pod1\nbad\n",
        );
        assert_eq!(e.len(), 4);
        assert_eq!(e[0].controllers, ["devices"]);
        assert_eq!(e[0].path, "/t4");
        assert_eq!(e[3].hierarchy, 0);
        assert!(e[3].controllers.is_empty());
    }

    #[test]
    fn mountinfo_lines_with_optional_fields_and_escapes() {
        let text = "55 50 0:33 / /sys/fs/cgroup/devices rw,relatime shared:9 - cgroup cgroup rw,devices\n\
                    69 46 254:0 /tmp/my\\040dir /tmp/b/rootfs rw,relatime - ext4 /dev/vda rw\n\
                    broken line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, "/sys/fs/cgroup/devices");
        assert!(m[0].is_shared());
        assert_eq!(m[0].super_options, ["rw", "devices"]);
        assert_eq!(m[1].root, "/tmp/my dir");
        assert!(!m[1].is_shared());
    }
}
