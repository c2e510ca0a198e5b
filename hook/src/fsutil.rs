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
