//! The strict `hook.toml` parser: a config or a one-line error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match tessera_hook::config::parse_config(text) {
        Ok(config) => {
            assert!(config.cdi_dir.is_absolute());
            assert!(config.state_dir.is_absolute());
        }
        Err(e) => assert!(!e.contains('\n'), "multi-line error: {e}"),
    }
});
