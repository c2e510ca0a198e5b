//! Small fd-based file helpers shared by the readers and writers.

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{FileType, Stat};

/// Reads all of `fd`, failing when it holds more than `max` bytes. The buffer
/// is sized from `fstat` up front, so a regular file takes one `read` (plus the
/// one that sees end-of-file).
pub fn read_bounded(fd: OwnedFd, max: usize) -> io::Result<Vec<u8>> {
    let size = rustix::fs::fstat(&fd).map_or(0, |st| usize::try_from(st.st_size).unwrap_or(0));
    let mut file = std::fs::File::from(fd);
    let mut raw = Vec::with_capacity(size.min(max).max(4096) + 1);
    (&mut file).take(max as u64 + 1).read_to_end(&mut raw)?;
    if raw.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(raw)
}

/// The file type in a stat result.
pub fn file_type(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

/// The permission bits (including set-id and sticky) of a stat result.
pub fn mode_bits(stat: &Stat) -> u32 {
    stat.st_mode & 0o7777
}

/// Whether two stat results name the same inode.
pub fn same_inode(a: &Stat, b: &Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

/// `fstat` as an `io::Result`.
pub fn fstat(fd: impl AsFd) -> io::Result<Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

/// Whether `raw` is (at first glance) a JSON object: serde's derived structs
/// would also accept an array, positionally, which no OCI document is.
pub fn starts_json_object(raw: &[u8]) -> bool {
    raw.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// Sets the permission bits of the file `fd` names to exactly `mode`,
/// whatever the process umask was when it was created.
///
/// An fd opened for reading or writing takes `fchmod`. An `O_PATH` fd (a
/// device node, which the hook never opens for I/O) cannot, so the mode is
/// set through its `/proc/self/fd/<n>` link, resolved from `proc_dir`, the
/// hook's checked `/proc` fd: the link names the inode itself, never a path a
/// symlink could redirect.
pub fn set_mode(fd: impl AsFd, mode: u32, proc_dir: impl AsFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mode = rustix::fs::Mode::from_raw_mode(mode);
    match rustix::fs::fchmod(&fd, mode) {
        Err(rustix::io::Errno::BADF) => {
            let link = format!("self/fd/{}", fd.as_fd().as_raw_fd());
            Ok(rustix::fs::chmodat(
                proc_dir,
                link.as_str(),
                mode,
                rustix::fs::AtFlags::empty(),
            )?)
        }
        other => Ok(other?),
    }
}

/// What an atomic write promises beyond atomicity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The new content survives a crash: the temporary file is fsynced before
    /// the rename and the directory after it.
    SurvivesCrash,
    /// Readers see the old content or the new, never a torn file, while the
    /// machine runs; after a crash the file may be empty. For records that
    /// describe something a reboot ends (a binding names a live container),
    /// where an fsync would buy nothing and add a disk flush.
    WhileRunning,
}

/// Writes `name` in `dir` atomically: a temporary file (`O_EXCL`, mode 0644
/// set explicitly) is written, renamed over `name`, and, as `durability`
/// asks, fsynced with its directory.
pub fn write_atomic(
    dir: &OwnedFd,
    name: &str,
    content: &[u8],
    durability: Durability,
) -> io::Result<()> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let tmp = format!(".{name}.{}.tmp", std::process::id());
    let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let durable = durability == Durability::SurvivesCrash;
    let result = (|| -> io::Result<()> {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o644))?;
        let mut file = std::fs::File::from(fd);
        io::Write::write_all(&mut file, content)?;
        if durable {
            file.sync_all()?;
        }
        rustix::fs::renameat(dir, tmp.as_str(), dir, name)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    result?;
    if durable {
        rustix::fs::fsync(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rustix::fs::{Mode, OFlags};

    use super::*;
    use crate::testing::open_dir;

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = open_dir(t.path(), OFlags::RDONLY);
        write_atomic(&dir, "record.json", b"old", Durability::SurvivesCrash).expect("first");
        write_atomic(&dir, "record.json", b"new", Durability::SurvivesCrash).expect("second");
        assert_eq!(
            std::fs::read(t.path().join("record.json")).expect("read"),
            b"new"
        );
        let names: Vec<String> = std::fs::read_dir(t.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["record.json"], "a temporary file was left behind");
        let mode = std::fs::metadata(t.path().join("record.json"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o644);
    }

    #[test]
    fn a_failed_atomic_write_keeps_the_old_file_and_removes_the_temporary() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = open_dir(t.path(), OFlags::RDONLY);
        write_atomic(&dir, "record.json", b"old", Durability::SurvivesCrash).expect("first");
        // Renaming a file over a non-empty directory fails after the write.
        std::fs::create_dir(t.path().join("busy")).expect("dir");
        std::fs::write(t.path().join("busy/x"), b"").expect("file");
        assert!(write_atomic(&dir, "busy", b"new", Durability::SurvivesCrash).is_err());
        assert_eq!(
            std::fs::read(t.path().join("record.json")).expect("read"),
            b"old"
        );
        assert!(
            !std::fs::read_dir(t.path())
                .expect("list")
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".tmp")),
            "the temporary file was left behind"
        );
    }

    #[test]
    fn set_mode_works_on_path_only_fds_and_ignores_the_umask() {
        let t = tempfile::tempdir().expect("tempdir");
        let path = t.path().join("f");
        std::fs::write(&path, b"").expect("file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let proc_dir = rustix::fs::open(
            "/proc",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("/proc");
        let opath = rustix::fs::open(
            path.as_path(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("O_PATH");
        set_mode(&opath, 0o666, &proc_dir).expect("through /proc/self/fd");
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o7777;
        assert_eq!(mode(&path), 0o666);
        let rw = rustix::fs::open(
            path.as_path(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open");
        set_mode(&rw, 0o640, &proc_dir).expect("fchmod");
        assert_eq!(mode(&path), 0o640);
    }
}
