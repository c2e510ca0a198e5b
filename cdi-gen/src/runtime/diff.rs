//! A unified diff of two texts (what `--dry-run` prints), three lines of
//! context, from a longest-common-subsequence of lines. Config files are a
//! few hundred lines; larger inputs fall back to "replace everything".

/// Above this many cells the LCS table is not built.
const MAX_CELLS: usize = 4_000_000;

/// Lines of context around each change.
const CONTEXT: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Keep,
    Delete,
    Insert,
}

/// The unified diff turning `old` into `new`, with `---`/`+++` headers
/// naming `old_label` and `new_label`; empty when the texts are equal.
pub fn unified(old: &str, new: &str, old_label: &str, new_label: &str) -> String {
    if old == new {
        return String::new();
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let ops = script(&a, &b);
    let mut out = format!("--- {old_label}\n+++ {new_label}\n");
    // Positions (index into ops) of changes, grouped into hunks whose
    // changes are at most 2 * CONTEXT unchanged lines apart.
    let changes: Vec<usize> = (0..ops.len()).filter(|&i| ops[i] != Op::Keep).collect();
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for &i in &changes {
        match groups.last_mut() {
            Some((_, end)) if i - *end <= 2 * CONTEXT + 1 => *end = i,
            _ => groups.push((i, i)),
        }
    }
    // Line numbers before each op.
    let mut pos = Vec::with_capacity(ops.len() + 1);
    let (mut ia, mut ib) = (0usize, 0usize);
    for op in &ops {
        pos.push((ia, ib));
        match op {
            Op::Keep => {
                ia += 1;
                ib += 1;
            }
            Op::Delete => ia += 1,
            Op::Insert => ib += 1,
        }
    }
    pos.push((ia, ib));
    for (first, last) in groups {
        let start = first.saturating_sub(CONTEXT);
        let end = (last + CONTEXT + 1).min(ops.len());
        let (sa, sb) = pos[start];
        let (ea, eb) = pos[end];
        let range = |s: usize, n: usize| {
            if n == 0 {
                format!("{s},0")
            } else if n == 1 {
                format!("{}", s + 1)
            } else {
                format!("{},{n}", s + 1)
            }
        };
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            range(sa, ea - sa),
            range(sb, eb - sb)
        ));
        for (k, op) in ops.iter().enumerate().take(end).skip(start) {
            let (la, lb) = pos[k];
            match op {
                Op::Keep => out.push_str(&format!(" {}\n", a[la])),
                Op::Delete => out.push_str(&format!("-{}\n", a[la])),
                Op::Insert => out.push_str(&format!("+{}\n", b[lb])),
            }
        }
    }
    out
}

/// The edit script from `a` to `b`: deletions before insertions at each
/// point of difference.
fn script(a: &[&str], b: &[&str]) -> Vec<Op> {
    let (n, m) = (a.len(), b.len());
    if n.saturating_mul(m) > MAX_CELLS {
        let mut ops = vec![Op::Delete; n];
        ops.extend(std::iter::repeat_n(Op::Insert, m));
        return ops;
    }
    // lcs[i][j]: length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push(Op::Keep);
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(Op::Delete);
            i += 1;
        } else {
            ops.push(Op::Insert);
            j += 1;
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_changed_line_gives_one_hunk_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\n";
        let diff = unified(old, new, "a/x", "b/x");
        assert_eq!(
            diff,
            "--- a/x\n+++ b/x\n@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
        );
    }

    #[test]
    fn a_new_file_diffs_from_nothing() {
        let diff = unified("", "x\ny\n", "/dev/null", "b/new");
        assert_eq!(diff, "--- /dev/null\n+++ b/new\n@@ -0,0 +1,2 @@\n+x\n+y\n");
    }

    #[test]
    fn equal_texts_give_no_diff() {
        assert_eq!(unified("a\n", "a\n", "x", "y"), "");
    }

    #[test]
    fn far_apart_changes_give_two_hunks() {
        let old: String = (0..30).map(|i| format!("line{i}\n")).collect();
        let new = old
            .replace("line3\n", "three\n")
            .replace("line25\n", "twenty-five\n");
        let diff = unified(&old, &new, "a", "b");
        assert_eq!(diff.matches("@@ -").count(), 2, "{diff}");
        assert!(diff.contains("-line3\n+three\n"), "{diff}");
        assert!(diff.contains("-line25\n+twenty-five\n"), "{diff}");
    }
}
