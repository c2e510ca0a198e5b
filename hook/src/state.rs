//! The OCI state the runtime writes to the hook's standard input.
//!
//! Only the fields the hook uses are kept; others (crun's `root`, future
//! additions) are ignored. The read is bounded: a runtime sends a few hundred
//! bytes, so anything over [`MAX_STATE_BYTES`] is not a state.

use std::io::Read;

use serde::Deserialize;

use crate::error::{HookError, Result, one_line};

/// The most bytes read from stdin.
pub const MAX_STATE_BYTES: usize = 64 * 1024;

/// The longest container id accepted (runtimes use 64 hex digits or short names).
pub const MAX_ID_LEN: usize = 1024;

/// The fields of the OCI state the hook relies on.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// OCI runtime spec version of the state.
    pub oci_version: String,
    /// Container id.
    pub id: String,
    /// `creating`, `created`, `running` or `stopped`.
    #[serde(default)]
    pub status: Option<String>,
    /// The container's init process as the runtime sees it: a host pid in
    /// `prestart`/`createRuntime`; 1 (runc) or 0 (crun) in `createContainer`;
    /// absent or 0 in `poststop`.
    #[serde(default)]
    pub pid: Option<i64>,
    /// Absolute path of the bundle directory.
    pub bundle: String,
}

impl State {
    /// The pid, when the state names a positive one.
    pub fn pid(&self) -> Option<u32> {
        self.pid
            .filter(|p| *p > 0)
            .and_then(|p| u32::try_from(p).ok())
    }
}

/// Reads and parses the state from `input`, reading at most [`MAX_STATE_BYTES`] + 1 bytes.
pub fn read_state(input: impl Read) -> Result<State> {
    let mut raw = Vec::with_capacity(1024);
    input
        .take(MAX_STATE_BYTES as u64 + 1)
        .read_to_end(&mut raw)
        .map_err(|e| HookError::State(format!("reading stdin: {e}")))?;
    if raw.len() > MAX_STATE_BYTES {
        return Err(HookError::State(format!(
            "more than {MAX_STATE_BYTES} bytes; not an OCI state"
        )));
    }
    parse_state(&raw)
}

/// Parses a state document and checks the fields the hook relies on.
pub fn parse_state(raw: &[u8]) -> Result<State> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Err(HookError::State(
            "empty; the runtime passes the container state on stdin".to_owned(),
        ));
    }
    if !crate::fsutil::starts_json_object(raw) {
        return Err(HookError::State("not a JSON object".to_owned()));
    }
    let state: State =
        serde_json::from_slice(raw).map_err(|e| HookError::State(one_line(&e.to_string())))?;
    if state.id.is_empty() || state.id.len() > MAX_ID_LEN || state.id.contains(char::is_control) {
        return Err(HookError::State(format!(
            "container id {:?} is empty, longer than {MAX_ID_LEN} bytes, or has control characters",
            truncate(&state.id)
        )));
    }
    if !state.bundle.starts_with('/') || state.bundle.contains('\0') {
        return Err(HookError::State(format!(
            "bundle {:?} is not an absolute path",
            truncate(&state.bundle)
        )));
    }
    if let Some(pid) = state.pid
        && !(0..=i64::from(i32::MAX)).contains(&pid)
    {
        return Err(HookError::State(format!("pid {pid} is out of range")));
    }
    Ok(state)
}

/// The first 80 characters of `s`, for error lines.
pub(crate) fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_and_crun_states_parse() {
        let runc = br#"{"ociVersion":"1.0.2-dev","id":"t1","status":"creating","pid":18310,"bundle":"/tmp/b","annotations":{"a":"b"}}"#;
        let s = parse_state(runc).expect("runc state");
        assert_eq!(
            (s.id.as_str(), s.pid(), s.bundle.as_str()),
            ("t1", Some(18310), "/tmp/b")
        );
        let crun = br#"{"ociVersion":"1.0","id":"t2","pid":0,"root":"rootfs","bundle":"/tmp/b","status":"created"}"#;
        let s = parse_state(crun).expect("crun state with root");
        assert_eq!(s.pid(), None);
        let poststop =
            br#"{"ociVersion":"1.0.2-dev","id":"t1","status":"stopped","bundle":"/tmp/b"}"#;
        assert_eq!(parse_state(poststop).expect("no pid").pid(), None);
    }

    #[test]
    fn malformed_states_fail_with_one_line() {
        for (raw, expect) in [
            (&b""[..], "empty"),
            (b"   \n", "empty"),
            (b"not json", "not a JSON object"),
            (br#"["1","x",null,null,"/b"]"#, "not a JSON object"),
            (br#"{"ociVersion":"1","id":"x","bundle":"/b""#, "EOF"),
            (br#"{"ociVersion":"1","id":"x"}"#, "missing field `bundle`"),
            (
                br#"{"ociVersion":"1","id":"","bundle":"/b"}"#,
                "container id",
            ),
            (
                br#"{"ociVersion":"1","id":"x","bundle":"rel"}"#,
                "not an absolute path",
            ),
            (
                br#"{"ociVersion":"1","id":"x","bundle":"/b","pid":-5}"#,
                "out of range",
            ),
            (
                br#"{"ociVersion":"1","id":"x","bundle":"/b","pid":99999999999}"#,
                "out of range",
            ),
            (
                br#"{"ociVersion":"1","id":"a\nb","bundle":"/b"}"#,
                "control",
            ),
            (b"\xff\xfe", "not a JSON object"),
        ] {
            let e = parse_state(raw).expect_err(&String::from_utf8_lossy(raw));
            let line = e.to_string();
            assert!(line.contains(expect), "{line:?} lacks {expect:?}");
            assert!(!line.contains('\n'), "{line:?}");
            assert_eq!(e.exit_code(), crate::error::exit::INPUT);
        }
    }

    #[test]
    fn huge_input_is_cut_off() {
        let mut big = br#"{"ociVersion":"1","id":"x","bundle":"/b","pad":""#.to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_STATE_BYTES));
        big.extend(b"\"}");
        let e = read_state(&big[..]).expect_err("too big");
        assert!(e.to_string().contains("more than 65536 bytes"), "{e}");
        // Just under the limit is fine.
        let ok = br#"{"ociVersion":"1","id":"x","bundle":"/b"}"#;
        assert!(read_state(&ok[..]).is_ok());
    }
}
