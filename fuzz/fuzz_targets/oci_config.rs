//! The `config.json` subset and the request read from it (annotations, env):
//! never a panic; every allocation id that comes out is valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_model::alloc::AllocId;

fuzz_target!(|data: &[u8]| {
    let Ok(config) = tessera_hook::oci::parse_config(data) else {
        return;
    };
    let user = config.user();
    let _ = config.host_ids(user.uid, user.gid);
    if let Ok(request) = tessera_hook::request::parse_request(&config.annotations, config.env()) {
        if let Some(alloc) = &request.alloc {
            assert_eq!(AllocId::new(alloc.id.as_str()).as_ref(), Ok(&alloc.id));
        }
        if let Some(raw) = &request.visible_devices {
            let _ = tessera_hook::request::parse_visible_devices(raw);
        }
    }
});
