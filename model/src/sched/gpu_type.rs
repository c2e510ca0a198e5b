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
    let _ = (written, product_name);
    todo!("tokenize both, drop a leading NVIDIA, find written's tokens as an adjacent run")
}
