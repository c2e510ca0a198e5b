//! Deterministic UUIDs for simulated GPUs and MIG devices.
//!
//! A UUID here is 128 bits derived from a text key: FNV-1a (64 bit) of the key,
//! then two splitmix64 steps. Same key, same UUID, on every machine and every
//! run, so golden tests and demos are stable. Not a cryptographic hash, and it
//! need not be: the keys are ours.

/// FNV-1a, 64 bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One splitmix64 step: advances `state` and returns the next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `<prefix>-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` derived from `key`.
pub fn uuid_from_key(prefix: &str, key: &str) -> String {
    let mut state = fnv1a64(key.as_bytes());
    let hi = splitmix64(&mut state);
    let lo = splitmix64(&mut state);
    format!(
        "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// The UUID of GPU `index` (model `model`) in the node profile `profile`.
pub fn gpu_uuid(profile: &str, index: u32, model: &str) -> String {
    uuid_from_key("GPU", &format!("tessera-sim/{profile}/gpu{index}/{model}"))
}

/// The UUID of compute instance `ci` of GPU instance `gi` on the GPU `gpu_uuid`,
/// the `serial`-th MIG device the node ever made.
pub fn mig_uuid(gpu_uuid: &str, gi: u32, ci: u32, serial: u64) -> String {
    uuid_from_key("MIG", &format!("{gpu_uuid}/gi{gi}/ci{ci}/{serial}"))
}

/// Whether `s` is `<prefix>-` followed by a canonical lower-case 8-4-4-4-12 UUID.
pub fn is_uuid(prefix: &str, s: &str) -> bool {
    let Some(rest) = s.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn uuids_are_well_formed_stable_and_distinct() {
        let a = gpu_uuid("demo", 0, "H100-80GB");
        assert!(is_uuid("GPU", &a), "{a}");
        assert_eq!(a, gpu_uuid("demo", 0, "H100-80GB"));
        assert_ne!(a, gpu_uuid("demo", 1, "H100-80GB"));
        let m = mig_uuid(&a, 1, 0, 1);
        assert!(is_uuid("MIG", &m), "{m}");
        assert_ne!(m, mig_uuid(&a, 1, 0, 2));
    }
}
