//! The two verbs: `prestart` (bind, and inject where the runtime did not apply
//! CDI) and `poststop` (unbind).
//!
//! The order inside `prestart` keeps the host unchanged on refusal: every
//! input (state, `config.json`, `hook.toml`, the spec and its trust checks, the
//! allocation id, the injection plan, the device cgroup, the container's
//! namespaces) is read and checked before the first write.

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use tessera_model::alloc::AllocId;
use tessera_model::cdi::ContainerEdits;

use crate::apply::{self, Context};
use crate::binding::{AllocDirs, Binding, preferred_cgroup};
use crate::cli::{Cli, Verb};
use crate::config::{self, HookConfig};
use crate::error::{HookError, Result};
use crate::journal::Journal;
use crate::log;
use crate::ns;
use crate::oci::{Bundle, OciConfig};
use crate::procfs::Procfs;
use crate::request::{Request, parse_request, parse_visible_devices};
use crate::specs::{load_alloc_edits, load_static_edits};
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
    if request.is_empty() || (cli.verb == Verb::Poststop && request.alloc.is_none()) {
        return Ok(Outcome::NothingRequested);
    }
    let config = config::load(cli.config.as_deref())?;
    log::set_level(config.log_level);
    // Every file the hook creates gets exactly the mode it asks for.
    rustix::process::umask(rustix::fs::Mode::empty());
    match cli.verb {
        Verb::Prestart => prestart(&config, &state, &bundle, &oci, request),
        Verb::Poststop => poststop(&config, &state, request),
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

fn prestart(
    config: &HookConfig,
    state: &State,
    bundle: &Bundle,
    oci: &OciConfig,
    request: Request,
) -> Result<Outcome> {
    let cdi = TrustedDir::open(&config.cdi_dir)?;
    let (edits, alloc) = if let Some(alloc) = request.alloc {
        match load_alloc_edits(cdi.as_ref(), &alloc.id)? {
            Some(edits) => (edits, Some(alloc)),
            None if !alloc.source.may_inject() => {
                let why = format!(
                    "env TESSERA_ALLOC_ID={} names no allocation spec in {}; ignored (env alone never requests devices)",
                    alloc.id,
                    config.cdi_dir.display()
                );
                crate::warn!("{why}");
                return Ok(Outcome::Ignored(why));
            }
            None => {
                return Err(HookError::Refused(format!(
                    "allocation {} ({}): no transient spec {} in {}",
                    alloc.id,
                    alloc.source,
                    alloc.id.spec_file_name(),
                    config.cdi_dir.display()
                )));
            }
        }
    } else {
        let raw = request.visible_devices.unwrap_or_default();
        if !config.accept_nvidia_visible_devices {
            let why =
                "NVIDIA_VISIBLE_DEVICES ignored: accept_nvidia_visible_devices is off in hook.toml"
                    .to_owned();
            crate::info!("{why}");
            return Ok(Outcome::Ignored(why));
        }
        let Some(wanted) = parse_visible_devices(&raw).map_err(HookError::Refused)? else {
            return Ok(Outcome::NothingRequested);
        };
        (load_static_edits(cdi.as_ref(), &wanted)?, None)
    };
    let applied = edits_applied(&edits, oci);
    match (&alloc, applied) {
        (None, true) => return Ok(Outcome::AlreadyApplied),
        (Some(alloc), false) if !alloc.source.may_inject() => {
            let why = format!(
                "env TESSERA_ALLOC_ID={} but the allocation's devices are not in config.json; ignored (env alone never requests injection; use the tessera.io/alloc-id annotation)",
                alloc.id
            );
            crate::warn!("{why}");
            return Ok(Outcome::Ignored(why));
        }
        _ => {}
    }
    let procfs = Procfs::open().map_err(|e| HookError::apply("opening /proc", e))?;
    let container = ns::locate(&procfs, state, bundle, oci)?;
    let id = alloc.as_ref().map(|a| &a.id);
    let ctx = Context {
        config,
        state,
        bundle,
        oci,
        procfs: &procfs,
        container: &container,
    };
    if applied {
        let Some(id) = id else {
            return Ok(Outcome::AlreadyApplied);
        };
        let mut journal = Journal::default();
        match record_binding(&ctx, id, "cdi", &mut journal) {
            Ok(()) => journal.commit(),
            Err(e) => {
                journal.undo(None);
                return Err(e);
            }
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
    let report = apply::inject(&ctx, &edits, id)?;
    crate::info!(
        "{}: container {} (pid {}): {} device nodes created ({} existed), {} mounts made ({} existed), {} cgroup rules",
        id.map_or_else(
            || "NVIDIA_VISIBLE_DEVICES".to_owned(),
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

/// Creates the allocation's directories and writes its binding record.
pub(crate) fn record_binding(
    ctx: &Context<'_>,
    id: &AllocId,
    mode: &str,
    journal: &mut Journal,
) -> Result<()> {
    let Context {
        config,
        state,
        container,
        ..
    } = *ctx;
    let pid = container.init_pid;
    let entries = &container.cgroups;
    let dirs = AllocDirs::open(&config.state_dir, true)?.ok_or_else(|| {
        HookError::apply(
            format!("state directory {}", config.state_dir.display()),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })?;
    let dir = dirs.prepare(id, journal)?;
    let binding = Binding {
        alloc_id: id.to_string(),
        container_id: state.id.clone(),
        pid,
        cgroup: preferred_cgroup(entries),
        cgroups: entries
            .iter()
            .map(|e| (e.controllers.join(","), e.path.clone()))
            .collect(),
        bundle: state.bundle.clone(),
        mode: mode.to_owned(),
        bound_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    dirs.write_binding(&dir, &binding, journal)
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
