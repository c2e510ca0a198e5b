//! A hasher for the integer keys of the allocation tables (device
//! addresses, sizes): one multiply per word instead of SipHash, which keeps
//! `cuMemAlloc`/`cuMemFree` cheap. The keys come from this library, not
//! from an adversary, so flooding resistance buys nothing here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-rotate hashing of integer words.
#[derive(Debug, Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        // Device addresses are aligned: the low bits carry nothing, so mix
        // them up before the table takes its bucket from them.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 ^= self.0 >> 29;
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A `HashMap` with integer keys hashed by [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_keys_spread_over_buckets() {
        let mut low_bits = std::collections::HashSet::new();
        for i in 0..64u64 {
            let mut h = IntHasher::default();
            h.write_u64(0x2000_0000_0000 + i * (2 << 20));
            low_bits.insert(h.finish() & 63);
        }
        assert!(
            low_bits.len() > 32,
            "only {} of 64 buckets used",
            low_bits.len()
        );
    }
}
