//! The OCI state parser: any bytes give a state or a one-line error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match tessera_hook::state::read_state(data) {
        Ok(state) => {
            assert!(!state.id.is_empty());
            assert!(state.bundle.starts_with('/'));
            let _ = state.pid();
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "multi-line error: {e}"),
    }
});
