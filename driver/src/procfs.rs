//! Parsers for the two `/proc` files discovery needs, and thin readers that find
//! them under a driver root.
//!
//! - `/proc/devices`: the character-device majors of `nvidia-frontend` (or
//!   `nvidia`), `nvidia-uvm` and `nvidia-caps`;
//! - `/proc/driver/nvidia-caps/mig-minors`: the minor of each MIG capability node
//!   (`gpu<minor>/gi<G>/access`, `gpu<minor>/gi<G>/ci<C>/access`, `config`, `monitor`).
//!
//! The parsers are pure functions over text; the path they take is only used in
//! error messages, which name the file and the line, e.g.
//! `/proc/driver/nvidia-caps/mig-minors line 7: expected "<cap> <minor>", found "gpu0/gi1/access"`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// `/proc/devices`, relative to the driver root.
pub const PROC_DEVICES: &str = "proc/devices";
/// `/proc/driver/nvidia-caps/mig-minors`, relative to the driver root.
pub const MIG_MINORS: &str = "proc/driver/nvidia-caps/mig-minors";

/// The longest offending text quoted in an error message.
const QUOTE_LIMIT: usize = 80;

/// Errors reading or parsing the `/proc` files.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// The file does not exist (the module that provides it is not loaded).
    #[error("{} does not exist", .path.display())]
    Missing {
        /// The file, under the driver root.
        path: PathBuf,
    },
    /// The file exists but could not be read.
    #[error("{}: {reason}", .path.display())]
    Read {
        /// The file, under the driver root.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// A line does not have the expected shape.
    #[error("{} line {line}: expected \"{expected}\", found {found:?}", .path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The expected shape, e.g. `<cap> <minor>`.
        expected: &'static str,
        /// The offending line (trimmed, shortened when long).
        found: String,
    },
    /// A number field is not a number.
    #[error("{} line {line}: {field} {found:?} is not a number", .path.display())]
    BadNumber {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Which field (`minor`, `major`).
        field: &'static str,
        /// The offending text.
        found: String,
    },
    /// A capability path that is not one of the known forms.
    #[error(
        "{} line {line}: unknown capability {found:?} (expected config, monitor, gpu<N>/gi<N>/access or gpu<N>/gi<N>/ci<N>/access)",
        .path.display()
    )]
    UnknownCapability {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The capability path.
        found: String,
    },
    /// The same capability appears twice.
    #[error("{} line {line}: duplicate capability {cap:?} (first on line {first})", .path.display())]
    DuplicateCapability {
        /// The file.
        path: PathBuf,
        /// 1-based line number of the repeat.
        line: usize,
        /// 1-based line number of the first occurrence.
        first: usize,
        /// The capability path.
        cap: String,
    },
}

/// Quotes at most [`QUOTE_LIMIT`] characters of an offending text.
fn quote(text: &str) -> String {
    if text.chars().count() <= QUOTE_LIMIT {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(QUOTE_LIMIT).collect();
        s.push('…');
        s
    }
}

/// Reads a file, telling a missing file from other failures.
fn read(path: &Path) -> Result<String, ProcError> {
    fs::read_to_string(path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ProcError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            ProcError::Read {
                path: path.to_path_buf(),
                reason: io_reason(&e),
            }
        }
    })
}

/// An I/O error's text without the `(os error N)` tail, e.g. `No such file or directory`.
pub(crate) fn io_reason(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    }
}

/// Character-device majors from `/proc/devices`, by driver name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcDevices {
    char_majors: BTreeMap<String, u32>,
}

impl ProcDevices {
    /// Parses the text of `/proc/devices`; `path` is only used in error messages.
    ///
    /// Lines `<major> <name>` are collected from the `Character devices:` section
    /// (also from lines before any section header); the `Block devices:` section and
    /// blank lines are skipped. When a name appears twice, the first major wins.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ProcError> {
        let mut char_majors = BTreeMap::new();
        let mut in_char = true;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            if line.ends_with(':') {
                in_char = line == "Character devices:";
                continue;
            }
            let (major, name) = two_fields(line, path, i + 1, "<major> <name>")?;
            let major = parse_number(major).ok_or_else(|| ProcError::BadNumber {
                path: path.to_path_buf(),
                line: i + 1,
                field: "major",
                found: quote(major),
            })?;
            if in_char {
                char_majors.entry(name.to_string()).or_insert(major);
            }
        }
        Ok(Self { char_majors })
    }

    /// Reads and parses `<root>/proc/devices`.
    pub fn read(root: &Path) -> Result<Self, ProcError> {
        let path = root.join(PROC_DEVICES);
        Self::parse(&read(&path)?, &path)
    }

    /// The character major registered under `name`.
    pub fn char_major(&self, name: &str) -> Option<u32> {
        self.char_majors.get(name).copied()
    }

    /// The major of the GPU nodes `/dev/nvidia<minor>` and `/dev/nvidiactl`:
    /// `nvidia-frontend` (multi-module drivers), else `nvidia`.
    pub fn nvidia(&self) -> Option<u32> {
        self.char_major("nvidia-frontend")
            .or_else(|| self.char_major("nvidia"))
    }

    /// The (dynamic) major of `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`.
    pub fn nvidia_uvm(&self) -> Option<u32> {
        self.char_major("nvidia-uvm")
    }

    /// The (dynamic) major of the MIG capability nodes `/dev/nvidia-caps/nvidia-cap<m>`.
    pub fn nvidia_caps(&self) -> Option<u32> {
        self.char_major("nvidia-caps")
    }
}

/// The two whitespace-separated fields of `line` (line `line_no` of `path`);
/// `Malformed`, naming the `expected` form, for any other number of fields.
fn two_fields<'a>(
    line: &'a str,
    path: &Path,
    line_no: usize,
    expected: &'static str,
) -> Result<(&'a str, &'a str), ProcError> {
    let mut fields = line.split_whitespace();
    match (fields.next(), fields.next(), fields.next()) {
        (Some(first), Some(second), None) => Ok((first, second)),
        _ => Err(ProcError::Malformed {
            path: path.to_path_buf(),
            line: line_no,
            expected,
            found: quote(line),
        }),
    }
}

/// A decimal number made of ASCII digits only (no sign, no spaces).
fn parse_number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// One capability path of `mig-minors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cap {
    Config,
    Monitor,
    Gi { gpu: u32, gi: u32 },
    Ci { gpu: u32, gi: u32, ci: u32 },
}

impl Cap {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "config" => return Some(Cap::Config),
            "monitor" => return Some(Cap::Monitor),
            _ => {}
        }
        let parts: Vec<&str> = text.split('/').collect();
        let num = |part: &str, prefix: &str| part.strip_prefix(prefix).and_then(parse_number);
        match parts.as_slice() {
            [gpu, gi, "access"] => Some(Cap::Gi {
                gpu: num(gpu, "gpu")?,
                gi: num(gi, "gi")?,
            }),
            [gpu, gi, ci, "access"] => Some(Cap::Ci {
                gpu: num(gpu, "gpu")?,
                gi: num(gi, "gi")?,
                ci: num(ci, "ci")?,
            }),
            _ => None,
        }
    }
}

/// The minors of the MIG capability nodes, from `/proc/driver/nvidia-caps/mig-minors`.
///
/// GPUs are keyed by their **minor** number (`gpu<minor>` in the file), not their
/// NVML index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors {
    config: Option<u32>,
    monitor: Option<u32>,
    gi: BTreeMap<(u32, u32), u32>,
    ci: BTreeMap<(u32, u32, u32), u32>,
}

impl MigMinors {
    /// Parses the text of `mig-minors`; `path` is only used in error messages.
    ///
    /// Every non-blank line must be `<cap> <minor>` with a known capability path
    /// (`config`, `monitor`, `gpu<g>/gi<i>/access`, `gpu<g>/gi<i>/ci<c>/access`);
    /// a capability may appear only once.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ProcError> {
        let mut out = Self::default();
        let mut first_seen: BTreeMap<Cap, usize> = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let (cap_text, minor) = two_fields(line, path, line_no, "<cap> <minor>")?;
            let cap = Cap::parse(cap_text).ok_or_else(|| ProcError::UnknownCapability {
                path: path.to_path_buf(),
                line: line_no,
                found: quote(cap_text),
            })?;
            let minor = parse_number(minor).ok_or_else(|| ProcError::BadNumber {
                path: path.to_path_buf(),
                line: line_no,
                field: "minor",
                found: quote(minor),
            })?;
            if let Some(&first) = first_seen.get(&cap) {
                return Err(ProcError::DuplicateCapability {
                    path: path.to_path_buf(),
                    line: line_no,
                    first,
                    cap: quote(cap_text),
                });
            }
            first_seen.insert(cap, line_no);
            match cap {
                Cap::Config => out.config = Some(minor),
                Cap::Monitor => out.monitor = Some(minor),
                Cap::Gi { gpu, gi } => {
                    out.gi.insert((gpu, gi), minor);
                }
                Cap::Ci { gpu, gi, ci } => {
                    out.ci.insert((gpu, gi, ci), minor);
                }
            }
        }
        Ok(out)
    }

    /// Reads and parses `<root>/proc/driver/nvidia-caps/mig-minors`.
    pub fn read(root: &Path) -> Result<Self, ProcError> {
        let path = root.join(MIG_MINORS);
        Self::parse(&read(&path)?, &path)
    }

    /// Minor of `gpu<gpu_minor>/gi<gi>/access`.
    pub fn gi_access(&self, gpu_minor: u32, gi: u32) -> Option<u32> {
        self.gi.get(&(gpu_minor, gi)).copied()
    }

    /// Minor of `gpu<gpu_minor>/gi<gi>/ci<ci>/access`.
    pub fn ci_access(&self, gpu_minor: u32, gi: u32, ci: u32) -> Option<u32> {
        self.ci.get(&(gpu_minor, gi, ci)).copied()
    }

    /// Minor of `config` (the capability to create and destroy instances).
    pub fn config(&self) -> Option<u32> {
        self.config
    }

    /// Minor of `monitor`.
    pub fn monitor(&self) -> Option<u32> {
        self.monitor
    }

    /// Number of capability lines parsed.
    pub fn len(&self) -> usize {
        usize::from(self.config.is_some())
            + usize::from(self.monitor.is_some())
            + self.gi.len()
            + self.ci.len()
    }

    /// True when the file named no capability at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIG_MINORS_PATH: &str = "/proc/driver/nvidia-caps/mig-minors";

    fn minors(text: &str) -> Result<MigMinors, ProcError> {
        MigMinors::parse(text, Path::new(MIG_MINORS_PATH))
    }

    fn devices(text: &str) -> Result<ProcDevices, ProcError> {
        ProcDevices::parse(text, Path::new("/proc/devices"))
    }

    const REAL_PROC_DEVICES: &str = "Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  5 /dev/tty
 10 misc
195 nvidia-frontend
226 drm
236 nvidia-nvswitch
237 nvidia-nvlink
238 nvidia-caps
239 nvidia-caps-imex-channels
505 nvidia-uvm

Block devices:
  8 sd
259 blkext
";

    #[test]
    fn proc_devices_finds_the_nvidia_majors() {
        let d = devices(REAL_PROC_DEVICES).unwrap();
        assert_eq!(d.nvidia(), Some(195));
        assert_eq!(d.nvidia_uvm(), Some(505));
        assert_eq!(d.nvidia_caps(), Some(238));
        assert_eq!(
            d.char_major("tty"),
            Some(4),
            "first major of a repeated name wins"
        );
        assert_eq!(
            d.char_major("sd"),
            None,
            "block devices are not character majors"
        );
    }

    #[test]
    fn proc_devices_falls_back_to_the_nvidia_name() {
        let d = devices("Character devices:\n195 nvidia\n508 nvidia-caps\n").unwrap();
        assert_eq!(d.nvidia(), Some(195));
        assert_eq!(d.nvidia_caps(), Some(508));
        assert_eq!(d.nvidia_uvm(), None);
    }

    #[test]
    fn proc_devices_malformed_lines_name_file_and_line() {
        let err = devices("Character devices:\n  1 mem\n195\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"/proc/devices line 3: expected "<major> <name>", found "195""#
        );
        let err = devices("Character devices:\nx nvidia\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"/proc/devices line 2: major "x" is not a number"#
        );
        let err = devices("Character devices:\n1 mem extra\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"/proc/devices line 2: expected "<major> <name>", found "1 mem extra""#
        );
    }

    #[test]
    fn mig_minors_parses_every_capability_form() {
        let m = minors(
            "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\n\
             gpu1/gi7/access 120\ngpu1/gi7/ci0/access 121\n",
        )
        .unwrap();
        assert_eq!(m.config(), Some(1));
        assert_eq!(m.monitor(), Some(2));
        assert_eq!(m.gi_access(0, 0), Some(3));
        assert_eq!(m.ci_access(0, 0, 0), Some(4));
        assert_eq!(m.gi_access(1, 7), Some(120));
        assert_eq!(m.ci_access(1, 7, 0), Some(121));
        assert_eq!(m.gi_access(1, 8), None);
        assert_eq!(m.ci_access(0, 0, 1), None);
        assert_eq!(m.len(), 6);
        assert!(minors("\n\n").unwrap().is_empty());
    }

    #[test]
    fn mig_minors_missing_minor_is_reported_like_the_style_guide_says() {
        let text = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\
                    gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi1/access\n";
        let err = minors(text).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"/proc/driver/nvidia-caps/mig-minors line 7: expected "<cap> <minor>", found "gpu0/gi1/access""#
        );
    }

    #[test]
    fn mig_minors_each_malformed_form_has_its_message() {
        let cases = [
            (
                "config 1 2\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 1: expected "<cap> <minor>", found "config 1 2""#,
            ),
            (
                "config 1\nmonitor two\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 2: minor "two" is not a number"#,
            ),
            (
                "config -1\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 1: minor "-1" is not a number"#,
            ),
            (
                "gpu0/gi0/access 99999999999\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 1: minor "99999999999" is not a number"#,
            ),
            (
                "\n\nfabric-imex-mgmt 1\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 3: unknown capability "fabric-imex-mgmt" (expected config, monitor, gpu<N>/gi<N>/access or gpu<N>/gi<N>/ci<N>/access)"#,
            ),
            (
                "gpu0/gi/access 3\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 1: unknown capability "gpu0/gi/access" (expected config, monitor, gpu<N>/gi<N>/access or gpu<N>/gi<N>/ci<N>/access)"#,
            ),
            (
                "gpu0/gi0/ci0/read 3\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 1: unknown capability "gpu0/gi0/ci0/read" (expected config, monitor, gpu<N>/gi<N>/access or gpu<N>/gi<N>/ci<N>/access)"#,
            ),
            (
                "gpu0/gi0/access 3\nconfig 1\ngpu0/gi0/access 5\n",
                r#"/proc/driver/nvidia-caps/mig-minors line 3: duplicate capability "gpu0/gi0/access" (first on line 1)"#,
            ),
        ];
        for (text, want) in cases {
            let err = minors(text).expect_err(text);
            assert_eq!(err.to_string(), want, "input {text:?}");
        }
    }

    #[test]
    fn long_offending_lines_are_shortened_in_messages() {
        let long = "x".repeat(500);
        let err = minors(&long).unwrap_err().to_string();
        assert!(err.len() < 200, "{err}");
        assert!(err.contains('…'), "{err}");
    }

    #[test]
    fn readers_name_the_real_path_under_the_root() {
        let root = tempfile::tempdir().unwrap();
        let err = MigMinors::read(root.path()).unwrap_err();
        let want = root.path().join(MIG_MINORS);
        assert!(
            matches!(&err, ProcError::Missing { path } if *path == want),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("{} does not exist", want.display())
        );

        fs::create_dir_all(want.parent().unwrap()).unwrap();
        fs::write(&want, "config 1\ngpu0/gi1/access\n").unwrap();
        let err = MigMinors::read(root.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                r#"{} line 2: expected "<cap> <minor>", found "gpu0/gi1/access""#,
                want.display()
            )
        );

        let err = ProcDevices::read(root.path()).unwrap_err();
        assert!(matches!(err, ProcError::Missing { .. }), "{err:?}");
    }

    #[test]
    fn io_reason_drops_the_os_error_tail() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(io_reason(&e), "No such file or directory");
    }

    proptest! {
        #[test]
        fn parsers_never_panic(text in any::<String>()) {
            let _ = minors(&text);
            let _ = devices(&text);
        }

        #[test]
        fn parsers_never_panic_on_near_miss_lines(
            lines in proptest::collection::vec(
                "(config|monitor|gpu[0-9]{0,3}(/gi[0-9]{0,3})?(/ci[0-9]{0,3})?/access|Character devices:|[0-9]{1,4})( [0-9a-z-]{0,12}){0,3}",
                0..12,
            )
        ) {
            let text = lines.join("\n");
            let _ = minors(&text);
            let _ = devices(&text);
        }
    }
}
