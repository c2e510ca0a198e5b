//! Annotations, env entries and allocation ids from raw lines: each line is an
//! annotation `key=value` (odd lines) or an env entry (even lines). Checks that
//! parsing never panics, that accepted ids obey the contract, and that
//! `AllocId::new` agrees with a plain restatement of its rules.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use tessera_model::alloc::{AllocId, MAX_LEN};

fn contract_ok(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        && !id.starts_with('-')
        && !id.ends_with('-')
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut annotations = BTreeMap::new();
    let mut env = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        assert_eq!(AllocId::new(line).is_ok(), contract_ok(line), "{line:?}");
        if let Err(e) = AllocId::new(line) {
            assert!(!e.to_string().contains('\n'));
        }
        if i % 2 == 0 {
            let (k, v) = line.split_once('=').unwrap_or((line, ""));
            annotations.insert(k.to_owned(), v.to_owned());
        } else {
            env.push(line.to_owned());
        }
    }
    match tessera_hook::request::parse_request(&annotations, &env) {
        Ok(request) => {
            if let Some(alloc) = request.alloc {
                assert!(contract_ok(alloc.id.as_str()));
            }
            if let Some(raw) = request.visible_devices {
                if let Ok(Some(tessera_hook::request::VisibleDevices::Named(names))) =
                    tessera_hook::request::parse_visible_devices(&raw)
                {
                    assert!(!names.is_empty());
                }
            }
        }
        Err(e) => assert!(!e.contains('\n'), "multi-line error: {e}"),
    }
});
