//! Fixtures for `tessera-hook` end-to-end tests: the static hook binary, a
//! root-owned scratch area, a simulated node with its static CDI spec, a
//! transient `tessera.io/alloc` spec built with `tessera_model::cdi`, the
//! hook's config file, and small C helpers (a static no-op hook, the
//! NVIDIAScape library).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use tessera_model::cdi::transient::{BIND_STAGE, BIND_VERB, UNBIND_STAGE};
use tessera_model::cdi::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
use tessera_model::contract::cdi::ALLOC_KIND;
use tessera_model::contract::env::ALLOC_ID as ALLOC_ID_ENV;

use tessera_test_support::node::{ExpectedNode, NodeView, SimNode};
use tessera_test_support::oci::{Bundle, HookEntry};
use tessera_test_support::rootfs::busybox_rootfs;
pub use tessera_test_support::rootfs::{SCRATCH_BASE, scratch_dir};
use tessera_test_support::{Need, artefact, run};
pub use tessera_test_support::{hook_binary, podman::podman_with_hooks};

/// The alloc id the tests give their containers.
pub const ALLOC_ID: &str = "pod-1234-0";

/// The annotation that names a container's allocation.
pub const ALLOC_ANNOTATION: &str = "tessera.io/alloc-id";

/// The environment every hook entry Tessera emits carries.
pub const HOOK_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

/// Where the vGPU library, the preload file and the limits file appear in a container.
pub const LIBRARY_IN_CONTAINER: &str = "/usr/local/tessera/libtessera_vgpu.so";
/// `/etc/ld.so.preload` in the container.
pub const PRELOAD_IN_CONTAINER: &str = "/etc/ld.so.preload";
/// The limits file in the container.
pub const LIMITS_IN_CONTAINER: &str = "/usr/local/tessera/vgpu.json";

/// Everything a hook test needs on the host side: a simulated node, the CDI
/// directory with the static spec and one transient spec, the hook's state
/// directory and config, and the host files the spec mounts.
pub struct HookFixture {
    dir: tempfile::TempDir,
    /// The simulated node's root.
    pub node_root: PathBuf,
    /// What the node holds, read independently of the code under test.
    pub node: NodeView,
    /// The hook's `cdi_dir`.
    pub cdi_dir: PathBuf,
    /// The hook's `state_dir`.
    pub state_dir: PathBuf,
    /// The hook's config file.
    pub config: PathBuf,
    /// Host files the transient spec mounts: (host path, container path,
    /// content as written).
    pub mounted_files: Vec<(PathBuf, String, String)>,
    /// The device nodes the allocation grants (control nodes, the A100's node
    /// and the two capability nodes of one of its MIG devices).
    pub granted: Vec<ExpectedNode>,
    /// NVIDIA nodes of the node that the allocation does not grant.
    pub withheld: Vec<ExpectedNode>,
    bundles: Mutex<u32>,
}

impl HookFixture {
    /// Builds the fixture with the transient spec for [`ALLOC_ID`] and a hook
    /// config that does not accept `NVIDIA_VISIBLE_DEVICES`.
    pub fn new(tag: &str) -> Result<Self> {
        let dir = scratch_dir(tag)?;
        let node_root = dir.path().join("node");
        // The caller has required the prerequisites; a skip here is a broken setup.
        SimNode::profile("demo")
            .at(&node_root)
            .build()
            .map_err(|skip| anyhow::anyhow!("simulated node: {}", skip.reason))?;
        let node = NodeView::read(&node_root)?;
        let cdi_dir = dir.path().join("cdi");
        let state_dir = dir.path().join("state");
        let files = dir.path().join("files");
        for d in [&cdi_dir, &state_dir, &files] {
            fs::create_dir_all(d)?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
        }
        run(Command::new(artefact("tessera-cdi"))
            .args(["generate", "--driver-root"])
            .arg(&node_root)
            .arg("--hook-path")
            .arg(hook_binary())
            .arg("--output")
            .arg(cdi_dir.join("tessera.io-gpu.json")))?;

        let (granted, withheld) = allocation_nodes(&node);
        let mig_uuid = node
            .mig_devices()
            .first()
            .map(|m| m.1.clone())
            .context("the demo node has a MIG device")?;
        let limits = serde_json::json!({
            "version": 1,
            "devices": [{"uuid": mig_uuid, "memoryLimitMiB": 4000, "smLimitPercent": 50}],
        });
        let mounted_files = vec![
            (
                files.join("libtessera_vgpu.so"),
                LIBRARY_IN_CONTAINER.to_owned(),
                "stand-in for libtessera_vgpu.so (e2e fixture)\n".to_owned(),
            ),
            (
                files.join("ld.so.preload"),
                PRELOAD_IN_CONTAINER.to_owned(),
                format!("{LIBRARY_IN_CONTAINER}\n"),
            ),
            (
                files.join("vgpu.json"),
                LIMITS_IN_CONTAINER.to_owned(),
                format!("{limits}\n"),
            ),
        ];
        for (path, _, content) in &mounted_files {
            fs::write(path, content)?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o644))?;
        }

        let fixture = Self {
            config: dir.path().join("hook.toml"),
            dir,
            node_root,
            node,
            cdi_dir,
            state_dir,
            mounted_files,
            granted,
            withheld,
            bundles: Mutex::new(0),
        };
        fixture.write_config(false)?;
        fixture.write_transient_spec(ALLOC_ID)?;
        Ok(fixture)
    }

    /// The scratch directory everything lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes the hook's config file.
    pub fn write_config(&self, accept_nvidia_visible_devices: bool) -> Result<()> {
        fs::write(
            &self.config,
            format!(
                "cdi_dir = {:?}\nstate_dir = {:?}\naccept_nvidia_visible_devices = {accept_nvidia_visible_devices}\n",
                self.cdi_dir.display().to_string(),
                self.state_dir.display().to_string(),
            ),
        )?;
        Ok(())
    }

    /// The transient spec of `alloc_id`, as the device plugin would write it:
    /// the granted nodes, the vGPU library, preload and limits mounts, the
    /// limits and `TESSERA_ALLOC_ID` in the environment, and the hook at
    /// `createContainer` and `poststop` with this fixture's config — complete
    /// by the contract ([`Spec::validate_tessera`]).
    pub fn transient_spec(&self, alloc_id: &str) -> Result<Spec> {
        let device_nodes = self
            .granted
            .iter()
            .map(|n| DeviceNode {
                host_path: Some(
                    self.node_root
                        .join(n.path.trim_start_matches('/'))
                        .display()
                        .to_string(),
                ),
                permissions: Some("rw".to_owned()),
                ..DeviceNode::char(n.path.clone(), n.major, n.minor)
            })
            .collect();
        let mounts = self
            .mounted_files
            .iter()
            .map(|(host, container, _)| Mount {
                host_path: host.display().to_string(),
                container_path: container.clone(),
                options: ["ro", "nosuid", "nodev", "bind", "rprivate"]
                    .map(str::to_owned)
                    .to_vec(),
                mount_type: None,
            })
            .collect();
        let hook = |stage: &str, verb: &str| Hook {
            hook_name: stage.to_owned(),
            path: hook_binary().display().to_string(),
            args: self.hook_args(verb),
            env: vec![HOOK_ENV.to_owned()],
            timeout: None,
        };
        let edits = ContainerEdits {
            env: vec![
                "CUDA_DEVICE_MEMORY_LIMIT=4000m".to_owned(),
                format!("{ALLOC_ID_ENV}={alloc_id}"),
            ],
            device_nodes,
            mounts,
            hooks: vec![
                hook(BIND_STAGE, BIND_VERB),
                hook(UNBIND_STAGE, UNBIND_STAGE),
            ],
            ..ContainerEdits::default()
        };
        let spec = Spec::new(
            ALLOC_KIND,
            vec![Device::new(alloc_id, edits)],
            ContainerEdits::default(),
        )?;
        if let Err(problems) = spec.validate_tessera() {
            bail!("the fixture's transient spec breaks the contract: {problems:?}");
        }
        Ok(spec)
    }

    /// Path of the transient spec of `alloc_id`.
    pub fn transient_spec_path(&self, alloc_id: &str) -> PathBuf {
        self.cdi_dir
            .join(format!("tessera.io-alloc_{alloc_id}.json"))
    }

    /// Writes the transient spec of `alloc_id` (mode 0644).
    pub fn write_transient_spec(&self, alloc_id: &str) -> Result<PathBuf> {
        let path = self.transient_spec_path(alloc_id);
        fs::write(
            &path,
            serde_json::to_vec_pretty(&self.transient_spec(alloc_id)?)?,
        )?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
        Ok(path)
    }

    /// The hook's argv for `verb` with this fixture's config.
    pub fn hook_args(&self, verb: &str) -> Vec<String> {
        vec![
            "tessera-hook".to_owned(),
            verb.to_owned(),
            "--config".to_owned(),
            self.config.display().to_string(),
        ]
    }

    /// A hook entry running the static hook with `verb`, an explicit env.
    pub fn hook_entry(&self, verb: &str) -> HookEntry {
        HookEntry {
            path: hook_binary(),
            args: self.hook_args(verb),
            env: Some(vec![HOOK_ENV.to_owned()]),
        }
    }

    /// A fresh bundle (busybox rootfs, `runc spec` config) running `script`.
    pub fn bundle(&self, script: &str) -> Result<Bundle> {
        let n = {
            let mut next = self.bundles.lock().expect("bundle counter");
            *next += 1;
            *next
        };
        let dir = self.dir.path().join(format!("bundle-{n}"));
        fs::create_dir_all(&dir)?;
        busybox_rootfs(&dir)?;
        Bundle::new(&dir, script)
    }

    /// A bundle for a GPU container of [`ALLOC_ID`]: annotated, with the hook
    /// at `stage` (`prestart` or `createContainer`) and at `poststop`.
    pub fn gpu_bundle(&self, stage: &str, script: &str) -> Result<Bundle> {
        let mut bundle = self.bundle(script)?;
        bundle
            .annotate(ALLOC_ANNOTATION, ALLOC_ID)
            .hook(stage, &self.hook_entry("prestart"))
            .hook("poststop", &self.hook_entry("poststop"));
        Ok(bundle)
    }

    /// The binding directory of `alloc_id`.
    pub fn binding_dir(&self, alloc_id: &str) -> PathBuf {
        self.state_dir.join("alloc").join(alloc_id)
    }

    /// Every regular file under the binding directory of `alloc_id` whose
    /// content names `container_id`: the binding record(s).
    pub fn binding_records(&self, alloc_id: &str, container_id: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut stack = vec![self.binding_dir(alloc_id)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(meta) = fs::symlink_metadata(&path) else {
                    continue;
                };
                if meta.is_dir() {
                    stack.push(path);
                } else if meta.is_file()
                    && fs::read_to_string(&path).is_ok_and(|t| t.contains(container_id))
                {
                    found.push(path);
                }
            }
        }
        found
    }
}

/// Splits the node's NVIDIA nodes into those the test allocation grants — the
/// control nodes, the A100's node and the cap nodes of its first MIG device —
/// and the rest (the H100's node, the other MIG devices' cap nodes).
fn allocation_nodes(node: &NodeView) -> (Vec<ExpectedNode>, Vec<ExpectedNode>) {
    let migs = node.mig_devices();
    let (gpu, _, gi, ci) = migs.first().cloned().expect("demo node has MIG devices");
    let mut granted = node.control_nodes();
    granted.push(node.gpu_node(gpu));
    granted.extend(node.mig_cap_nodes(gpu, gi, ci));
    granted.sort();
    let mut withheld = vec![node.gpu_node(if gpu == 0 { 1 } else { 0 })];
    for (g, _, gi2, ci2) in &migs[1..] {
        withheld.extend(node.mig_cap_nodes(*g, *gi2, *ci2));
    }
    withheld.retain(|n| !granted.contains(n));
    withheld.sort();
    withheld.dedup();
    (granted, withheld)
}

/// The probe a GPU container runs: its NVIDIA nodes (`NODE <stat>`), what
/// opening each granted node says (`OPEN`), the mounted files' content
/// (`READ`), what appending to them says (`WRITE`), and their mounts (`MOUNT`).
pub fn probe_script(granted: &[ExpectedNode]) -> String {
    let nodes: Vec<&str> = granted.iter().map(|n| n.path.as_str()).collect();
    let files = [
        LIBRARY_IN_CONTAINER,
        PRELOAD_IN_CONTAINER,
        LIMITS_IN_CONTAINER,
    ]
    .join(" ");
    format!(
        "for f in $(find /dev -name 'nvidia*' ! -type d); do stat -c 'NODE %n %F %t %T' $f; done; \
         for f in {nodes}; do echo \"OPEN $f: $(cat $f 2>&1 >/dev/null)\"; done; \
         for f in {files}; do echo \"READ $f: $(cat $f 2>&1 | tr '\\n' ' ')\"; \
           echo \"WRITE $f: $( (echo x >> $f) 2>&1 && echo WROTE)\"; done; \
         grep -E ' (/usr/local/tessera|/etc/ld.so.preload)' /proc/self/mounts | sed 's/^/MOUNT /'; \
         echo PROBE-DONE",
        nodes = nodes.join(" "),
    )
}

/// `/proc/<pid>/cgroup`, read here independently of the hook, as the binding's `cgroups` map (controllers joined
/// with `,`, `""` for v2 → path) and the `cgroup` the contract picks: the v2
/// path where the host uses v2 (a path other than `/`), else the `memory`
/// controller's, else the v2 path, else the first.
pub fn host_cgroups(pid: u32) -> Result<(BTreeMap<String, String>, String), String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("/proc/{pid}/cgroup: {e}"))?;
    let mut map = BTreeMap::new();
    let mut v2 = None;
    let mut memory = None;
    let mut first = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        first.get_or_insert_with(|| path.to_owned());
        if hierarchy == "0" && controllers.is_empty() {
            v2 = Some(path.to_owned());
        }
        if controllers.split(',').any(|c| c == "memory") {
            memory = Some(path.to_owned());
        }
        map.insert(controllers.to_owned(), path.to_owned());
    }
    let preferred = match (v2, memory) {
        (Some(v2), _) if v2 != "/" => v2,
        (_, Some(m)) => m,
        (Some(v2), None) => v2,
        (None, None) => first.unwrap_or_default(),
    };
    Ok((map, preferred))
}

/// The lines of `output` that start with `prefix` and a space, without it.
pub fn tagged<'a>(output: &'a str, prefix: &str) -> Vec<&'a str> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix(prefix)?.strip_prefix(' '))
        .collect()
}

static HELPERS: Mutex<()> = Mutex::new(());

/// Compiles a small C helper once per machine into `SCRATCH_BASE/bin`
/// (keyed by a hash of its source and flags) and returns its path.
pub fn c_helper(name: &str, source: &str, flags: &[&str]) -> Result<PathBuf> {
    let _guard = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
    let key = source
        .bytes()
        .chain(flags.iter().flat_map(|f| f.bytes()))
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    let bin_dir = Path::new(SCRATCH_BASE).join("bin");
    fs::create_dir_all(&bin_dir)?;
    let out = bin_dir.join(format!("{name}-{key:016x}"));
    if out.exists() {
        return Ok(out);
    }
    let src = bin_dir.join(format!("{name}-{key:016x}.{}.c", std::process::id()));
    fs::write(&src, source)?;
    let tmp = bin_dir.join(format!("{name}-{key:016x}.{}.tmp", std::process::id()));
    let status = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .status()
        .context("running cc (apt-get install build-essential)")?;
    let _ = fs::remove_file(&src);
    if !status.success() {
        bail!("cc {flags:?} {name} failed: {status}");
    }
    fs::rename(&tmp, &out)?;
    Ok(out)
}

/// A program that reads its stdin to the end and does nothing else — or,
/// given a path as its first argument, also appends a line to that file.
/// (It drains stdin because a runtime fails — crun with `writing to pipe:
/// Broken pipe` — when a hook exits before the runtime has written the state.)
const NOOP_C: &str = "#include <fcntl.h>\n#include <unistd.h>\n\
     int main(int argc, char **argv) {\n\
       char buf[4096];\n\
       while (read(0, buf, sizeof buf) > 0) {}\n\
       if (argc > 1) { int fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);\n\
         if (fd >= 0) { (void)write(fd, \"ran\\n\", 4); close(fd); } }\n\
       return 0;\n}\n";

/// [`NOOP_C`] statically linked: the baseline hook, what a runtime does with
/// a hostile rootfs when the hook does nothing.
pub fn static_noop() -> Result<PathBuf> {
    c_helper("static-noop", NOOP_C, &["-static", "-O2"])
}

/// [`NOOP_C`] dynamically linked (it has a program interpreter, so the
/// loader honours `LD_PRELOAD`): the NVIDIAScape positive control.
pub fn dynamic_noop() -> Result<PathBuf> {
    c_helper("dynamic-noop", NOOP_C, &["-O2"])
}

/// The NVIDIAScape library: its constructor appends a line to the file named
/// by `TESSERA_E2E_MARKER` in the environment of whatever process loads it.
pub fn evil_library() -> Result<PathBuf> {
    c_helper(
        "evil-so",
        "#include <fcntl.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         __attribute__((constructor)) static void evil(void) {\n\
           const char *marker = getenv(\"TESSERA_E2E_MARKER\");\n\
           if (!marker) return;\n\
           int fd = open(marker, O_WRONLY | O_CREAT | O_APPEND, 0644);\n\
           if (fd >= 0) { (void)write(fd, \"loaded\\n\", 7); close(fd); }\n}\n",
        &["-shared", "-fPIC", "-O2"],
    )
}

impl HookFixture {
    /// What is wrong with a GPU container's [`probe_script`] output, one line
    /// each: its NVIDIA nodes must be exactly the granted ones with the node's
    /// numbers, each must pass the device cgroup (ENXIO, not EPERM), and each
    /// mounted file must read as the host file and refuse writes.
    pub fn probe_problems(&self, output: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if !output.contains("PROBE-DONE") {
            problems.push("the probe did not finish".to_owned());
        }
        let stat = tagged(output, "NODE").join("\n");
        match tessera_test_support::node::parse_stat_lines(&stat) {
            Ok(seen) => {
                if seen != self.granted {
                    problems.push(format!(
                        "device nodes: want {:?}, saw {seen:?}",
                        self.granted
                    ));
                }
                for node in seen.iter().filter(|n| self.withheld.contains(n)) {
                    problems.push(format!("sees {} which it was not given", node.path));
                }
            }
            Err(e) => problems.push(format!("stat output: {e:#}")),
        }
        let opened = tagged(output, "OPEN");
        if opened.len() != self.granted.len() {
            problems.push(format!("OPEN lines: {opened:?}"));
        }
        for line in opened {
            if !line.contains("No such device or address") {
                problems.push(format!(
                    "open should reach the (absent) driver past the device cgroup: {line}"
                ));
            }
        }
        let reads = tagged(output, "READ");
        let writes = tagged(output, "WRITE");
        let mounts = tagged(output, "MOUNT");
        for (host, container, content) in &self.mounted_files {
            if fs::read_to_string(host).ok().as_ref() != Some(content) {
                problems.push(format!("host file {} changed", host.display()));
            }
            let want = content.replace('\n', " ");
            let prefix = format!("{container}: ");
            match reads.iter().find_map(|l| l.strip_prefix(&prefix)) {
                Some(got) if got == want => {}
                other => problems.push(format!("{container}: read {other:?}, want {want:?}")),
            }
            match writes.iter().find_map(|l| l.strip_prefix(&prefix)) {
                Some(got) if got.contains("Read-only file system") && !got.contains("WROTE") => {}
                other => problems.push(format!(
                    "{container}: a write should fail with EROFS, got {other:?}"
                )),
            }
            let mounted_ro = mounts.iter().any(|m| {
                let fields: Vec<&str> = m.split(' ').collect();
                fields.get(1) == Some(&container.as_str())
                    && fields
                        .get(3)
                        .is_some_and(|o| o.split(',').any(|x| x == "ro"))
            });
            if !mounted_ro {
                problems.push(format!("{container}: no read-only mount in {mounts:?}"));
            }
        }
        problems
    }
}

impl HookFixture {
    /// Puts the allocation's edits into the bundle's `config.json` the way a
    /// CDI-capable runtime (or containerd 1.6 from a native Allocate answer)
    /// does: `linux.devices`, a device-cgroup allow rule per node, and the
    /// read-only bind mounts. The runtime then creates everything itself.
    pub fn apply_edits_like_a_runtime(&self, bundle: &mut Bundle) {
        let config = bundle.config_mut();
        let devices: Vec<serde_json::Value> = self
            .granted
            .iter()
            .map(|n| {
                serde_json::json!({
                    "path": n.path, "type": "c", "major": n.major, "minor": n.minor,
                    "fileMode": 0o666, "uid": 0, "gid": 0,
                })
            })
            .collect();
        config["linux"]["devices"] = serde_json::json!(devices);
        let rules = &mut config["linux"]["resources"]["devices"];
        if !rules.is_array() {
            *rules = serde_json::json!([]);
        }
        if let Some(rules) = rules.as_array_mut() {
            for n in &self.granted {
                rules.push(serde_json::json!({
                    "allow": true, "type": "c", "major": n.major, "minor": n.minor, "access": "rw",
                }));
            }
        }
        if let Some(mounts) = config["mounts"].as_array_mut() {
            for (host, container, _) in &self.mounted_files {
                mounts.push(serde_json::json!({
                    "destination": container,
                    "type": "bind",
                    "source": host,
                    "options": ["ro", "nosuid", "nodev", "bind", "rprivate"],
                }));
            }
        }
    }
}

/// What an end-to-end test needs besides `programs`: root, a simulated node
/// (device nodes, the stand-ins), `tessera-cdi` and busybox — for
/// [`tessera_test_support::require`].
pub fn needs(programs: &[&'static str]) -> Vec<Need> {
    let mut needs = vec![
        Need::Root,
        Need::DeviceNodes,
        Need::Built("tessera-cdi"),
        Need::Program("busybox"),
    ];
    needs.extend(SimNode::profile("demo").needs());
    needs.extend(programs.iter().map(|p| Need::Program(p)));
    needs
}
