//! The writes legacy injection makes inside a container, behind one small
//! trait: make a directory, a device node or an empty file, attach a bind
//! mount, allow a device in the device cgroup — and undo a creation.
//!
//! [`InRoot`] is the real writer: every path resolved in the container root
//! fd ([`crate::rootfs`]), mounts attached by fd ([`crate::mounts`]), rules
//! written to the open `devices.allow` ([`crate::cgroup`]). Tests swap in
//! `recorder::Recorder` (test builds), which records each call, can fail any of them,
//! and needs neither root nor a container; the order of the writes and the
//! undoing of a failed run (`apply::write_container`) are tested against it.

use std::fmt;
use std::io;

use crate::cgroup::DeviceCgroup;
use crate::error::Result;
use crate::journal::{self, Created, Journal};
use crate::mounts::Source;
use crate::plan::{ContainerPath, MountPlan, NodePlan};
use crate::procfs::Procfs;
use crate::rootfs::{ContainerRoot, Outcome};

/// A bind-mount source ready to attach: what the spec asked for, and
/// whether the source is a directory (its target is made to match).
pub trait MountSource {
    /// The planned mount.
    fn plan(&self) -> &MountPlan;
    /// Whether the source is a directory (else a regular file).
    fn is_dir(&self) -> bool;
}

impl MountSource for Source {
    fn plan(&self) -> &MountPlan {
        &self.plan
    }

    fn is_dir(&self) -> bool {
        Source::is_dir(self)
    }
}

/// The container-side effects of legacy injection. Every creation is
/// recorded in the journal it is given, so a failed run can be undone
/// through [`ContainerFs::undo`], newest first.
pub trait ContainerFs {
    /// What undoing one creation needs.
    type Made: fmt::Debug;
    /// A mount source ready to attach.
    type Source: MountSource;

    /// Makes the directory `path` (mode 0755) in its existing parent, unless
    /// an entry of that name is there.
    fn make_dir(
        &mut self,
        path: &ContainerPath,
        journal: &mut Journal<Self::Made>,
    ) -> io::Result<Outcome>;

    /// Makes the device node `node` in its existing parent, owned by the
    /// host ids `owner`, unless the same node is there.
    fn make_node(
        &mut self,
        node: &NodePlan,
        owner: (u32, u32),
        journal: &mut Journal<Self::Made>,
    ) -> io::Result<Outcome>;

    /// Creates the empty file `path` (mode 0644) in its existing parent,
    /// unless an entry of that name is there.
    fn create_file(
        &mut self,
        path: &ContainerPath,
        journal: &mut Journal<Self::Made>,
    ) -> io::Result<Outcome>;

    /// Attaches `source` onto its (existing) target, unless it is there.
    fn attach_mount(
        &mut self,
        source: Self::Source,
        journal: &mut Journal<Self::Made>,
    ) -> Result<Outcome>;

    /// Allows a device in the container's device cgroup (`c 195:0 rw`).
    fn allow_device(&mut self, rule: &str) -> Result<()>;

    /// Undoes one creation.
    fn undo(&mut self, made: Self::Made) -> io::Result<()>;
}

/// The real writer: the container's root, the hook's `/proc` and the
/// container's `devices.allow`, if rules are to be written. Used inside the
/// container's mount namespace.
#[derive(Debug)]
pub struct InRoot<'a> {
    /// The container's root.
    pub root: &'a ContainerRoot,
    /// The hook's checked `/proc`.
    pub procfs: &'a Procfs,
    /// The container's device cgroup.
    pub cgroup: Option<&'a DeviceCgroup>,
}

impl ContainerFs for InRoot<'_> {
    type Made = Created;
    type Source = Source;

    fn make_dir(&mut self, path: &ContainerPath, journal: &mut Journal) -> io::Result<Outcome> {
        self.root.make_dir(path.components(), journal)
    }

    fn make_node(
        &mut self,
        node: &NodePlan,
        (uid, gid): (u32, u32),
        journal: &mut Journal,
    ) -> io::Result<Outcome> {
        self.root.create_node(node, uid, gid, journal)
    }

    fn create_file(&mut self, path: &ContainerPath, journal: &mut Journal) -> io::Result<Outcome> {
        self.root.create_file(path, journal)
    }

    fn attach_mount(&mut self, source: Source, journal: &mut Journal) -> Result<Outcome> {
        source.attach(self.root, self.procfs, journal)
    }

    fn allow_device(&mut self, rule: &str) -> Result<()> {
        match self.cgroup {
            Some(cgroup) => cgroup.allow(rule),
            None => Ok(()),
        }
    }

    fn undo(&mut self, made: Created) -> io::Result<()> {
        journal::undo(&made, Some(self.procfs))
    }
}

/// A [`ContainerFs`] that records every call, keeps a model of which paths
/// exist and are mounted, and fails the calls it is told to.
#[cfg(test)]
pub mod recorder {
    use std::collections::BTreeSet;
    use std::io;

    use super::{ContainerFs, MountSource};
    use crate::error::{HookError, Result};
    use crate::journal::Journal;
    use crate::plan::{ContainerPath, MountPlan, NodePlan};
    use crate::rootfs::Outcome;

    /// One call on the container filesystem, with the container path it concerns.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Effect {
        /// `make_dir`.
        MakeDir(String),
        /// `make_node`, with the node's host owner.
        MakeNode(String, (u32, u32)),
        /// `create_file`.
        CreateFile(String),
        /// `attach_mount`: host source, container target.
        Attach(String, String),
        /// `allow_device`.
        Allow(String),
        /// `undo` of a directory, node or file.
        Remove(String),
        /// `undo` of a mount.
        Unmount(String),
    }

    /// What the recorder undoes.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Made {
        /// A directory, node or file at this path.
        Entry(String),
        /// A mount on this target.
        Mount(String),
    }

    /// A mount source standing in for a detached mount.
    #[derive(Debug, Clone)]
    pub struct FakeSource {
        /// The planned mount.
        pub plan: MountPlan,
        /// Whether the source is a directory.
        pub dir: bool,
    }

    impl MountSource for FakeSource {
        fn plan(&self) -> &MountPlan {
            &self.plan
        }

        fn is_dir(&self) -> bool {
            self.dir
        }
    }

    /// Which calls fail.
    #[derive(Debug, Clone)]
    enum Fault {
        /// The n-th call (1-based, undo calls counted).
        Nth(usize),
        /// Every call equal to this one.
        On(Effect),
    }

    /// The recording container filesystem.
    #[derive(Debug, Default)]
    pub struct Recorder {
        /// Every call, in order, failed ones included.
        pub effects: Vec<Effect>,
        existing: BTreeSet<String>,
        mounted: BTreeSet<String>,
        faults: Vec<Fault>,
    }

    impl Recorder {
        /// A container whose image holds `paths` (directories or files).
        pub fn with_existing(paths: &[&str]) -> Recorder {
            Recorder {
                existing: paths.iter().map(|p| (*p).to_owned()).collect(),
                ..Recorder::default()
            }
        }

        /// Targets that already show their source (a second run).
        pub fn with_mounted(mut self, targets: &[&str]) -> Recorder {
            self.mounted = targets.iter().map(|p| (*p).to_owned()).collect();
            self
        }

        /// Fails the `n`-th call (1-based; undo calls count too).
        pub fn fail_call(mut self, n: usize) -> Recorder {
            self.faults.push(Fault::Nth(n));
            self
        }

        /// Fails every call equal to `effect`.
        pub fn fail_on(mut self, effect: Effect) -> Recorder {
            self.faults.push(Fault::On(effect));
            self
        }

        /// The paths that exist now, sorted.
        pub fn existing(&self) -> Vec<&str> {
            self.existing.iter().map(String::as_str).collect()
        }

        /// The targets mounted now, sorted.
        pub fn mounted(&self) -> Vec<&str> {
            self.mounted.iter().map(String::as_str).collect()
        }

        fn call(&mut self, effect: Effect) -> io::Result<()> {
            self.effects.push(effect.clone());
            let n = self.effects.len();
            let fails = self.faults.iter().any(|f| match f {
                Fault::Nth(k) => *k == n,
                Fault::On(e) => *e == effect,
            });
            if fails {
                Err(io::Error::other(format!("injected failure of {effect:?}")))
            } else {
                Ok(())
            }
        }

        fn create(
            &mut self,
            effect: Effect,
            path: String,
            journal: &mut Journal<Made>,
        ) -> io::Result<Outcome> {
            self.call(effect)?;
            if !self.existing.insert(path.clone()) {
                return Ok(Outcome::Existing);
            }
            journal.push(Made::Entry(path));
            Ok(Outcome::Created)
        }
    }

    impl ContainerFs for Recorder {
        type Made = Made;
        type Source = FakeSource;

        fn make_dir(
            &mut self,
            path: &ContainerPath,
            journal: &mut Journal<Made>,
        ) -> io::Result<Outcome> {
            let path = path.to_string();
            self.create(Effect::MakeDir(path.clone()), path, journal)
        }

        fn make_node(
            &mut self,
            node: &NodePlan,
            owner: (u32, u32),
            journal: &mut Journal<Made>,
        ) -> io::Result<Outcome> {
            let path = node.path.to_string();
            self.create(Effect::MakeNode(path.clone(), owner), path, journal)
        }

        fn create_file(
            &mut self,
            path: &ContainerPath,
            journal: &mut Journal<Made>,
        ) -> io::Result<Outcome> {
            let path = path.to_string();
            self.create(Effect::CreateFile(path.clone()), path, journal)
        }

        fn attach_mount(
            &mut self,
            source: FakeSource,
            journal: &mut Journal<Made>,
        ) -> Result<Outcome> {
            let target = source.plan.target.to_string();
            self.call(Effect::Attach(
                source.plan.host_path.clone(),
                target.clone(),
            ))
            .map_err(|e| HookError::apply(format!("mount target {target} in the container"), e))?;
            if !self.mounted.insert(target.clone()) {
                return Ok(Outcome::Existing);
            }
            journal.push(Made::Mount(target));
            Ok(Outcome::Created)
        }

        fn allow_device(&mut self, rule: &str) -> Result<()> {
            self.call(Effect::Allow(rule.to_owned()))
                .map_err(|e| HookError::apply(format!("writing {rule:?} to devices.allow"), e))
        }

        fn undo(&mut self, made: Made) -> io::Result<()> {
            match made {
                Made::Entry(path) => {
                    self.call(Effect::Remove(path.clone()))?;
                    self.existing.remove(&path);
                }
                Made::Mount(target) => {
                    self.call(Effect::Unmount(target.clone()))?;
                    self.mounted.remove(&target);
                }
            }
            Ok(())
        }
    }
}
