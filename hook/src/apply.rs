//! Legacy injection: applying a spec's edits for a runtime that did not.
//!
//! Steps, each failing closed:
//!
//! 1. plan the edits ([`crate::plan`]): nodes with numbers, cgroup rules, bind mounts;
//! 2. open the container's `devices.allow` on the host's cgroup mount
//!    ([`crate::cgroup`]; refused on cgroup v2);
//! 3. take `/proc/<init>/root` and compare it with the hook's `/` ([`crate::ns`]);
//! 4. host writes: the allocation directory, accounting directory and binding record;
//! 5. clone each mount source into a detached mount, attributes set ([`crate::mounts`]);
//! 6. enter the container's mount namespace, open its root, create the device
//!    nodes and mount targets fd-relative ([`crate::rootfs`]), attach the
//!    mounts, write the cgroup rules;
//! 7. return to the host's mount namespace.
//!
//! A failure in 4–7 undoes what this run created: container side first
//! (still inside), then the host side.

use std::io;

use rustix::fs::{AtFlags, CWD, FileType};
use tessera_model::alloc::AllocId;
use tessera_model::cdi::ContainerEdits;

use crate::cgroup::DeviceCgroup;
use crate::commands::record_binding;
use crate::config::HookConfig;
use crate::error::{HookError, Result};
use crate::fsutil::file_type;
use crate::journal::Journal;
use crate::mounts::{Source, open_source};
use crate::ns::{self, Container, RootProbe};
use crate::oci::{Bundle, OciConfig};
use crate::plan::{NodeKind, Plan, plan};
use crate::procfs::Procfs;
use crate::rootfs::Outcome;
use crate::state::State;

/// Everything injection reads.
#[derive(Debug)]
pub struct Context<'a> {
    /// `hook.toml`.
    pub config: &'a HookConfig,
    /// The OCI state.
    pub state: &'a State,
    /// The bundle.
    pub bundle: &'a Bundle,
    /// The bundle's `config.json`.
    pub oci: &'a OciConfig,
    /// `/proc`.
    pub procfs: &'a Procfs,
    /// The container's init.
    pub container: &'a Container,
}

/// What injection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Device nodes created.
    pub nodes_created: usize,
    /// Device nodes that already existed with the same numbers.
    pub nodes_existing: usize,
    /// Bind mounts attached.
    pub mounts_created: usize,
    /// Bind mounts already in place.
    pub mounts_existing: usize,
    /// `devices.allow` rules written.
    pub cgroup_rules: usize,
}

/// Type and numbers of a host device node (for spec nodes without them).
pub fn host_node(path: &str) -> std::result::Result<(NodeKind, u32, u32), String> {
    let st = rustix::fs::statat(CWD, path, AtFlags::empty()).map_err(|e| e.to_string())?;
    let kind = match file_type(&st) {
        FileType::CharacterDevice => NodeKind::Char,
        FileType::BlockDevice => NodeKind::Block,
        FileType::Fifo => NodeKind::Fifo,
        _ => return Err("not a device node".into()),
    };
    Ok((
        kind,
        rustix::fs::major(st.st_rdev),
        rustix::fs::minor(st.st_rdev),
    ))
}

/// Applies `edits` to the container; records the binding when `alloc` is given.
pub fn inject(
    ctx: &Context<'_>,
    edits: &ContainerEdits,
    alloc: Option<&AllocId>,
) -> Result<Report> {
    let plan = plan(edits, &host_node).map_err(HookError::Unsupported)?;
    for skipped in &plan.skipped {
        crate::info!("legacy injection skips {skipped}");
    }
    let rules = plan.cgroup_rules();
    if !ctx.container.cgroups_absolute && !rules.is_empty() {
        return Err(HookError::Unsupported(
            "tessera-hook runs inside a container with its own cgroup namespace and cannot find its device cgroup; register it as a prestart or createRuntime hook".into(),
        ));
    }
    let cgroup = if rules.is_empty() {
        None
    } else {
        Some(DeviceCgroup::open(ctx.procfs, ctx.container)?)
    };
    let owners = plan
        .nodes
        .iter()
        .map(|n| ctx.oci.host_ids(n.uid, n.gid))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(HookError::Refused)?;
    let probe = RootProbe::take(ctx.container)?;
    let prepared = Prepared {
        plan,
        rules,
        cgroup,
        owners,
        probe,
    };

    let mut host = Journal::default();
    let result = host_then_container(ctx, prepared, alloc, &mut host);
    match result {
        Ok(report) => {
            host.commit();
            Ok(report)
        }
        Err(e) => {
            host.undo(None);
            Err(e)
        }
    }
}

/// Everything checked and opened before the first write.
#[derive(Debug)]
struct Prepared {
    plan: Plan,
    rules: Vec<String>,
    cgroup: Option<DeviceCgroup>,
    /// Host uid and gid of each node, in node order.
    owners: Vec<(u32, u32)>,
    probe: RootProbe,
}

fn host_then_container(
    ctx: &Context<'_>,
    prepared: Prepared,
    alloc: Option<&AllocId>,
    host: &mut Journal,
) -> Result<Report> {
    if let Some(id) = alloc {
        record_binding(ctx, id, "legacy", host)?;
    }
    let sources = prepared
        .plan
        .mounts
        .iter()
        .map(open_source)
        .collect::<Result<Vec<_>>>()?;
    let entered = ns::enter(ctx.procfs, ctx.container)?;
    let mut inside = Journal::default();
    let result = in_container(ctx, prepared, sources, &mut inside);
    match &result {
        Ok(_) => inside.commit(),
        Err(_) => inside.undo(Some(ctx.procfs)),
    }
    let left = entered.leave();
    let report = result?;
    left?;
    Ok(report)
}

fn in_container(
    ctx: &Context<'_>,
    prepared: Prepared,
    sources: Vec<Source>,
    journal: &mut Journal,
) -> Result<Report> {
    let Prepared {
        plan,
        rules,
        cgroup,
        owners,
        probe,
    } = prepared;
    let rootfs = ctx.bundle.rootfs(ctx.oci);
    let root = probe.open(ctx.container, rootfs.as_deref())?;
    let mut report = Report::default();
    for (node, (uid, gid)) in plan.nodes.iter().zip(&owners) {
        let outcome = root
            .make_node(node, *uid, *gid, journal)
            .map_err(|e: io::Error| {
                HookError::apply(format!("device node {} in the container", node.path), e)
            })?;
        match outcome {
            Outcome::Created => report.nodes_created += 1,
            Outcome::Existing => report.nodes_existing += 1,
        }
    }
    for source in sources {
        match source.attach(&root, ctx.procfs, journal)? {
            Outcome::Created => report.mounts_created += 1,
            Outcome::Existing => report.mounts_existing += 1,
        }
    }
    if let Some(cgroup) = &cgroup {
        for rule in &rules {
            cgroup.allow(rule)?;
            report.cgroup_rules += 1;
        }
    }
    Ok(report)
}
