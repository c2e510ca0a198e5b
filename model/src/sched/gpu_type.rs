//! The model-name rule: does a name a user or operator wrote (in
//! `migProfileAllowlist.models`, `nvidia.com/use-gputype`,
//! `nvidia.com/nouse-gputype`) match a GPU's product name as NVML reports it?
//!
//! Both sides are split into tokens at spaces, `-` and `_`, compared without
//! case, and a leading `NVIDIA` token is dropped from each. The written name
//! matches when its tokens appear, in order and adjacent, among the product
//! name's tokens: `A100-SXM4-40GB` and `A100` match `NVIDIA A100-SXM4-40GB`;
//! `H100` and `H100 80GB` match `NVIDIA H100 80GB HBM3`; `H200` matches
//! `NVIDIA H200 NVL`; `A30` does not match `NVIDIA A300` (whole tokens only).

/// True when `written` names the GPU model `product_name` (see the module rule).
pub fn matches(written: &str, product_name: &str) -> bool {
    specificity(written, product_name).is_some()
}

/// How specifically `written` names `product_name`: the number of tokens
/// matched, or `None` when it does not match. Where several allowlist entries
/// match one GPU, the most specific wins (`A100-SXM4-80GB` over `A100`).
pub fn specificity(written: &str, product_name: &str) -> Option<usize> {
    // Called for every allowlist entry of every MIG GPU of every node the
    // extender filters: tokens go into stack arrays, not vectors.
    let mut want_buf = [""; MAX_TOKENS];
    let mut have_buf = [""; MAX_TOKENS];
    let want = tokens(written, &mut want_buf)?;
    let have = tokens(product_name, &mut have_buf)?;
    if want.is_empty() || want.len() > have.len() {
        return None;
    }
    have.windows(want.len())
        .any(|run| run.iter().zip(want).all(|(h, w)| h.eq_ignore_ascii_case(w)))
        .then_some(want.len())
}

/// Most tokens a model name may have (real NVML names have at most 7).
const MAX_TOKENS: usize = 24;

/// The name's tokens: split at spaces, `-` and `_`, empty pieces dropped,
/// a leading `NVIDIA` dropped; `None` for a name of more than
/// [`MAX_TOKENS`] tokens (it matches nothing).
fn tokens<'n, 'b>(name: &'n str, buf: &'b mut [&'n str; MAX_TOKENS]) -> Option<&'b [&'n str]> {
    let mut len = 0;
    let mut first = true;
    for token in name.split([' ', '-', '_', '\t']).filter(|t| !t.is_empty()) {
        let leading_vendor = first && token.eq_ignore_ascii_case("NVIDIA");
        first = false;
        if leading_vendor {
            continue;
        }
        if len == MAX_TOKENS {
            return None;
        }
        buf[len] = token;
        len += 1;
    }
    Some(&buf[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Product names as NVML reports them.
    const A100_40: &str = "NVIDIA A100-SXM4-40GB";
    const A100_80: &str = "NVIDIA A100-SXM4-80GB";
    const A100_PCIE: &str = "NVIDIA A100 80GB PCIe";
    const H100: &str = "NVIDIA H100 80GB HBM3";
    const H100_NVL: &str = "NVIDIA H100 NVL";
    const H200: &str = "NVIDIA H200";
    const H200_NVL: &str = "NVIDIA H200 NVL";
    const A30: &str = "NVIDIA A30";
    const B200: &str = "NVIDIA B200";
    const RTX: &str = "NVIDIA RTX PRO 6000 Blackwell Server Edition";
    const ALL: [&str; 10] = [
        A100_40, A100_80, A100_PCIE, H100, H100_NVL, H200, H200_NVL, A30, B200, RTX,
    ];

    /// Which product names each written name matches, by hand.
    #[test]
    fn written_names_match_exactly_the_expected_products() {
        let cases: [(&str, &[&str]); 12] = [
            ("A100-SXM4-40GB", &[A100_40]),
            ("A100", &[A100_40, A100_80, A100_PCIE]),
            ("H100", &[H100, H100_NVL]),
            ("H200", &[H200, H200_NVL]),
            ("A30", &[A30]),
            ("B200", &[B200]),
            ("RTX PRO 6000 Blackwell Server Edition", &[RTX]),
            ("A100 80GB PCIe", &[A100_PCIE]),
            ("NVIDIA A100-SXM4-80GB", &[A100_80]),
            ("h100 80gb", &[H100]),
            ("H100_NVL", &[H100_NVL]),
            ("80GB", &[A100_80, A100_PCIE, H100]),
        ];
        for (written, expected) in cases {
            let matched: Vec<&str> = ALL
                .iter()
                .copied()
                .filter(|p| matches(written, p))
                .collect();
            assert_eq!(matched, expected, "{written:?}");
        }
    }

    #[test]
    fn near_misses_do_not_match() {
        for written in [
            "A3",
            "A300",
            "H10",
            "A100-SXM4",
            "SXM4-40",
            "40GB-A100",
            "H100 HBM3",
        ] {
            for product in [A30, H100] {
                if written == "H100 HBM3" && product == H100 {
                    // Tokens must be adjacent: 80GB sits between them.
                    assert!(!matches(written, product));
                    continue;
                }
                assert!(!matches(written, product), "{written:?} vs {product:?}");
            }
        }
        assert!(!matches("A300", "NVIDIA A30"));
        assert!(!matches("A30", "NVIDIA A300"));
        assert!(!matches("H10", H100));
        assert!(!matches("A3", A30));
    }

    #[test]
    fn blank_or_vendor_only_names_match_nothing() {
        for written in ["", "  ", "NVIDIA", "-", "nvidia "] {
            for product in ALL {
                assert!(!matches(written, product), "{written:?}");
            }
        }
    }

    #[test]
    fn specificity_counts_matched_tokens() {
        assert_eq!(specificity("A100", A100_40), Some(1));
        assert_eq!(specificity("A100-SXM4-40GB", A100_40), Some(3));
        assert_eq!(specificity("NVIDIA A100-SXM4-40GB", A100_40), Some(3));
        assert_eq!(specificity("H100 80GB", H100), Some(2));
        assert_eq!(specificity("A100-SXM4-80GB", A100_40), None);
    }

    #[test]
    fn a_name_of_too_many_tokens_matches_nothing() {
        let long = vec!["X"; 30].join(" ");
        assert_eq!(specificity(&long, &long), None);
        assert_eq!(specificity("A100", &format!("NVIDIA A100 {long}")), None);
        assert!(matches("A100", "NVIDIA A100 1 2 3 4 5 6 7 8 9 10"));
    }
}
