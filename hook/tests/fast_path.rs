//! The fast path: a container that asks Tessera for nothing costs a read of the
//! state and config.json, exits 0, and touches nothing (not even hook.toml).

mod common;

use common::{Fixture, code_and_stderr, config_json, run_hook};
use serde_json::json;

#[test]
fn container_without_allocation_exits_zero_and_creates_nothing() {
    let fx = Fixture::new();
    fx.write_config(&config_json(
        json!({"org.opencontainers.image.title": "busybox", "cdi.k8s.io/other_x": "vendor.com/dev=1"}),
        &["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "TESSERA_ALLOC_IDX=1"],
    ));
    // --config names a file that does not exist: reading it would fail the run.
    let missing = fx.path("no-such-hook.toml");
    for verb in ["prestart", "createContainer", "poststop"] {
        let out = run_hook(
            &["--config", missing.to_str().expect("utf-8"), verb],
            &fx.state("plain", Some(1)),
        );
        assert_eq!(code_and_stderr(&out), (0, String::new()), "{verb}");
    }
    assert!(
        fx.state_files().is_empty(),
        "state dir changed: {:?}",
        fx.state_files()
    );
}

#[test]
fn nvidia_visible_devices_is_ignored_unless_enabled() {
    let fx = Fixture::new();
    fx.write_config(&config_json(json!({}), &["NVIDIA_VISIBLE_DEVICES=all"]));
    let out = fx.run("prestart", &fx.state("nvd", Some(1)));
    assert_eq!(code_and_stderr(&out).0, 0, "{out:?}");
    assert!(fx.state_files().is_empty());
}

#[test]
fn env_alone_naming_a_missing_allocation_is_ignored() {
    let fx = Fixture::new();
    fx.write_config(&config_json(
        json!({}),
        &["TESSERA_ALLOC_ID=committed-image-0"],
    ));
    let out = fx.run("prestart", &fx.state("env-only", Some(1)));
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("ignored"), "{stderr}");
    assert!(fx.state_files().is_empty());
}
