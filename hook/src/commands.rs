//! The two verbs: `prestart` (bind, and inject where the runtime did not apply
//! CDI) and `poststop` (unbind).
//!
//! The order inside `prestart` keeps the host unchanged on refusal: every
//! input (state, `config.json`, `hook.toml`, the spec and its trust checks, the
//! allocation id, the injection plan, the device cgroup, the container's
//! namespaces) is read and checked before the first write.
//!
//! A container that asks for nothing (no allocation, no
//! `NVIDIA_VISIBLE_DEVICES`) normally takes the fast path without reading
//! `hook.toml`. The exception is a container whose `config.json` has a mount
//! of a host file to a `lib*.so*` path (checked in memory): one started with
//! the static spec's `tessera.io/gpu=<n>` through CDI runs this hook (the
//! spec's `createContainer` entry) and needs its libraries registered like any
//! other. Then the trusted static spec is read, and the mounts it names that
//! the runtime applied unchanged get their links and cache entries; a problem
//! is only a warning.

use std::io::Read;

use tessera_model::alloc::AllocId;
use tessera_model::cdi::ContainerEdits;
use tessera_model::contract::cdi::STATIC_SPEC_FILE;
use tessera_model::contract::env::VISIBLE_DEVICES;

use crate::apply::{self, Context, record_binding};
use crate::binding::AllocDirs;
use crate::cli::{Cli, Verb};
use crate::config::{self, HookConfig};
use crate::decision::{Decision, Inputs, SpecFound, SpecRef, decide};
use crate::error::{HookError, Result};
use crate::journal::Journal;
use crate::libraries::{config_has_library_mounts, library_targets};
use crate::log;
use crate::ns;
use crate::oci::{Bundle, OciConfig};
use crate::procfs::Procfs;
use crate::request::{Request, parse_request};
use crate::specs::{applied_mounts, load_alloc_edits, load_spec, static_edits};
use crate::state::{State, read_state};
use crate::trust::TrustedDir;

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The container asks Tessera for nothing (the fast path).
    NothingRequested,
    /// The request was ignored, and why (said at `warn`/`info`).
    Ignored(String),
    /// The runtime applied the spec; the binding was recorded.
    Bound {
        /// The allocation.
        alloc: String,
    },
    /// The runtime applied the static spec; nothing to do.
    AlreadyApplied,
    /// The hook applied the edits (and recorded the binding for an allocation).
    Injected(apply::Report),
    /// `poststop`: whether a binding record was removed.
    Unbound {
        /// A record naming this container was removed.
        removed: bool,
    },
}

/// Runs the hook: reads the state from `stdin`, then the verb.
pub fn run(cli: &Cli, stdin: impl Read) -> Result<Outcome> {
    let state = read_state(stdin)?;
    let bundle = Bundle::open(&state.bundle)?;
    let oci = bundle.config()?;
    let request = parse_request(&oci.annotations, oci.env()).map_err(HookError::Refused)?;
    if request.is_empty() && cli.verb == Verb::Prestart && config_has_library_mounts(&oci) {
        return Ok(static_libraries(cli, &state, &bundle, &oci));
    }
    if request.is_empty() || (cli.verb == Verb::Poststop && request.alloc.is_none()) {
        return Ok(Outcome::NothingRequested);
    }
    let config = config::load(cli.config.as_deref())?;
    log::set_level(config.log_level);
    match cli.verb {
        Verb::Prestart => prestart(&config, &state, &bundle, &oci, request),
        Verb::Poststop => poststop(&config, &state, request),
    }
}

/// `prestart` for a container that asks the hook for nothing yet has driver
/// libraries bind-mounted: a CDI request for the static spec's
/// `tessera.io/gpu=<n>`, which the runtime applied. Its libraries get their
/// links and cache entries as an applied allocation's do, but only the
/// mounts the trusted static spec names with the same source and destination
/// ([`applied_mounts`]) count: a mount the pod asked for itself is never
/// registered. Never fails the container: each problem is a warning, and the
/// outcome is then [`Outcome::NothingRequested`].
fn static_libraries(cli: &Cli, state: &State, bundle: &Bundle, oci: &OciConfig) -> Outcome {
    let run = || -> Result<bool> {
        let config = config::load(cli.config.as_deref())?;
        log::set_level(config.log_level);
        if !config.update_ldcache {
            return Ok(false);
        }
        let cdi = TrustedDir::open(&config.cdi_dir)?;
        let Some(spec) = load_spec(cdi.as_ref(), STATIC_SPEC_FILE)? else {
            return Ok(false);
        };
        let edits = applied_mounts(&spec, oci);
        if library_targets(&edits).is_empty() {
            return Ok(false);
        }
        let procfs = Procfs::open().map_err(|e| HookError::apply("opening /proc", e))?;
        let container = ns::locate(&procfs, state, bundle, oci)?;
        let ctx = Context {
            config: &config,
            state,
            bundle,
            oci,
            procfs: &procfs,
            container: &container,
        };
        apply::refresh_libraries(&ctx, &edits);
        Ok(true)
    };
    match run() {
        Ok(true) => Outcome::AlreadyApplied,
        Ok(false) => Outcome::NothingRequested,
        Err(e) => {
            crate::warn!("library visibility: {e}; the container starts without it");
            Outcome::NothingRequested
        }
    }
}

/// Whether the runtime already put `edits` into the container's config: every
/// device node is in `linux.devices` (or, without nodes, every mount is there).
pub fn edits_applied(edits: &ContainerEdits, oci: &OciConfig) -> bool {
    if edits.device_nodes.is_empty() {
        edits
            .mounts
            .iter()
            .all(|m| oci.has_mount(&m.container_path))
    } else {
        edits.device_nodes.iter().all(|n| oci.has_device(&n.path))
    }
}

/// What `prestart` does once the container's init is found.
enum Act {
    /// The runtime applied the static spec: only the libraries' links and cache.
    Applied,
    /// Record the binding of an allocation the runtime applied.
    Bind(AllocId),
    /// Apply the edits (and bind the allocation, if any).
    Inject(Option<AllocId>),
}

/// Reads the spec `which` names: what [`decide`] needs, and its edits.
fn read_spec(
    cdi: Option<&TrustedDir>,
    which: &SpecRef,
    oci: &OciConfig,
) -> Result<(SpecFound, Option<ContainerEdits>)> {
    let edits = match which {
        SpecRef::Alloc(id) => load_alloc_edits(cdi, id)?,
        SpecRef::Static(wanted) => load_spec(cdi, STATIC_SPEC_FILE)?
            .map(|spec| static_edits(&spec, wanted).map_err(HookError::Refused))
            .transpose()?,
    };
    let found = match &edits {
        None => SpecFound::Missing,
        Some(edits) => SpecFound::Present {
            applied: edits_applied(edits, oci),
        },
    };
    Ok((found, edits))
}

fn prestart(
    config: &HookConfig,
    state: &State,
    bundle: &Bundle,
    oci: &OciConfig,
    request: Request,
) -> Result<Outcome> {
    let cdi = TrustedDir::open(&config.cdi_dir)?;
    let mut inputs = Inputs {
        request: &request,
        accept_nvidia_visible_devices: config.accept_nvidia_visible_devices,
        cdi_dir: &config.cdi_dir,
        spec: None,
    };
    let mut decision = decide(&inputs);
    let mut edits = None;
    if let Decision::ReadSpec(which) = &decision {
        let (found, read) = read_spec(cdi.as_ref(), which, oci)?;
        inputs.spec = Some(found);
        edits = read;
        decision = decide(&inputs);
    }
    let act = match decision {
        Decision::Nothing => return Ok(Outcome::NothingRequested),
        Decision::Ignore { why, level } => {
            log::emit(level, format_args!("{why}"));
            return Ok(Outcome::Ignored(why));
        }
        Decision::Refuse(why) => return Err(HookError::Refused(why)),
        Decision::AlreadyApplied if !config.update_ldcache => {
            return Ok(Outcome::AlreadyApplied);
        }
        Decision::AlreadyApplied => Act::Applied,
        // `decide` asks for a spec only while none was read.
        Decision::ReadSpec(which) => unreachable!("{which:?} asked for after it was read"),
        Decision::Bind(id) => Act::Bind(id),
        Decision::Inject(id) => Act::Inject(id),
    };
    let procfs = Procfs::open().map_err(|e| HookError::apply("opening /proc", e))?;
    let container = match (ns::locate(&procfs, state, bundle, oci), &act) {
        (Ok(container), _) => container,
        // Nothing to bind or inject: the libraries' cache is not worth failing for.
        (Err(e), Act::Applied) => {
            crate::warn!("library visibility: {e}; the container starts without it");
            return Ok(Outcome::AlreadyApplied);
        }
        (Err(e), _) => return Err(e),
    };
    let ctx = Context {
        config,
        state,
        bundle,
        oci,
        procfs: &procfs,
        container: &container,
    };
    let id = match act {
        Act::Applied => {
            if let Some(edits) = &edits {
                apply::refresh_libraries(&ctx, edits);
            }
            return Ok(Outcome::AlreadyApplied);
        }
        Act::Bind(id) => {
            let mut journal = Journal::default();
            match record_binding(&ctx, &id, "cdi", &mut journal) {
                Ok(()) => journal.commit(),
                Err(e) => {
                    journal.undo(None);
                    return Err(e);
                }
            }
            if let Some(edits) = &edits {
                apply::refresh_libraries(&ctx, edits);
            }
            crate::info!(
                "allocation {id}: bound container {} (pid {}); the runtime applied the spec",
                state.id,
                container.init_pid
            );
            return Ok(Outcome::Bound {
                alloc: id.to_string(),
            });
        }
        Act::Inject(id) => id,
    };
    let edits = edits.unwrap_or_default();
    let report = apply::inject(&ctx, &edits, id.as_ref())?;
    crate::info!(
        "{}: container {} (pid {}): {} device nodes created ({} existed), {} mounts made ({} existed), {} cgroup rules",
        id.as_ref().map_or_else(
            || VISIBLE_DEVICES.to_owned(),
            |id| format!("allocation {id}")
        ),
        state.id,
        container.init_pid,
        report.nodes_created,
        report.nodes_existing,
        report.mounts_created,
        report.mounts_existing,
        report.cgroup_rules
    );
    Ok(Outcome::Injected(report))
}

fn poststop(config: &HookConfig, state: &State, request: Request) -> Result<Outcome> {
    let Some(alloc) = request.alloc else {
        return Ok(Outcome::NothingRequested);
    };
    let Some(dirs) = AllocDirs::open(&config.state_dir, false)? else {
        return Ok(Outcome::Unbound { removed: false });
    };
    let removed = dirs.remove_binding(&alloc.id, &state.id)?;
    if removed {
        crate::info!("allocation {}: unbound container {}", alloc.id, state.id);
    }
    Ok(Outcome::Unbound { removed })
}

#[cfg(test)]
mod tests {
    use tessera_model::cdi::{DeviceNode, Mount};
    use tessera_model::contract::vgpu::{CONTAINER_CONFIG_PATH, CONTAINER_LIBRARY};

    use super::*;
    use crate::oci::parse_config;

    fn oci(devices: &[&str], mounts: &[&str]) -> OciConfig {
        let config = serde_json::json!({
            "mounts": mounts.iter().map(|m| serde_json::json!({"destination": m})).collect::<Vec<_>>(),
            "linux": {"devices": devices.iter().map(|d| serde_json::json!({"path": d})).collect::<Vec<_>>()},
        });
        parse_config(config.to_string().as_bytes()).expect("config.json")
    }

    fn edits(nodes: &[&str], mounts: &[&str]) -> ContainerEdits {
        ContainerEdits {
            device_nodes: nodes
                .iter()
                .map(|p| DeviceNode {
                    path: (*p).into(),
                    ..Default::default()
                })
                .collect(),
            mounts: mounts
                .iter()
                .map(|m| Mount {
                    host_path: "/host".into(),
                    container_path: (*m).into(),
                    options: vec!["bind".into()],
                    mount_type: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn edits_count_as_applied_only_when_every_node_is_in_the_config() {
        let spec = edits(&["/dev/nvidiactl", "/dev/nvidia0"], &[CONTAINER_LIBRARY]);
        assert!(edits_applied(
            &spec,
            &oci(&["/dev/nvidia0", "/dev/nvidiactl"], &[])
        ));
        assert!(!edits_applied(
            &spec,
            &oci(&["/dev/nvidia0"], &[CONTAINER_LIBRARY])
        ));
        assert!(!edits_applied(&spec, &oci(&[], &[])));
    }

    #[test]
    fn edits_without_nodes_count_as_applied_when_every_mount_is_there() {
        let spec = edits(&[], &[CONTAINER_LIBRARY, CONTAINER_CONFIG_PATH]);
        assert!(edits_applied(
            &spec,
            &oci(&[], &[CONTAINER_CONFIG_PATH, CONTAINER_LIBRARY])
        ));
        assert!(!edits_applied(&spec, &oci(&[], &[CONTAINER_LIBRARY])));
        assert!(
            edits_applied(&edits(&[], &[]), &oci(&[], &[])),
            "nothing to apply"
        );
    }
}
