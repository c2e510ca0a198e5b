//! The trust checks on spec files and their directory, on real files: a spec
//! that anyone but root could have written is refused, with one line naming
//! the file and the failed check, and nothing is created.

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use common::{Fixture, Need, alloc_spec, code_and_stderr, config_json, require};
use serde_json::json;
use tessera_hook::trust::TrustedDir;

const NOBODY: u32 = 65534;

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn refusal(dir: &Path, file: &str) -> String {
    let result = TrustedDir::open(dir).and_then(|d| d.expect("dir exists").read(file));
    match result {
        Ok(_) => panic!("{}/{file} was trusted", dir.display()),
        Err(e) => {
            assert_eq!(e.exit_code(), tessera_hook::exit::REFUSED);
            e.to_string()
        }
    }
}

#[test]
fn a_root_owned_private_spec_is_read() {
    require!(Need::Root);
    let fx = Fixture::new();
    fx.write_spec("s.json", &json!({"x": 1}));
    let dir = TrustedDir::open(&fx.path("cdi"))
        .expect("ok")
        .expect("exists");
    assert!(dir.read("s.json").expect("trusted").is_some());
    assert!(dir.read("missing.json").expect("missing is fine").is_none());
    assert!(TrustedDir::open(&fx.path("nope")).expect("ok").is_none());
}

#[test]
fn untrusted_specs_and_directories_are_refused() {
    require!(Need::Root);
    let fx = Fixture::new();
    let cdi = fx.path("cdi");
    let spec = fx.write_spec("s.json", &json!({}));

    chmod(&spec, 0o666);
    assert!(refusal(&cdi, "s.json").contains("world-writable (mode 0666)"));
    chmod(&spec, 0o664);
    assert!(refusal(&cdi, "s.json").contains("group-writable (mode 0664)"));
    chmod(&spec, 0o644);

    rustix::fs::chown(&spec, Some(rustix::fs::Uid::from_raw(NOBODY)), None).expect("chown");
    assert!(refusal(&cdi, "s.json").contains("owned by uid 65534, not root"));
    rustix::fs::chown(&spec, Some(rustix::fs::Uid::ROOT), None).expect("chown");

    symlink(&spec, cdi.join("link.json")).expect("symlink");
    assert!(refusal(&cdi, "link.json").contains("is a symlink"));

    fs::create_dir(cdi.join("sub.json")).expect("mkdir");
    assert!(refusal(&cdi, "sub.json").contains("not a regular file"));

    chmod(&cdi, 0o775);
    let e = refusal(&cdi, "s.json");
    assert!(e.contains("directory group-writable (mode 0775)"), "{e}");
    chmod(&cdi, 0o1777);
    assert!(refusal(&cdi, "s.json").contains("world-writable"));
    chmod(&cdi, 0o755);

    rustix::fs::chown(&cdi, Some(rustix::fs::Uid::from_raw(NOBODY)), None).expect("chown");
    assert!(refusal(&cdi, "s.json").contains("owned by uid 65534"));
    rustix::fs::chown(&cdi, Some(rustix::fs::Uid::ROOT), None).expect("chown");

    let link_dir = fx.path("cdi-link");
    symlink(&cdi, &link_dir).expect("symlink dir");
    let e = TrustedDir::open(&link_dir).expect_err("symlinked dir");
    assert!(e.to_string().contains("is a symlink"), "{e}");
}

#[test]
fn the_hook_refuses_an_untrusted_spec_and_changes_nothing() {
    require!(Need::Root);
    let fx = Fixture::new();
    let spec = fx.write_spec(
        "tessera.io-alloc_pod-0.json",
        &alloc_spec("pod-0", json!([])),
    );
    chmod(&spec, 0o646);
    fx.write_config(&config_json(json!({"tessera.io/alloc-id": "pod-0"}), &[]));
    let out = fx.run("prestart", &fx.state("c1", Some(std::process::id())));
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 4, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "tessera-hook: {}: world-writable (mode 0646); refusing it\n",
            spec.display()
        )
    );
    assert!(fx.state_files().is_empty(), "{:?}", fx.state_files());
}

#[test]
fn hook_toml_is_a_trusted_file_too() {
    require!(Need::Root);
    let fx = Fixture::new();
    fx.write_config(&config_json(json!({"tessera.io/alloc-id": "pod-0"}), &[]));
    chmod(&fx.path("hook.toml"), 0o666);
    let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("c1", Some(1))));
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("hook.toml: world-writable"), "{stderr}");
}
