//! The `/proc/<pid>` text formats several components read, parsed once, and
//! the one rule for "is this process still there".
//!
//! Pure functions over the text; the callers read the files (each through its
//! own trusted `/proc` handle). The kernel documents both formats in proc(5).

/// The fields taken from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3, the state letter (`R`, `S`, `D`, `Z`, `X`, …).
    pub state: u8,
    /// Field 22, `starttime`, in clock ticks since boot: with the pid, it names
    /// one process for the life of the machine.
    pub start_time: u64,
}

impl Stat {
    /// The liveness rule: a zombie (`Z`) or a dead task (`X`, `x`) is gone.
    /// A zombie has closed its files, so the driver has released its contexts
    /// and its memory: for GPU accounting it no longer exists.
    pub fn is_live(&self) -> bool {
        !matches!(self.state, b'Z' | b'X' | b'x')
    }

    /// Whether this is a live process that started at `start_time`
    /// (0: the start time is not checked).
    pub fn is_live_since(&self, start_time: u64) -> bool {
        self.is_live() && (start_time == 0 || self.start_time == start_time)
    }
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &[u8]) -> Option<Stat> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Fields 4..=21 (18 of them) lie between the state and the start time.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_time })
}

/// The fields taken from `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// `Pid:`, in the pid namespace of the `/proc` it was read from.
    pub pid: u32,
    /// `PPid:`.
    pub ppid: u32,
    /// `NSpid:`, outermost namespace first, the process's own namespace last.
    pub nspid: Vec<u32>,
}

/// Parses the `Pid:`, `PPid:` and `NSpid:` lines of `/proc/<pid>/status`.
pub fn parse_status(status: &str) -> Option<Status> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(Status {
        pid: field("Pid:")?,
        ppid: field("PPid:")?,
        nspid: parse_nspid(status)?,
    })
}

/// The pids of the `NSpid:` line of `/proc/<pid>/status`, outermost first.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<u32>> = line
        .split_ascii_whitespace()
        .map(|p| p.parse().ok())
        .collect();
    pids.filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shape of a 6.1 kernel's line, with a command name holding ") (".
    const STAT: &[u8] = b"4242 (a) (b c) S 1 4242 4242 0 -1 4194560 1035 0 0 0 2 1 0 0 20 0 1 0 987654 8404992 868 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        assert_eq!(
            parse_stat(STAT),
            Some(Stat {
                state: b'S',
                start_time: 987_654
            })
        );
    }

    #[test]
    fn truncated_or_garbled_stat_is_none() {
        assert_eq!(parse_stat(b"12 (x) S 1 2 3"), None);
        assert_eq!(parse_stat(b"no parenthesis at all"), None);
        assert_eq!(parse_stat(b"1 (x)"), None);
        let bad_start = String::from_utf8_lossy(STAT).replace("987654", "-5");
        assert_eq!(parse_stat(bad_start.as_bytes()), None);
    }

    #[test]
    fn zombies_and_dead_tasks_are_gone_sleepers_and_stopped_are_not() {
        let with = |state| Stat {
            state,
            start_time: 7,
        };
        for gone in [b'Z', b'X', b'x'] {
            assert!(!with(gone).is_live(), "{}", gone as char);
        }
        for live in [b'R', b'S', b'D', b'T', b't', b'I'] {
            assert!(with(live).is_live(), "{}", live as char);
        }
        assert!(with(b'S').is_live_since(0));
        assert!(with(b'S').is_live_since(7));
        assert!(
            !with(b'S').is_live_since(8),
            "a reused pid is another process"
        );
        assert!(!with(b'Z').is_live_since(7));
    }

    #[test]
    fn status_takes_pid_ppid_and_the_namespace_pids() {
        let status = "Name:\tsh\nTgid:\t12765\nPid:\t12765\nPPid:\t12725\nNSpid:\t12765\t29\n";
        assert_eq!(
            parse_status(status),
            Some(Status {
                pid: 12765,
                ppid: 12725,
                nspid: vec![12765, 29]
            })
        );
        assert_eq!(parse_status("Pid:\t1\nNSpid:\t1\n"), None, "no PPid");
        assert_eq!(parse_status("Pid:\tx\nPPid:\t0\nNSpid:\t1\n"), None);
        assert_eq!(parse_nspid("NSpid:\t7\n"), Some(vec![7]));
        assert_eq!(parse_nspid("NSpid:\n"), None);
        assert_eq!(parse_nspid("NSpid:\tx 1\n"), None);
    }
}
