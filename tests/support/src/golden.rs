//! Golden files: output compared byte for byte with a reviewed file.
//!
//! `TESSERA_BLESS=1` (any value but empty, `0` or `false`) rewrites the files
//! that differ instead, and [`Goldens::finish`] then fails naming them: a
//! blessing run is never a passing run — review the diff and rerun without it.

use std::fs;
use std::path::PathBuf;

/// The golden comparisons of one test, against files in one directory:
/// a mismatch fails at once; under `TESSERA_BLESS` differing files are
/// rewritten and [`Goldens::finish`] fails listing them.
pub struct Goldens {
    dir: PathBuf,
    bless: bool,
    rewritten: Vec<String>,
    checked: usize,
}

impl Goldens {
    /// Comparisons against the files in `dir` (usually
    /// `<crate>/tests/golden`), blessing when `TESSERA_BLESS` says so.
    pub fn new(dir: impl Into<PathBuf>) -> Goldens {
        Goldens {
            dir: dir.into(),
            bless: std::env::var("TESSERA_BLESS")
                .is_ok_and(|v| !v.is_empty() && v != "0" && v != "false"),
            rewritten: Vec::new(),
            checked: 0,
        }
    }

    /// Compares `actual` with the golden file `name`; panics naming the first
    /// differing line (and showing the whole output). Under `TESSERA_BLESS`,
    /// writes the file instead when it differs or is missing.
    pub fn check(&mut self, name: &str, actual: &str) {
        let path = self.dir.join(name);
        self.checked += 1;
        let expected = fs::read_to_string(&path);
        if self.bless {
            if expected.as_deref().ok() != Some(actual) {
                if let Some(parent) = path.parent() {
                    fs::create_dir_all(parent)
                        .unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
                }
                fs::write(&path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                self.rewritten.push(path.display().to_string());
            }
            return;
        }
        let expected = expected
            .unwrap_or_else(|e| panic!("{}: {e} (TESSERA_BLESS=1 writes it)", path.display()));
        if expected != actual {
            let first = expected
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(expected.lines().count().min(actual.lines().count()));
            panic!(
                "{name} differs from the golden file at line {}:\n  golden: {:?}\n  actual: {:?}\nwhole output:\n{actual}",
                first + 1,
                expected.lines().nth(first),
                actual.lines().nth(first)
            );
        }
    }

    /// Ends the test's comparisons: under `TESSERA_BLESS`, fails, since the
    /// run wrote files instead of testing.
    pub fn finish(self) {
        let list = if self.rewritten.is_empty() {
            String::new()
        } else {
            format!(": {}", self.rewritten.join(", "))
        };
        assert!(
            !self.bless,
            "TESSERA_BLESS is set, so this run wrote golden files instead of testing: \
             rewrote {} of {}{list}. Review the diff and rerun without TESSERA_BLESS.",
            self.rewritten.len(),
            self.checked,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_match_passes_and_a_mismatch_names_the_first_differing_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("out.txt"), "one\ntwo\nthree\n").expect("write");
        let mut goldens = Goldens {
            bless: false,
            ..Goldens::new(dir.path())
        };
        goldens.check("out.txt", "one\ntwo\nthree\n");
        let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            goldens.check("out.txt", "one\nTWO\nthree\n")
        }))
        .expect_err("a mismatch fails");
        let message = failure
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            message.contains("at line 2") && message.contains("\"TWO\""),
            "{message}"
        );
    }

    #[test]
    fn blessing_rewrites_what_differs_then_fails_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("same.txt"), "same\n").expect("write");
        let mut goldens = Goldens {
            bless: true,
            ..Goldens::new(dir.path())
        };
        goldens.check("same.txt", "same\n");
        goldens.check("sub/new.txt", "new\n");
        assert_eq!(
            fs::read_to_string(dir.path().join("sub/new.txt")).expect("written"),
            "new\n"
        );
        let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| goldens.finish()))
            .expect_err("a blessing run fails");
        let message = failure
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            message.contains("rewrote 1 of 2") && message.contains("new.txt"),
            "{message}"
        );
    }
}
