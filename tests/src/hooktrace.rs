//! Proof that the hook under test ran in a container, for the security tests:
//! a check that "nothing bad happened" means something only once the code
//! under test is known to have run in that very container.
//!
//! The hook leaves one of two traces, and [`Probe::trace`] reads them:
//! - **bound**: its binding record (`<state_dir>/alloc/<id>/binding.json`)
//!   names this container. The poststop hook removes the record, so a static
//!   witness registered right after the hook, at the same stage, copies it
//!   away while it exists ([`witness`]); the witness runs only if the hook
//!   succeeded (a runtime stops at the first failing hook).
//! - **refused**: its one stderr line, `tessera-hook: <what>: <why>`, which
//!   runc puts into its error (`… stderr: tessera-hook: …`) and crun writes to
//!   the file the `run.oci.hooks.stderr` annotation names.
//!
//! [`HookUnderTest::Naive`] puts a deliberately naive hook in the hook's
//! place — the test of the tests: it leaves the same binding trace, but it
//! follows rootfs symlinks with plain paths and is dynamically linked, so the
//! hostile-rootfs and NVIDIAScape checks must report it.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::Value;
use tessera_test_support::oci::{Bundle, HookEntry, RunOutcome, Runtime, unique_id};

use crate::hookenv::{ALLOC_ID, HOOK_ENV, HookFixture, c_helper};

/// The crun annotation naming the file that receives every hook's stderr.
pub const CRUN_HOOKS_STDERR: &str = "run.oci.hooks.stderr";

/// Which program runs where `tessera-hook` belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookUnderTest {
    /// The static `tessera-hook`.
    Tessera,
    /// [`naive_hook`]: what the checks must catch.
    Naive,
}

impl std::fmt::Display for HookUnderTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HookUnderTest::Tessera => "tessera-hook",
            HookUnderTest::Naive => "naive hook",
        })
    }
}

impl HookUnderTest {
    /// The hook entry for `verb` (`prestart` or `poststop`), with an explicit
    /// env as Tessera's specs carry.
    pub fn entry(self, fx: &HookFixture, verb: &str) -> Result<HookEntry> {
        Ok(match self {
            HookUnderTest::Tessera => fx.hook_entry(verb),
            HookUnderTest::Naive => HookEntry {
                path: naive_hook()?,
                args: naive_args(fx, verb),
                env: Some(vec![HOOK_ENV.to_owned()]),
            },
        })
    }
}

/// The naive hook's argv: the verb, the state directory, the allocation id,
/// then what to put into the container (`file:<host>:<container path>`,
/// `node:<major>:<minor>:<container path>`).
pub fn naive_args(fx: &HookFixture, verb: &str) -> Vec<String> {
    let mut args = vec![
        "naive-hook".to_owned(),
        verb.to_owned(),
        fx.state_dir.display().to_string(),
        ALLOC_ID.to_owned(),
    ];
    for (host, container, _) in &fx.mounted_files {
        args.push(format!("file:{}:{container}", host.display()));
    }
    for node in &fx.granted {
        args.push(format!("node:{}:{}:{}", node.major, node.minor, node.path));
    }
    args
}

/// A deliberately naive hook, dynamically linked: it reads the OCI state,
/// takes `<bundle>/rootfs` as the container's root, creates the parents of
/// each target with `mkdir`, copies each file with `open(O_CREAT|O_TRUNC)`
/// and makes each node with `mknod` — all on plain paths, so every symlink in
/// the image is followed (CVE-2024-0132) — and then writes a binding record
/// naming the container, the trace the tests look for. `poststop` removes
/// the record. It never fails.
pub fn naive_hook() -> Result<PathBuf> {
    c_helper("naive-hook", NAIVE_HOOK_C, &["-O2"])
}

const NAIVE_HOOK_C: &str = r#"#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static char state[65536];

/* The string value of "key" in the state (no escapes in ids and paths). */
static int json_str(const char *key, char *out, size_t n) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  const char *p = strstr(state, pat);
  if (!p) return -1;
  p = strchr(p + strlen(pat), '"');
  if (!p) return -1;
  const char *e = strchr(++p, '"');
  if (!e || (size_t)(e - p) >= n) return -1;
  memcpy(out, p, e - p);
  out[e - p] = 0;
  return 0;
}

static void mkparents(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p == '/') { *p = 0; mkdir(path, 0755); *p = '/'; }
  }
}

static void copy(const char *from, const char *to) {
  char buf[4096];
  ssize_t r;
  int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (in >= 0 && out >= 0)
    while ((r = read(in, buf, sizeof buf)) > 0) (void)!write(out, buf, r);
  if (in >= 0) close(in);
  if (out >= 0) close(out);
}

int main(int argc, char **argv) {
  size_t len = 0;
  ssize_t r;
  while (len < sizeof state - 1 && (r = read(0, state + len, sizeof state - 1 - len)) > 0) len += r;
  state[len] = 0;
  char id[512], bundle[4096], path[8192];
  if (argc < 4 || json_str("id", id, sizeof id) || json_str("bundle", bundle, sizeof bundle)) return 0;
  snprintf(path, sizeof path, "%s/alloc/%s/binding.json", argv[2], argv[3]);
  if (strcmp(argv[1], "poststop") == 0) { unlink(path); return 0; }
  for (int i = 4; i < argc; i++) {
    char spec[4096], target[8192];
    snprintf(spec, sizeof spec, "%s", argv[i]);
    if (strncmp(spec, "file:", 5) == 0) {
      char *host = spec + 5, *in = strchr(host, ':');
      if (!in) continue;
      *in++ = 0;
      snprintf(target, sizeof target, "%s/rootfs%s", bundle, in);
      mkparents(target);
      copy(host, target);
    } else if (strncmp(spec, "node:", 5) == 0) {
      unsigned maj, min;
      char in[4096];
      if (sscanf(spec + 5, "%u:%u:%4095s", &maj, &min, in) != 3) continue;
      snprintf(target, sizeof target, "%s/rootfs%s", bundle, in);
      mkparents(target);
      mknod(target, S_IFCHR | 0666, makedev(maj, min));
    }
  }
  mkparents(path);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "{\"allocId\": \"%s\", \"containerId\": \"%s\", \"bundle\": \"%s\", \"mode\": \"naive\"}\n",
            argv[3], id, bundle);
    fclose(f);
  }
  return 0;
}
"#;

/// A static program that drains its stdin (the OCI state) and copies the file
/// `argv[1]` to `argv[2]` if it exists: the witness of the binding record.
pub fn witness() -> Result<PathBuf> {
    c_helper(
        "witness",
        "#include <fcntl.h>\n#include <unistd.h>\n\
         int main(int argc, char **argv) {\n\
           char buf[4096]; ssize_t r;\n\
           while (read(0, buf, sizeof buf) > 0) {}\n\
           if (argc < 3) return 0;\n\
           int in = open(argv[1], O_RDONLY);\n\
           if (in < 0) return 0;\n\
           int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);\n\
           while (out >= 0 && (r = read(in, buf, sizeof buf)) > 0) (void)!write(out, buf, r);\n\
           return 0;\n}\n",
        &["-static", "-O2"],
    )
}

/// What the hook under test left about one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trace {
    /// Its binding record names the container; `mode` as recorded
    /// (`legacy`, `cdi`, or `naive` for the naive hook).
    Bound {
        /// The record's `mode`.
        mode: String,
    },
    /// It refused the container with this line (from `tessera-hook: ` on).
    Refused {
        /// The hook's stderr line.
        line: String,
    },
}

impl std::fmt::Display for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trace::Bound { mode } => write!(f, "bound ({mode})"),
            Trace::Refused { line } => write!(f, "refused: {line}"),
        }
    }
}

/// One container's trace files: the witness copy of the binding record and
/// crun's hook stderr file, under a fresh container id per run.
#[derive(Debug)]
pub struct Probe {
    container_id: String,
    record: PathBuf,
    copy: PathBuf,
    hook_stderr: PathBuf,
}

impl Probe {
    /// Trace files for a container of `fx` under `dir`, named by `tag`.
    pub fn new(fx: &HookFixture, dir: &Path, tag: &str) -> Self {
        Probe {
            container_id: unique_id(tag),
            record: fx.binding_dir(ALLOC_ID).join("binding.json"),
            copy: dir.join(format!("{tag}.binding-witness.json")),
            hook_stderr: dir.join(format!("{tag}.hooks-stderr")),
        }
    }

    /// The id the container must be run under ([`tessera_test_support::oci::run_bundle_as`]).
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The witness entry: append it at the hook's stage right after the hook.
    pub fn witness_entry(&self) -> Result<HookEntry> {
        Ok(HookEntry {
            path: witness()?,
            args: vec![
                "witness".to_owned(),
                self.record.display().to_string(),
                self.copy.display().to_string(),
            ],
            env: Some(vec![]),
        })
    }

    /// Adds the crun hook-stderr annotation to `bundle`.
    pub fn annotate(&self, bundle: &mut Bundle) {
        bundle.annotate(CRUN_HOOKS_STDERR, &self.hook_stderr.display().to_string());
    }

    /// Readies the probe for another run of the same bundle: a new container
    /// id, the trace files of the last run gone.
    pub fn next_run(&mut self, tag: &str) {
        self.container_id = unique_id(tag);
        self.clear();
    }

    /// Removes the trace files.
    pub fn clear(&self) {
        let _ = fs::remove_file(&self.copy);
        let _ = fs::remove_file(&self.hook_stderr);
    }

    /// What the hook left about this container in `outcome`, if anything.
    pub fn trace(&self, runtime: Runtime, outcome: &RunOutcome) -> Option<Trace> {
        if let Some(record) = fs::read(&self.copy)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .filter(|r| r["containerId"] == self.container_id.as_str())
        {
            return Some(Trace::Bound {
                mode: record["mode"].as_str().unwrap_or_default().to_owned(),
            });
        }
        let text = match runtime {
            Runtime::Runc => outcome.create_error.clone().unwrap_or_default(),
            Runtime::Crun => fs::read_to_string(&self.hook_stderr).unwrap_or_default(),
        };
        hook_line(&text).map(|line| Trace::Refused { line })
    }
}

/// The hook's own error line in `text`, from `tessera-hook: ` on: the last
/// such line that is not a log line (`tessera-hook: warning: …`). The line
/// must be the hook's own stderr: `tessera-hook: ` opens the line (crun's
/// hook-stderr file, or a later line of the hook's stderr in runc's quote) or
/// follows runc's `stderr: ` wrapper (`… exit status 1, stdout: , stderr:
/// tessera-hook: …`). A runtime's own error that merely names the binary
/// (`fork/exec …/tessera-hook: no such file or directory`) is not the hook's.
/// runc quotes the hook's stderr with newlines escaped as `\n`.
pub fn hook_line(text: &str) -> Option<String> {
    const PREFIX: &str = "tessera-hook: ";
    const RUNC_STDERR: &str = "stderr: ";
    const LOG_LEVELS: [&str; 4] = ["error: ", "warning: ", "info: ", "debug: "];
    text.split('\n')
        .flat_map(|l| l.split("\\n"))
        .filter_map(|l| {
            let l = l.trim_start();
            let line = if l.starts_with(PREFIX) {
                l
            } else {
                let at = l.find(&format!("{RUNC_STDERR}{PREFIX}"))?;
                &l[at + RUNC_STDERR.len()..]
            };
            let line = line.split('"').next().unwrap_or(line);
            let message = &line[PREFIX.len()..];
            (!LOG_LEVELS.iter().any(|level| message.starts_with(level))).then(|| line.to_owned())
        })
        .last()
}

#[cfg(test)]
mod tests {
    use super::hook_line;

    #[test]
    fn the_hooks_own_line_is_found_in_runcs_wrapper_and_crun_stderr() {
        let runc = r#"time="x" level=error msg="runc create failed: unable to start container process: error during container init: error running hook #1: error running hook: exit status 1, stdout: , stderr: tessera-hook: warning: slow\ntessera-hook: rootfs /etc: is a symlink""#;
        assert_eq!(
            hook_line(runc).as_deref(),
            Some("tessera-hook: rootfs /etc: is a symlink")
        );
        let runc_one = "error running hook: exit status 1, stdout: , stderr: tessera-hook: prestart /dev: refused";
        assert_eq!(
            hook_line(runc_one).as_deref(),
            Some("tessera-hook: prestart /dev: refused")
        );
        let crun = "tessera-hook: info: start\ntessera-hook: createContainer /usr/local/tessera: refused\n";
        assert_eq!(
            hook_line(crun).as_deref(),
            Some("tessera-hook: createContainer /usr/local/tessera: refused")
        );
    }

    #[test]
    fn a_runtimes_exec_error_naming_the_binary_is_not_a_refusal() {
        for text in [
            r#"level=error msg="error running hook #0: fork/exec /opt/tessera/bin/tessera-hook: no such file or directory, stdout: , stderr: ""#,
            "crun: error executing hook `/opt/tessera/bin/tessera-hook` (exit code: 127)",
            "exec /usr/bin/tessera-hook: permission denied",
        ] {
            assert_eq!(hook_line(text), None, "{text}");
        }
    }
}
