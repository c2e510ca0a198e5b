//! What the hook reads from `/proc` to prove a container's init — `status`
//! (`Pid`, `PPid`, `NSpid`), `mountinfo`, `cgroup` — and `linux.cgroupsPath`: the
//! parsers never panic, and the rules never accept a candidate whose mount
//! table lacks the rootfs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_hook::identity::{self, CandidateView, Expected, NsRequest, ProcFacts};
use tessera_hook::procfs::{self, NsId};
use tessera_model::proc;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Four inputs from one: status, mountinfo, cgroup, cgroupsPath.
    let mut parts = text.splitn(4, '\u{1e}');
    let status = parts.next().unwrap_or_default();
    let mountinfo = parts.next().unwrap_or_default();
    let cgroup = parts.next().unwrap_or_default();
    let cgroups_path = parts.next().unwrap_or_default();

    let nspid = proc::parse_nspid(status).unwrap_or_else(|| vec![60]);
    let _ = proc::parse_status(status);
    let mounts = procfs::parse_mountinfo(mountinfo);
    let cgroups = procfs::parse_cgroup(cgroup);
    for entry in &cgroups {
        let _ = identity::cgroup_matches(&entry.path, cgroups_path);
    }

    let facts = |pid, ppid, nspid: Vec<u32>, mnt, pid_ns| ProcFacts {
        pid,
        ppid,
        nspid,
        mnt: NsId::fake(mnt),
        pid_ns: NsId::fake(pid_ns),
    };
    let hook = facts(70, 50, vec![70], 1, 1);
    let parent = facts(50, 40, vec![50], 1, 1);
    let rootfs = "/run/b/rootfs".to_owned();
    let view = CandidateView {
        facts: facts(60, 50, nspid, 2, 2),
        mounts,
        cgroups,
        cgroups_absolute: true,
    };
    let expected = Expected {
        mount: NsRequest::New,
        pid: NsRequest::New,
        mounts_under_rootfs: vec![format!("{rootfs}/proc")],
        rootfs: rootfs.clone(),
        cgroups_path: (!cgroups_path.is_empty()).then(|| cgroups_path.to_owned()),
    };
    let has_rootfs = view.mounts.iter().any(|m| m.mount_point == rootfs);
    if let Ok(proven) = identity::prove(&hook, &parent, &[50, 40, 1], &view, &expected) {
        assert!(has_rootfs, "proven without a mount on the rootfs");
        assert_eq!(proven.init_pid, 60);
    }
});
