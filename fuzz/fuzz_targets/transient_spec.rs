//! A transient spec as the hook loads it: `parse_spec` (strict CDI parse,
//! `validate_tessera`) never panics, errors are one line, and a spec it
//! accepts of kind `tessera.io/alloc` names `TESSERA_ALLOC_ID` for its device.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_model::contract::cdi::ALLOC_KIND;

fuzz_target!(|data: &[u8]| {
    match tessera_hook::specs::parse_spec(data) {
        Err(e) => assert!(!e.contains('\n'), "multi-line error: {e}"),
        Ok(spec) if spec.kind == ALLOC_KIND => {
            let want = format!("TESSERA_ALLOC_ID={}", spec.devices[0].name);
            let has = spec
                .container_edits
                .env
                .iter()
                .chain(&spec.devices[0].container_edits.env)
                .any(|e| *e == want);
            assert!(has, "accepted without {want}");
        }
        Ok(_) => {}
    }
});
