//! The transient spec contract: what a `tessera.io/alloc` spec must carry
//! beyond CDI's own rules.
//!
//! Under containerd and CRI-O `tessera-hook` sees the container's env, not the
//! pod's annotations, and nothing calls it at container end unless the spec
//! names it. So a transient spec is complete only when its edits (spec-level
//! and device together) carry:
//!
//! | what | why |
//! |---|---|
//! | exactly one device, named by a valid allocation id | the spec is one allocation's |
//! | env `TESSERA_ALLOC_ID=<device name>` | how the hook learns the allocation under CDI |
//! | a `createContainer` hook running `tessera-hook prestart`, with `env` | binds the container to the allocation |
//! | a `poststop` hook running `tessera-hook poststop`, with `env` | removes the binding when the container ends |
//!
//! Every `tessera-hook` entry carries an explicit `env`: a hook entry without
//! one inherits the runtime's environment on some runtimes, which is how
//! NVIDIAScape reached a dynamically linked hook.

use super::spec::SpecProblem;
use super::spec::{ContainerEdits, Hook, Spec};
use super::validate::Problems;
use crate::alloc::AllocId;
use crate::contract::cdi::ALLOC_KIND;
use crate::contract::env::ALLOC_ID as ALLOC_ID_ENV;

use crate::contract::hook::BINARY_NAME as HOOK_BINARY_NAME;
/// The stage at which the hook binds a container to its allocation.
pub const BIND_STAGE: &str = "createContainer";
/// The hook verb that binds.
pub const BIND_VERB: &str = "prestart";
/// The stage, and the hook verb, that unbinds.
pub const UNBIND_STAGE: &str = "poststop";

/// Whether `hook` runs `tessera-hook <verb>`: its path's file name is
/// [`HOOK_BINARY_NAME`] and the first operand after `args[0]` (skipping
/// `--config FILE`) is `verb`.
pub fn runs_tessera_hook(hook: &Hook, verb: &str) -> bool {
    is_tessera_hook(hook) && hook_verb(&hook.args) == Some(verb)
}

fn is_tessera_hook(hook: &Hook) -> bool {
    hook.path.rsplit('/').next() == Some(HOOK_BINARY_NAME)
}

/// The verb among a hook's `args` (`args[0]` is the program name).
fn hook_verb(args: &[String]) -> Option<&str> {
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--config" => {
                rest.next();
            }
            a if a.starts_with("--config=") => {}
            a => return Some(a),
        }
    }
    None
}

impl Spec {
    /// [`Spec::validate`], plus the contract of Tessera's own kinds: for a
    /// `tessera.io/alloc` spec, the table in this module's documentation.
    pub fn validate_tessera(&self) -> Result<(), Vec<SpecProblem>> {
        let mut problems = self.validate().err().unwrap_or_default();
        if self.kind == ALLOC_KIND {
            problems.extend(transient_problems(self));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// Every way `spec` (of kind `tessera.io/alloc`) breaks the transient spec contract.
pub fn transient_problems(spec: &Spec) -> Vec<SpecProblem> {
    let mut out = Problems::default();
    let [device] = spec.devices.as_slice() else {
        out.push(
            "devices",
            format!(
                "a {ALLOC_KIND} spec has exactly one device, named by its allocation id; this one has {}",
                spec.devices.len()
            ),
        );
        return out.0;
    };
    if let Err(e) = AllocId::new(&device.name) {
        out.push("devices[0].name", e.to_string());
    }
    let places: [(&str, &ContainerEdits); 2] = [
        ("containerEdits", &spec.container_edits),
        ("devices[0].containerEdits", &device.container_edits),
    ];

    let wanted_env = format!("{ALLOC_ID_ENV}={}", device.name);
    let mut env_found = false;
    for (at, edits) in places {
        for (i, entry) in edits.env.iter().enumerate() {
            if entry.split_once('=').map(|(k, _)| k) == Some(ALLOC_ID_ENV) {
                if *entry == wanted_env {
                    env_found = true;
                } else {
                    out.push(
                        format!("{at}.env[{i}]"),
                        format!("{entry:?} names another allocation; want {wanted_env:?}"),
                    );
                }
            }
        }
    }
    if !env_found {
        out.push(
            "devices[0].containerEdits.env",
            format!(
                "missing {wanted_env:?}: under containerd and CRI-O tessera-hook learns the allocation only from the container's env"
            ),
        );
    }

    let mut bind = false;
    let mut unbind = false;
    for (at, edits) in places {
        for (i, hook) in edits.hooks.iter().enumerate() {
            if !is_tessera_hook(hook) {
                continue;
            }
            if hook.env.is_empty() {
                out.push(
                    format!("{at}.hooks[{i}].env"),
                    "a tessera-hook entry needs an explicit env (without one, some runtimes pass their own environment to the hook)",
                );
            }
            bind |= hook.hook_name == BIND_STAGE && runs_tessera_hook(hook, BIND_VERB);
            unbind |= hook.hook_name == UNBIND_STAGE && runs_tessera_hook(hook, UNBIND_STAGE);
        }
    }
    if !bind {
        out.push(
            "devices[0].containerEdits.hooks",
            format!(
                "no {BIND_STAGE} hook running `{HOOK_BINARY_NAME} {BIND_VERB}`: nothing would bind the container to its allocation"
            ),
        );
    }
    if !unbind {
        out.push(
            "devices[0].containerEdits.hooks",
            format!(
                "no {UNBIND_STAGE} hook running `{HOOK_BINARY_NAME} {UNBIND_STAGE}`: the binding would outlive the container"
            ),
        );
    }
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::{Device, DeviceNode};

    const ID: &str = "3f2b7c1a-0";

    fn hook(stage: &str, verb: &str, env: bool) -> Hook {
        Hook {
            hook_name: stage.into(),
            path: "/usr/bin/tessera-hook".into(),
            args: vec![HOOK_BINARY_NAME.into(), verb.into()],
            env: if env {
                vec!["PATH=/usr/bin".into()]
            } else {
                vec![]
            },
            timeout: None,
        }
    }

    fn complete() -> Spec {
        let edits = ContainerEdits {
            env: vec![format!("TESSERA_ALLOC_ID={ID}")],
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                ..DeviceNode::default()
            }],
            hooks: vec![
                hook("createContainer", "prestart", true),
                hook("poststop", "poststop", true),
            ],
            ..ContainerEdits::default()
        };
        Spec::new(
            ALLOC_KIND,
            vec![Device::new(ID, edits)],
            ContainerEdits::default(),
        )
        .expect("valid spec")
    }

    fn messages(spec: &Spec) -> Vec<String> {
        spec.validate_tessera()
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_complete_spec_passes() {
        assert_eq!(messages(&complete()), Vec::<String>::new());
    }

    #[test]
    fn the_hook_may_sit_at_spec_level_and_take_a_config() {
        let mut spec = complete();
        let mut hooks = std::mem::take(&mut spec.devices[0].container_edits.hooks);
        hooks[0].args = vec![
            "tessera-hook".into(),
            "--config".into(),
            "/etc/x.toml".into(),
            "prestart".into(),
        ];
        hooks[1].args.push("--config=/etc/x.toml".into());
        spec.container_edits.hooks = hooks;
        assert_eq!(messages(&spec), Vec::<String>::new());
    }

    #[test]
    fn a_missing_env_is_named() {
        let mut spec = complete();
        spec.devices[0].container_edits.env.clear();
        let m = messages(&spec);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].starts_with(
                "devices[0].containerEdits.env: missing \"TESSERA_ALLOC_ID=3f2b7c1a-0\""
            ),
            "{m:?}"
        );
    }

    #[test]
    fn an_env_for_another_allocation_is_named() {
        let mut spec = complete();
        spec.devices[0].container_edits.env = vec!["TESSERA_ALLOC_ID=other-0".into()];
        let m = messages(&spec);
        assert!(
            m.iter()
                .any(|l| l.starts_with("devices[0].containerEdits.env[0]:")),
            "{m:?}"
        );
        assert!(m.iter().any(|l| l.contains("missing")), "{m:?}");
    }

    #[test]
    fn missing_hooks_and_hooks_without_env_are_named() {
        let mut spec = complete();
        spec.devices[0].container_edits.hooks = vec![hook("createContainer", "prestart", false)];
        let m = messages(&spec);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m[0].starts_with("devices[0].containerEdits.hooks[0].env:"),
            "{m:?}"
        );
        assert!(m[1].contains("no poststop hook"), "{m:?}");

        // The verbs must match their stages.
        spec.devices[0].container_edits.hooks = vec![
            hook("createContainer", "poststop", true),
            hook("poststop", "prestart", true),
        ];
        let m = messages(&spec);
        assert!(
            m.iter().any(|l| l.contains("no createContainer hook")),
            "{m:?}"
        );
        assert!(m.iter().any(|l| l.contains("no poststop hook")), "{m:?}");

        // Another program is not tessera-hook.
        let mut other = hook("createContainer", "prestart", true);
        other.path = "/usr/bin/nvidia-ctk".into();
        spec.devices[0].container_edits.hooks = vec![other, hook("poststop", "poststop", true)];
        let m = messages(&spec);
        assert!(
            m.iter().any(|l| l.contains("no createContainer hook")),
            "{m:?}"
        );
    }

    #[test]
    fn one_device_named_by_a_valid_id() {
        let mut spec = complete();
        spec.devices[0].name = "Bad_Name".into();
        let m = messages(&spec);
        assert!(m.iter().any(|l| l.starts_with("devices[0].name:")), "{m:?}");

        let mut two = complete();
        two.devices.push(two.devices[0].clone());
        two.devices[1].name = "other-0".into();
        let m = messages(&two);
        assert!(
            m.iter()
                .any(|l| l.starts_with("devices: a tessera.io/alloc spec has exactly one device")),
            "{m:?}"
        );
    }

    #[test]
    fn other_kinds_are_left_to_cdi_rules() {
        let mut spec = complete();
        spec.kind = "tessera.io/gpu".into();
        spec.devices[0].container_edits.env.clear();
        spec.devices[0].container_edits.hooks.clear();
        assert_eq!(messages(&spec), Vec::<String>::new());
    }
}
