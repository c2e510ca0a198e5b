//! `/proc`, opened once and checked to be procfs, and the few files read from
//! it: `<pid>/cgroup`, `self/mountinfo`, `<pid>/stat`, namespace links.
//!
//! Every access goes through the fd opened before the hook changes mount
//! namespace, so `self` keeps meaning the hook in the host's pid namespace even
//! after `setns` (the container's own `/proc` may be mounted by then).

use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, Mode, OFlags, PROC_SUPER_MAGIC};

use crate::fsutil::read_bounded;

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
        let fd = rustix::fs::openat(
            &self.fd,
            rel,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        let raw = read_bounded(fd, MAX_PROC_FILE)?;
        String::from_utf8(raw).map_err(|_| io::Error::other(format!("/proc/{rel} is not UTF-8")))
    }

    /// Opens `/proc/<rel>` following its magic link (`<pid>/root`, `<pid>/ns/mnt`).
    pub fn open_link(&self, rel: &str, flags: OFlags) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            &self.fd,
            rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The hook's own pid as this procfs sees it (the host's pid namespace).
    pub fn self_pid(&self) -> io::Result<u32> {
        let link = rustix::fs::readlinkat(&self.fd, "self", Vec::new())?;
        link.to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other("/proc/self is not a pid"))
    }

    /// The parent pid of `pid` (`self` allowed) as this procfs sees it.
    pub fn parent_pid(&self, pid: &str) -> io::Result<u32> {
        let stat = self.read(&format!("{pid}/stat"))?;
        parse_stat_ppid(&stat)
            .ok_or_else(|| io::Error::other(format!("/proc/{pid}/stat: no parent pid")))
    }

    /// The identity of `pid`'s namespace of `kind` (`mnt`, `pid`, `cgroup`).
    pub fn ns_id(&self, pid: &str, kind: &str) -> io::Result<NsId> {
        let st = rustix::fs::statat(&self.fd, format!("{pid}/ns/{kind}"), AtFlags::empty())?;
        Ok(NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// The procfs directory fd itself (for `fchdir` when unmounting by fd).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

/// The 4th field of `/proc/<pid>/stat` (the comm field may hold spaces and `)`).
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
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
    fn ppid_survives_odd_command_names() {
        assert_eq!(
            parse_stat_ppid("18871 (hook) S 18868 18871 ..."),
            Some(18868)
        );
        assert_eq!(parse_stat_ppid("5 (a) b) c) R 42 5 5 0"), Some(42));
        assert_eq!(parse_stat_ppid("garbage"), None);
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
