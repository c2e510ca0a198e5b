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
//! 7. make the injected libraries findable by name: links and the
//!    container's `/etc/ld.so.cache` ([`crate::libraries`]; warnings only);
//! 8. return to the host's mount namespace.
//!
//! A failure in 4–6 undoes what this run created: container side first
//! (still inside), then the host side.
//!
//! The container-side writes go through [`ContainerFs`]
//! ([`write_container`]), so their order and their undoing are tested with a
//! recorder, without root or a container.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, CWD, FileType};
use tessera_model::alloc::AllocId;
use tessera_model::cdi::ContainerEdits;

use crate::binding::{AllocDirs, Binding, preferred_cgroup};
use crate::cgroup::DeviceCgroup;
use crate::config::HookConfig;
use crate::container_fs::{ContainerFs, InRoot, MountSource};
use crate::error::{HookError, Result};
use crate::fsutil::file_type;
use crate::journal::Journal;
use crate::libraries::{self, library_targets};
use crate::mounts::{Source, open_source};
use crate::ns::{self, Container, RootProbe};
use crate::oci::{Bundle, OciConfig};
use crate::plan::{ContainerPath, NodeKind, NodePlan, Plan, plan};
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
        libraries: if ctx.config.update_ldcache {
            library_targets(edits)
        } else {
            Vec::new()
        },
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
    /// The libraries to link and register once mounted.
    libraries: Vec<ContainerPath>,
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
    // Undone inside on failure, before leaving.
    let result = in_container(ctx, prepared, sources);
    let left = entered.leave();
    let report = result?;
    left?;
    Ok(report)
}

fn in_container(ctx: &Context<'_>, prepared: Prepared, sources: Vec<Source>) -> Result<Report> {
    let Prepared {
        plan,
        rules,
        cgroup,
        owners,
        probe,
        libraries,
    } = prepared;
    let rootfs = ctx.bundle.rootfs(ctx.oci);
    let root = probe.open(ctx.container, rootfs.as_deref(), ctx.procfs)?;
    let mut fs = InRoot {
        root: &root,
        procfs: ctx.procfs,
        cgroup: cgroup.as_ref(),
    };
    let writes = Writes {
        nodes: plan.nodes.into_iter().zip(owners).collect(),
        mounts: sources,
        rules,
    };
    let report = write_container(&mut fs, writes)?;
    log_libraries(&libraries::refresh(&root, &libraries));
    Ok(report)
}

/// Says what [`libraries::refresh`] did: each problem at `warn`, the rest at `info`.
fn log_libraries(report: &libraries::Report) {
    for w in &report.warnings {
        crate::warn!("library visibility: {w}");
    }
    if report.libraries > 0 {
        crate::info!(
            "{} driver libraries: {} links made, {} cache entries{}",
            report.libraries,
            report.links,
            report.entries,
            if report.cache_written {
                ""
            } else {
                " (cache not written)"
            }
        );
    }
}

/// For a container whose spec the runtime applied (its mounts are in
/// place): enters its mount namespace and makes the spec's libraries
/// findable by name ([`crate::libraries`]). Never fails the container: every
/// problem is a warning.
pub fn refresh_libraries(ctx: &Context<'_>, edits: &ContainerEdits) {
    if !ctx.config.update_ldcache {
        return;
    }
    let targets = library_targets(edits);
    if targets.is_empty() {
        return;
    }
    let run = || -> Result<libraries::Report> {
        let probe = RootProbe::take(ctx.container)?;
        let entered = ns::enter(ctx.procfs, ctx.container)?;
        let rootfs = ctx.bundle.rootfs(ctx.oci);
        let report = probe
            .open(ctx.container, rootfs.as_deref(), ctx.procfs)
            .map(|root| libraries::refresh(&root, &targets));
        entered.leave()?;
        report
    };
    match run() {
        Ok(report) => log_libraries(&report),
        Err(e) => crate::warn!("library visibility: {e}; the container starts without it"),
    }
}

/// What injection writes in the container.
#[derive(Debug)]
pub struct Writes<S> {
    /// Device nodes, each with its owner's host uid and gid.
    pub nodes: Vec<(NodePlan, (u32, u32))>,
    /// Bind mounts, parents before children.
    pub mounts: Vec<S>,
    /// `devices.allow` rules.
    pub rules: Vec<String>,
}

/// Writes `writes` through `fs`: each device node after its missing parent
/// directories; then each mount after its missing parent directories and its
/// target (a directory or an empty file, as the source is); then the cgroup
/// rules. On a failure everything this call created is undone, newest first
/// (rules already written stay: the runtime removes the cgroup with the
/// container it aborts), and the error is returned.
pub fn write_container<F: ContainerFs>(fs: &mut F, writes: Writes<F::Source>) -> Result<Report> {
    let mut journal = Journal::default();
    match write_all(fs, writes, &mut journal) {
        Ok(report) => {
            journal.commit();
            Ok(report)
        }
        Err(e) => {
            journal.undo_with(|made| fs.undo(made));
            Err(e)
        }
    }
}

fn write_all<F: ContainerFs>(
    fs: &mut F,
    writes: Writes<F::Source>,
    journal: &mut Journal<F::Made>,
) -> Result<Report> {
    let mut report = Report::default();
    for (node, owner) in &writes.nodes {
        let what = |e: io::Error| {
            HookError::apply(format!("device node {} in the container", node.path), e)
        };
        for dir in node.path.ancestors() {
            fs.make_dir(&dir, journal).map_err(what)?;
        }
        match fs.make_node(node, *owner, journal).map_err(what)? {
            Outcome::Created => report.nodes_created += 1,
            Outcome::Existing => report.nodes_existing += 1,
        }
    }
    for source in writes.mounts {
        let target = source.plan().target.clone();
        let what =
            |e: io::Error| HookError::apply(format!("mount target {target} in the container"), e);
        for dir in target.ancestors() {
            fs.make_dir(&dir, journal).map_err(what)?;
        }
        if source.is_dir() {
            fs.make_dir(&target, journal)
        } else {
            fs.create_file(&target, journal)
        }
        .map_err(what)?;
        match fs.attach_mount(source, journal)? {
            Outcome::Created => report.mounts_created += 1,
            Outcome::Existing => report.mounts_existing += 1,
        }
    }
    for rule in &writes.rules {
        fs.allow_device(rule)?;
        report.cgroup_rules += 1;
    }
    Ok(report)
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

#[cfg(test)]
mod tests {
    use rustix::fs::OFlags;
    use tessera_model::contract::vgpu::{ACCOUNTING_DIR, CONTAINER_LIBRARY, HOST_LIBRARY};

    use super::*;
    use crate::container_fs::recorder::{Effect, FakeSource, Recorder};
    use crate::error::exit;
    use crate::plan::{ContainerPath, MountPlan};
    use crate::rootfs::ContainerRoot;
    use crate::testing::{open_dir, own_ids};

    fn node(path: &str, kind: NodeKind, minor: u32) -> NodePlan {
        NodePlan {
            path: ContainerPath::parse(path).expect("path"),
            kind,
            major: if kind == NodeKind::Fifo { 0 } else { 195 },
            minor,
            mode: 0o666,
            uid: 0,
            gid: 0,
            access: "rw".into(),
        }
    }

    fn gpu(path: &str, minor: u32, owner: (u32, u32)) -> (NodePlan, (u32, u32)) {
        (node(path, NodeKind::Char, minor), owner)
    }

    fn mount(host: &str, target: &str, dir: bool) -> FakeSource {
        FakeSource {
            plan: MountPlan {
                host_path: host.into(),
                target: ContainerPath::parse(target).expect("target"),
                recursive: false,
                readonly: !dir,
                nosuid: true,
                nodev: true,
                noexec: false,
            },
            dir,
        }
    }

    fn library() -> FakeSource {
        mount(HOST_LIBRARY, CONTAINER_LIBRARY, false)
    }

    fn d(path: &str) -> Effect {
        Effect::MakeDir(path.into())
    }

    fn rm(path: &str) -> Effect {
        Effect::Remove(path.into())
    }

    /// Two nodes (one in a missing directory), the library, the preload list
    /// (present in the image) and the accounting directory; two rules.
    fn typical() -> Writes<FakeSource> {
        Writes {
            nodes: vec![
                gpu("/dev/nvidiactl", 255, (0, 0)),
                gpu("/dev/nvidia-caps/nvidia-cap1", 1, (1000, 1000)),
            ],
            mounts: vec![
                library(),
                mount("/host/ld.so.preload", "/etc/ld.so.preload", false),
                mount(
                    "/var/lib/tessera/alloc/a-0/accounting",
                    ACCOUNTING_DIR,
                    true,
                ),
            ],
            rules: vec!["c 195:255 rw".into(), "c 508:1 rw".into()],
        }
    }

    const IMAGE: &[&str] = &["/dev", "/etc", "/etc/ld.so.preload", "/usr"];

    #[test]
    fn nodes_come_after_their_parents_then_mounts_after_their_targets_then_rules() {
        let mut fs = Recorder::with_existing(IMAGE);
        let report = write_container(&mut fs, typical()).expect("writes");
        assert_eq!(
            fs.effects,
            [
                d("/dev"),
                Effect::MakeNode("/dev/nvidiactl".into(), (0, 0)),
                d("/dev"),
                d("/dev/nvidia-caps"),
                Effect::MakeNode("/dev/nvidia-caps/nvidia-cap1".into(), (1000, 1000)),
                d("/usr"),
                d("/usr/local"),
                d("/usr/local/tessera"),
                Effect::CreateFile(CONTAINER_LIBRARY.into()),
                Effect::Attach(HOST_LIBRARY.into(), CONTAINER_LIBRARY.into()),
                d("/etc"),
                Effect::CreateFile("/etc/ld.so.preload".into()),
                Effect::Attach("/host/ld.so.preload".into(), "/etc/ld.so.preload".into()),
                d("/var"),
                d("/var/run"),
                d(ACCOUNTING_DIR),
                Effect::Attach(
                    "/var/lib/tessera/alloc/a-0/accounting".into(),
                    ACCOUNTING_DIR.into()
                ),
                Effect::Allow("c 195:255 rw".into()),
                Effect::Allow("c 508:1 rw".into()),
            ]
        );
        assert_eq!(
            report,
            Report {
                nodes_created: 2,
                nodes_existing: 0,
                mounts_created: 3,
                mounts_existing: 0,
                cgroup_rules: 2,
            }
        );
        assert_eq!(
            fs.mounted(),
            ["/etc/ld.so.preload", CONTAINER_LIBRARY, ACCOUNTING_DIR]
        );
    }

    #[test]
    fn a_failed_mount_undoes_the_nodes_made_before_it() {
        let mut fs = Recorder::with_existing(&["/dev"]).fail_on(Effect::Attach(
            HOST_LIBRARY.into(),
            CONTAINER_LIBRARY.into(),
        ));
        let writes = Writes {
            nodes: vec![
                gpu("/dev/nvidia0", 0, (0, 0)),
                gpu("/dev/nvidia-caps/nvidia-cap1", 1, (0, 0)),
            ],
            mounts: vec![library()],
            rules: vec!["c 195:0 rw".into()],
        };
        let e = write_container(&mut fs, writes).expect_err("the mount fails");
        assert_eq!(e.exit_code(), exit::APPLY);
        assert!(
            e.to_string().starts_with(&format!(
                "mount target {CONTAINER_LIBRARY} in the container"
            )),
            "{e}"
        );
        let attach = fs
            .effects
            .iter()
            .position(|e| matches!(e, Effect::Attach(..)))
            .expect("attached");
        assert_eq!(
            fs.effects[attach + 1..],
            [
                rm(CONTAINER_LIBRARY),
                rm("/usr/local/tessera"),
                rm("/usr/local"),
                rm("/usr"),
                rm("/dev/nvidia-caps/nvidia-cap1"),
                rm("/dev/nvidia-caps"),
                rm("/dev/nvidia0"),
            ],
            "undone newest first, no rule written"
        );
        assert_eq!(fs.existing(), ["/dev"], "only the image's entries are left");
    }

    #[test]
    fn a_failed_cgroup_rule_unmounts_before_removing_the_target() {
        let mut fs = Recorder::with_existing(IMAGE).fail_on(Effect::Allow("c 508:1 rw".into()));
        let e = write_container(&mut fs, typical()).expect_err("the second rule fails");
        assert_eq!(e.exit_code(), exit::APPLY);
        let failed = fs
            .effects
            .iter()
            .position(|e| *e == Effect::Allow("c 508:1 rw".into()))
            .expect("tried");
        assert_eq!(
            fs.effects[failed + 1..failed + 6],
            [
                Effect::Unmount(ACCOUNTING_DIR.into()),
                rm(ACCOUNTING_DIR),
                rm("/var/run"),
                rm("/var"),
                Effect::Unmount("/etc/ld.so.preload".into()),
            ]
        );
        assert!(
            !fs.effects.contains(&rm("/etc/ld.so.preload")),
            "the image's own file is unmounted, not removed"
        );
        assert_eq!(fs.existing(), IMAGE);
        assert!(fs.mounted().is_empty());
    }

    #[test]
    fn whichever_write_fails_the_container_is_left_as_it_was() {
        let mut clean = Recorder::with_existing(IMAGE);
        write_container(&mut clean, typical()).expect("writes");
        let calls = clean.effects.len();
        for n in 1..=calls {
            let mut fs = Recorder::with_existing(IMAGE).fail_call(n);
            let e = write_container(&mut fs, typical()).expect_err("call fails");
            assert_eq!(e.exit_code(), exit::APPLY, "call {n}");
            assert_eq!(fs.existing(), IMAGE, "call {n}: {:?}", fs.effects);
            assert!(fs.mounted().is_empty(), "call {n}: {:?}", fs.effects);
        }
    }

    #[test]
    fn a_second_run_creates_nothing_and_a_failure_then_removes_nothing() {
        let mut fs = Recorder::with_existing(IMAGE);
        write_container(&mut fs, typical()).expect("first run");
        let after_first = fs.existing().join(",");
        let report = write_container(&mut fs, typical()).expect("second run");
        assert_eq!(
            report,
            Report {
                nodes_created: 0,
                nodes_existing: 2,
                mounts_created: 0,
                mounts_existing: 3,
                cgroup_rules: 2,
            }
        );
        let mut fs = fs.fail_on(Effect::Allow("c 195:255 rw".into()));
        let before = fs.effects.len();
        write_container(&mut fs, typical()).expect_err("third run fails");
        assert!(
            !fs.effects[before..]
                .iter()
                .any(|e| matches!(e, Effect::Remove(_) | Effect::Unmount(_))),
            "nothing of an earlier run is undone"
        );
        assert_eq!(fs.existing().join(","), after_first);
    }

    #[test]
    fn a_failing_undo_step_does_not_stop_the_older_ones() {
        let mut fs = Recorder::with_existing(&["/dev"])
            .fail_on(Effect::Allow("c 195:1 rw".into()))
            .fail_on(rm("/dev/nvidia-caps/nvidia-cap1"));
        let writes = Writes {
            nodes: vec![
                gpu("/dev/nvidia0", 0, (0, 0)),
                gpu("/dev/nvidia-caps/nvidia-cap1", 1, (0, 0)),
            ],
            mounts: Vec::new(),
            rules: vec!["c 195:1 rw".into()],
        };
        write_container(&mut fs, writes).expect_err("the rule fails");
        assert!(fs.effects.ends_with(&[
            rm("/dev/nvidia-caps/nvidia-cap1"),
            rm("/dev/nvidia-caps"),
            rm("/dev/nvidia0"),
        ]));
        assert_eq!(
            fs.existing(),
            ["/dev", "/dev/nvidia-caps/nvidia-cap1"],
            "only the entry whose removal failed is left"
        );
    }

    #[test]
    fn node_errors_name_the_node_and_mount_errors_the_target() {
        let mut fs = Recorder::with_existing(&[]).fail_on(d("/dev"));
        let writes = Writes::<FakeSource> {
            nodes: vec![gpu("/dev/nvidia0", 0, (0, 0))],
            mounts: Vec::new(),
            rules: Vec::new(),
        };
        let e = write_container(&mut fs, writes).expect_err("mkdir fails");
        assert!(
            e.to_string()
                .starts_with("device node /dev/nvidia0 in the container: injected failure"),
            "{e}"
        );
        let mut fs = Recorder::with_existing(&["/usr"])
            .fail_on(Effect::CreateFile(CONTAINER_LIBRARY.into()));
        let writes = Writes {
            nodes: Vec::new(),
            mounts: vec![library()],
            rules: Vec::new(),
        };
        let e = write_container(&mut fs, writes).expect_err("create fails");
        assert!(
            e.to_string().starts_with(&format!(
                "mount target {CONTAINER_LIBRARY} in the container"
            )),
            "{e}"
        );
        assert_eq!(fs.existing(), ["/usr"]);
    }

    /// Writes `writes` with the real writer into the directory `dir` as the
    /// container's root (no device cgroup).
    fn write_into(dir: &std::path::Path, writes: Writes<Source>) -> Result<Report> {
        let procfs = Procfs::open().expect("/proc");
        let root = ContainerRoot::with_procfs(open_dir(dir, OFlags::PATH), &procfs).expect("root");
        let mut fs = InRoot {
            root: &root,
            procfs: &procfs,
            cgroup: None,
        };
        write_container(&mut fs, writes)
    }

    #[test]
    fn the_real_writer_undoes_a_run_that_fails_midway() {
        let t = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(t.path().join("etc")).expect("etc");
        std::fs::write(t.path().join("etc/passwd"), b"root:x:0:0::/:/bin/sh\n").expect("file");
        let writes = Writes::<Source> {
            nodes: vec![
                (node("/dev/tessera/fifo", NodeKind::Fifo, 0), own_ids()),
                // A file where a directory must be: fails after the first node.
                (node("/etc/passwd/fifo", NodeKind::Fifo, 0), own_ids()),
            ],
            mounts: Vec::new(),
            rules: Vec::new(),
        };
        let e = write_into(t.path(), writes).expect_err("not a directory");
        assert!(
            e.to_string()
                .starts_with("device node /etc/passwd/fifo in the container"),
            "{e}"
        );
        let mut left: Vec<String> = std::fs::read_dir(t.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["etc"], "/dev and what is in it were removed");
        assert!(t.path().join("etc/passwd").is_file());
    }

    #[test]
    fn the_real_writer_makes_parents_and_nodes_with_exact_modes() {
        let t = tempfile::tempdir().expect("tempdir");
        let mut fifo = node("/dev/tessera/fifo", NodeKind::Fifo, 0);
        fifo.mode = 0o606;
        let writes = Writes::<Source> {
            nodes: vec![(fifo, own_ids())],
            mounts: Vec::new(),
            rules: vec!["c 195:0 rw".into()],
        };
        let report = write_into(t.path(), writes).expect("writes");
        assert_eq!((report.nodes_created, report.cgroup_rules), (1, 1));
        let mode = crate::testing::mode_of;
        assert_eq!(mode(&t.path().join("dev")), 0o755);
        assert_eq!(mode(&t.path().join("dev/tessera")), 0o755);
        assert_eq!(mode(&t.path().join("dev/tessera/fifo")), 0o606);
    }
}
