//! Malformed input through the binary: one `tessera-hook: …` line on stderr,
//! the documented exit code, and nothing created.

mod common;

use common::{Fixture, Need, code_and_stderr, config_json, require, run_hook};
use serde_json::json;

fn assert_one_line(stderr: &str) {
    assert!(stderr.starts_with("tessera-hook: "), "{stderr:?}");
    assert_eq!(stderr.matches('\n').count(), 1, "{stderr:?}");
}

#[test]
fn bad_states_exit_3() {
    let fx = Fixture::new();
    fx.write_config(&config_json(json!({}), &[]));
    let huge = format!(
        "{{\"ociVersion\":\"1\",\"id\":\"x\",\"bundle\":\"/b\",\"pad\":\"{}\"}}",
        "a".repeat(70_000)
    );
    for stdin in [
        "",
        "{",
        "null",
        "[1,2]",
        "{\"ociVersion\":\"1\",\"id\":\"x\"}",
        huge.as_str(),
    ] {
        let (code, stderr) = code_and_stderr(&fx.run("prestart", stdin));
        assert_eq!(code, 3, "{stdin:.40}: {stderr}");
        assert!(
            stderr.starts_with("tessera-hook: OCI state on stdin: "),
            "{stderr}"
        );
        assert_one_line(&stderr);
    }
    // crun's extra `root` field and unknown future fields are fine.
    let crun = format!(
        "{{\"ociVersion\":\"1.0\",\"id\":\"x\",\"pid\":0,\"root\":\"rootfs\",\"bundle\":{:?},\"status\":\"created\",\"future\":{{}}}}",
        fx.path("bundle")
    );
    assert_eq!(
        code_and_stderr(&fx.run("prestart", &crun)),
        (0, String::new())
    );
    assert!(fx.state_files().is_empty());
}

#[test]
fn bad_bundles_and_configs_exit_3() {
    let fx = Fixture::new();
    let missing = fx.state("x", Some(1)).replace("bundle", "bundle-missing");
    let (code, stderr) = code_and_stderr(&fx.run("prestart", &missing));
    assert_eq!(code, 3, "{stderr}");
    assert_one_line(&stderr);

    std::fs::write(
        fx.path("bundle/config.json"),
        "{\"process\": {\"env\": [1]}}",
    )
    .expect("write");
    let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("x", Some(1))));
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("config.json: invalid type"), "{stderr}");
    assert_one_line(&stderr);

    // A symlinked config.json is not followed.
    std::fs::remove_file(fx.path("bundle/config.json")).expect("rm");
    std::fs::write(fx.path("real.json"), "{}").expect("write");
    std::os::unix::fs::symlink(fx.path("real.json"), fx.path("bundle/config.json")).expect("ln");
    let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("x", Some(1))));
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("config.json: opening:"), "{stderr}");
}

#[test]
fn strict_hook_toml_exits_3_with_the_place() {
    let fx = Fixture::new();
    fx.write_config(&config_json(json!({"tessera.io/alloc-id": "pod-0"}), &[]));
    std::fs::write(
        fx.path("hook.toml"),
        "cdi_dir = \"/x\"\nstate_dri = \"/y\"\n",
    )
    .expect("write");
    let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("x", Some(1))));
    require!(Need::Root);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("hook.toml: line 2 column 1: unknown field `state_dri`"),
        "{stderr}"
    );
    assert_one_line(&stderr);
}

#[test]
fn bad_allocation_ids_exit_4() {
    let fx = Fixture::new();
    for (annotations, env, expect) in [
        (
            json!({"tessera.io/alloc-id": "../../etc"}),
            vec![],
            "character '.' at byte 0",
        ),
        (json!({"tessera.io/alloc-id": "A"}), vec![], "character 'A'"),
        (
            json!({"tessera.io/alloc-id": "a".repeat(300)}),
            vec![],
            "300 bytes long",
        ),
        (json!({"tessera.io/alloc-id": ""}), vec![], "empty"),
        (
            json!({"tessera.io/alloc-id": "a-0"}),
            vec!["TESSERA_ALLOC_ID=b-0"],
            "conflicting",
        ),
    ] {
        fx.write_config(&config_json(annotations, &env));
        let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("x", Some(1))));
        assert_eq!(code, 4, "{stderr}");
        assert!(stderr.contains(expect), "{stderr} lacks {expect}");
        assert_one_line(&stderr);
    }
    assert!(fx.state_files().is_empty());
}

#[test]
fn missing_spec_for_an_annotated_allocation_exits_4() {
    let fx = Fixture::new();
    fx.write_config(&config_json(json!({"tessera.io/alloc-id": "gone-0"}), &[]));
    let (code, stderr) = code_and_stderr(&fx.run("prestart", &fx.state("x", Some(1))));
    require!(Need::Root);
    assert_eq!(code, 4, "{stderr}");
    assert!(
        stderr.contains("no transient spec tessera.io-alloc_gone-0.json"),
        "{stderr}"
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [&[][..], &["start"], &["prestart", "extra"]] {
        let (code, stderr) = code_and_stderr(&run_hook(args, ""));
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.starts_with("tessera-hook: "), "{stderr}");
    }
    let out = run_hook(&["--help"], "");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("prestart|poststop"));
}
