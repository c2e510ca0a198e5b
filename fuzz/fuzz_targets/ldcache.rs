//! The `ld.so.cache` reader and the ELF SONAME reader: a value or an error,
//! never a panic; whatever parses writes back to bytes that parse to the same
//! cache.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_hook::{elf, ldcache};

fuzz_target!(|data: &[u8]| {
    if let Ok(cache) = ldcache::parse(data) {
        let again = ldcache::parse(&cache.to_bytes()).expect("our own bytes parse");
        let mut sorted = cache.clone();
        sorted.sort();
        assert_eq!(again.entries.len(), sorted.entries.len());
        assert_eq!(again.hwcaps, cache.hwcaps);
    }
    if let Some(so) = elf::shared_object(data) {
        if let Some(name) = so.soname {
            assert!(elf::valid_soname(&name));
        }
    }
});
