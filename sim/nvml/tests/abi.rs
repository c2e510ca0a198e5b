//! The built `libtessera_sim_nvml.so`, loaded from a simulated node root and
//! called through `nvml-wrapper-sys`'s bindgen declarations of `nvml.h`: the
//! same symbols, signatures and struct layouts a program using real NVML uses.

mod common;

use std::ffi::{CStr, CString, c_char, c_uint};
use std::mem::{size_of, zeroed};
use std::ptr;

use nvml_wrapper_sys::bindings::*;
use tessera_sim::state::NodeState;

use common::{CHILD_ROLE, CHILD_ROOT, LIB_IN_ROOT, MIB, SimNode, assert_child_ok, gpu};

const SUCCESS: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const UNINITIALIZED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID_ARGUMENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const DRIVER_NOT_LOADED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
const IN_USE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_IN_USE;
const INSUFFICIENT_RESOURCES: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
const VERSION_MISMATCH: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// `NVML_STRUCT_VERSION(name, v)`, computed from the bindings' struct sizes.
const fn version_of<T>(v: u32) -> c_uint {
    (size_of::<T>() as c_uint) | (v << 24)
}
const GI_INFO_V2: c_uint = version_of::<nvmlGpuInstanceProfileInfo_v2_t>(2);
const GI_INFO_V3: c_uint = version_of::<nvmlGpuInstanceProfileInfo_v3_t>(3);
const CI_INFO_V2: c_uint = version_of::<nvmlComputeInstanceProfileInfo_v2_t>(2);
const CI_INFO_V3: c_uint = version_of::<nvmlComputeInstanceProfileInfo_v3_t>(3);
const MEMORY_V2: c_uint = version_of::<nvmlMemory_v2_t>(2);

/// A100-40GB device profile ids (reference/mig.md).
const P_1G: c_uint = 19;
const P_2G: c_uint = 14;
const P_3G: c_uint = 9;
const P_7G: c_uint = 0;

type R<T> = Result<T, nvmlReturn_t>;

fn check(code: nvmlReturn_t) -> R<()> {
    if code == SUCCESS { Ok(()) } else { Err(code) }
}

fn text(buf: &[c_char]) -> String {
    // SAFETY: the library NUL-terminates what it writes; the buffers start zeroed.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Safe wrappers over the raw calls. Handles are opaque integers to the
/// library under test, which never dereferences them, so passing any value
/// is sound; every out-pointer is a live local.
struct Api(NvmlLib);

impl Api {
    fn init(&self) -> R<()> {
        // SAFETY: no arguments.
        check(unsafe { self.0.nvmlInit_v2() })
    }

    fn shutdown(&self) -> R<()> {
        // SAFETY: no arguments.
        check(unsafe { self.0.nvmlShutdown() })
    }

    fn count(&self) -> R<u32> {
        let mut n = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetCount_v2(&mut n) }).map(|()| n)
    }

    fn device(&self, index: u32) -> R<nvmlDevice_t> {
        let mut d = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetHandleByIndex_v2(index, &mut d) }).map(|()| d)
    }

    fn by_uuid(&self, uuid: &str) -> R<nvmlDevice_t> {
        let uuid = CString::new(uuid).expect("uuid");
        let mut d = ptr::null_mut();
        // SAFETY: NUL-terminated input, out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut d) }).map(|()| d)
    }

    fn index(&self, d: nvmlDevice_t) -> R<u32> {
        let mut i = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetIndex(d, &mut i) }).map(|()| i)
    }

    fn uuid(&self, d: nvmlDevice_t) -> R<String> {
        let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
        // SAFETY: buffer of the length passed.
        check(unsafe {
            self.0
                .nvmlDeviceGetUUID(d, buf.as_mut_ptr(), buf.len() as c_uint)
        })
        .map(|()| text(&buf))
    }

    fn name(&self, d: nvmlDevice_t) -> R<String> {
        let mut buf = [0 as c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE as usize];
        // SAFETY: buffer of the length passed.
        check(unsafe {
            self.0
                .nvmlDeviceGetName(d, buf.as_mut_ptr(), buf.len() as c_uint)
        })
        .map(|()| text(&buf))
    }

    fn minor(&self, d: nvmlDevice_t) -> R<u32> {
        let mut m = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetMinorNumber(d, &mut m) }).map(|()| m)
    }

    fn memory(&self, d: nvmlDevice_t) -> R<nvmlMemory_t> {
        // SAFETY: plain C struct, all-zero is valid.
        let mut m: nvmlMemory_t = unsafe { zeroed() };
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetMemoryInfo(d, &mut m) }).map(|()| m)
    }

    fn memory_v2(&self, d: nvmlDevice_t, version: c_uint) -> R<nvmlMemory_v2_t> {
        // SAFETY: plain C struct, all-zero is valid.
        let mut m: nvmlMemory_v2_t = unsafe { zeroed() };
        m.version = version;
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetMemoryInfo_v2(d, &mut m) }).map(|()| m)
    }

    fn mig_mode(&self, d: nvmlDevice_t) -> R<(u32, u32)> {
        let (mut current, mut pending) = (9, 9);
        // SAFETY: out-pointers to locals.
        check(unsafe { self.0.nvmlDeviceGetMigMode(d, &mut current, &mut pending) })
            .map(|()| (current, pending))
    }

    fn set_mig_mode(&self, d: nvmlDevice_t, mode: u32) -> R<nvmlReturn_t> {
        let mut status = 12345;
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceSetMigMode(d, mode, &mut status) }).map(|()| status)
    }

    fn profile_v1(&self, d: nvmlDevice_t, e: u32) -> R<nvmlGpuInstanceProfileInfo_t> {
        // SAFETY: plain C struct, all-zero is valid.
        let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { zeroed() };
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetGpuInstanceProfileInfo(d, e, &mut info) }).map(|()| info)
    }

    fn profile_v2(
        &self,
        d: nvmlDevice_t,
        e: u32,
        version: c_uint,
    ) -> R<nvmlGpuInstanceProfileInfo_v2_t> {
        // SAFETY: plain C struct, all-zero is valid.
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { zeroed() };
        info.version = version;
        // SAFETY: out-pointer to a local of the struct the version names.
        check(unsafe { self.0.nvmlDeviceGetGpuInstanceProfileInfoV(d, e, &mut info) })
            .map(|()| info)
    }

    fn profile_v3(&self, d: nvmlDevice_t, e: u32) -> R<nvmlGpuInstanceProfileInfo_v3_t> {
        // SAFETY: plain C struct, all-zero is valid.
        let mut info: nvmlGpuInstanceProfileInfo_v3_t = unsafe { zeroed() };
        info.version = GI_INFO_V3;
        let p = (&raw mut info).cast::<nvmlGpuInstanceProfileInfo_v2_t>();
        // SAFETY: the V call takes a v2 pointer and writes the v3 struct its
        // version names, which is what `p` points to.
        check(unsafe { self.0.nvmlDeviceGetGpuInstanceProfileInfoV(d, e, p) }).map(|()| info)
    }

    fn placement_count(&self, d: nvmlDevice_t, profile: u32) -> R<u32> {
        let mut n = 0;
        // SAFETY: NULL placements asks for the count; out-pointer to a local.
        check(unsafe {
            self.0.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                d,
                profile,
                ptr::null_mut(),
                &mut n,
            )
        })
        .map(|()| n)
    }

    fn placements(&self, d: nvmlDevice_t, profile: u32) -> R<Vec<(u32, u32)>> {
        let n = self.placement_count(d, profile)?;
        // SAFETY: plain C struct, all-zero is valid.
        let mut buf = vec![unsafe { zeroed::<nvmlGpuInstancePlacement_t>() }; n as usize];
        let mut count = 0;
        // SAFETY: buffer of the count the library reported; out-pointer to a local.
        check(unsafe {
            self.0.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                d,
                profile,
                buf.as_mut_ptr(),
                &mut count,
            )
        })?;
        assert_eq!(count, n, "count of the fill call");
        Ok(buf.iter().map(|p| (p.start, p.size)).collect())
    }

    fn remaining(&self, d: nvmlDevice_t, profile: u32) -> R<u32> {
        let mut n = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe {
            self.0
                .nvmlDeviceGetGpuInstanceRemainingCapacity(d, profile, &mut n)
        })
        .map(|()| n)
    }

    fn create_gi(
        &self,
        d: nvmlDevice_t,
        profile: u32,
        at: Option<(u32, u32)>,
    ) -> R<nvmlGpuInstance_t> {
        let mut gi = ptr::null_mut();
        let code = match at {
            Some((start, size)) => {
                let placement = nvmlGpuInstancePlacement_t { start, size };
                // SAFETY: pointers to locals.
                unsafe {
                    self.0
                        .nvmlDeviceCreateGpuInstanceWithPlacement(d, profile, &placement, &mut gi)
                }
            }
            // SAFETY: out-pointer to a local.
            None => unsafe { self.0.nvmlDeviceCreateGpuInstance(d, profile, &mut gi) },
        };
        check(code).map(|()| gi)
    }

    fn gi_info(&self, gi: nvmlGpuInstance_t) -> R<nvmlGpuInstanceInfo_t> {
        // SAFETY: plain C struct, all-zero (null pointers) is valid.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { zeroed() };
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlGpuInstanceGetInfo(gi, &mut info) }).map(|()| info)
    }

    fn destroy_gi(&self, gi: nvmlGpuInstance_t) -> R<()> {
        // SAFETY: handle by value.
        check(unsafe { self.0.nvmlGpuInstanceDestroy(gi) })
    }

    fn gis(&self, d: nvmlDevice_t, profile: u32) -> R<Vec<nvmlGpuInstance_t>> {
        let mut buf = vec![ptr::null_mut(); 8];
        let mut n = 0;
        // SAFETY: 8 slots ≥ any profile's instance count; out-pointer to a local.
        check(unsafe {
            self.0
                .nvmlDeviceGetGpuInstances(d, profile, buf.as_mut_ptr(), &mut n)
        })?;
        buf.truncate(n as usize);
        Ok(buf)
    }

    fn gi_by_id(&self, d: nvmlDevice_t, id: u32) -> R<nvmlGpuInstance_t> {
        let mut gi = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetGpuInstanceById(d, id, &mut gi) }).map(|()| gi)
    }

    fn ci_profile_v1(
        &self,
        gi: nvmlGpuInstance_t,
        profile: u32,
    ) -> R<nvmlComputeInstanceProfileInfo_t> {
        // SAFETY: plain C struct, all-zero is valid.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { zeroed() };
        // SAFETY: out-pointer to a local.
        check(unsafe {
            self.0.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                profile,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        })
        .map(|()| info)
    }

    fn ci_profile_v2(
        &self,
        gi: nvmlGpuInstance_t,
        profile: u32,
        version: c_uint,
    ) -> R<nvmlComputeInstanceProfileInfo_v2_t> {
        // SAFETY: plain C struct, all-zero is valid.
        let mut info: nvmlComputeInstanceProfileInfo_v2_t = unsafe { zeroed() };
        info.version = version;
        // SAFETY: out-pointer to a local of the struct the version names.
        check(unsafe {
            self.0.nvmlGpuInstanceGetComputeInstanceProfileInfoV(
                gi,
                profile,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        })
        .map(|()| info)
    }

    fn ci_remaining(&self, gi: nvmlGpuInstance_t, profile: u32) -> R<u32> {
        let mut n = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe {
            self.0
                .nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, profile, &mut n)
        })
        .map(|()| n)
    }

    fn create_ci(&self, gi: nvmlGpuInstance_t, profile: u32) -> R<nvmlComputeInstance_t> {
        let mut ci = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe {
            self.0
                .nvmlGpuInstanceCreateComputeInstance(gi, profile, &mut ci)
        })
        .map(|()| ci)
    }

    fn destroy_ci(&self, ci: nvmlComputeInstance_t) -> R<()> {
        // SAFETY: handle by value.
        check(unsafe { self.0.nvmlComputeInstanceDestroy(ci) })
    }

    fn cis(&self, gi: nvmlGpuInstance_t, profile: u32) -> R<Vec<nvmlComputeInstance_t>> {
        let mut buf = vec![ptr::null_mut(); 8];
        let mut n = 0;
        // SAFETY: 8 slots ≥ any profile's instance count; out-pointer to a local.
        check(unsafe {
            self.0
                .nvmlGpuInstanceGetComputeInstances(gi, profile, buf.as_mut_ptr(), &mut n)
        })?;
        buf.truncate(n as usize);
        Ok(buf)
    }

    fn ci_info(&self, ci: nvmlComputeInstance_t) -> R<nvmlComputeInstanceInfo_t> {
        // SAFETY: plain C struct, all-zero (null pointers) is valid.
        let mut info: nvmlComputeInstanceInfo_t = unsafe { zeroed() };
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlComputeInstanceGetInfo_v2(ci, &mut info) }).map(|()| info)
    }

    fn max_mig(&self, d: nvmlDevice_t) -> R<u32> {
        let mut n = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetMaxMigDeviceCount(d, &mut n) }).map(|()| n)
    }

    fn mig(&self, d: nvmlDevice_t, index: u32) -> R<nvmlDevice_t> {
        let mut m = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceGetMigDeviceHandleByIndex(d, index, &mut m) }).map(|()| m)
    }

    fn parent(&self, m: nvmlDevice_t) -> R<nvmlDevice_t> {
        let mut d = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe {
            self.0
                .nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, &mut d)
        })
        .map(|()| d)
    }

    fn is_mig(&self, d: nvmlDevice_t) -> R<bool> {
        let mut v = 7;
        // SAFETY: out-pointer to a local.
        check(unsafe { self.0.nvmlDeviceIsMigDeviceHandle(d, &mut v) }).map(|()| v == 1)
    }

    fn mig_ids(&self, d: nvmlDevice_t) -> R<(u32, u32)> {
        let (mut gi, mut ci) = (0, 0);
        // SAFETY: out-pointers to locals.
        check(unsafe { self.0.nvmlDeviceGetGpuInstanceId(d, &mut gi) })?;
        // SAFETY: as above.
        check(unsafe { self.0.nvmlDeviceGetComputeInstanceId(d, &mut ci) })?;
        Ok((gi, ci))
    }

    /// Creates a GI at `at` and its full-size CI; returns (GI id, MIG UUID).
    fn make_instance(&self, d: nvmlDevice_t, profile: u32, at: (u32, u32)) -> (u32, String) {
        let gi = self.create_gi(d, profile, Some(at)).expect("create GI");
        let ci_profile = (0..9)
            .find(|e| self.ci_profile_v1(gi, *e).is_ok())
            .expect("a CI profile spans the GI");
        self.create_ci(gi, ci_profile).expect("create CI");
        let id = self.gi_info(gi).expect("GI info").id;
        let mig = (0..self.max_mig(d).expect("max"))
            .filter_map(|i| self.mig(d, i).ok())
            .find(|m| self.mig_ids(*m).map(|(g, _)| g) == Ok(id))
            .expect("the new MIG device");
        (id, self.uuid(mig).expect("MIG UUID"))
    }
}

/// A node with an A100-40GB (MIG on, minor 3) and an H100-80GB (MIG off,
/// minor 5), its library loaded and initialised.
fn two_gpu_node() -> (SimNode, Api) {
    let node = SimNode::new(vec![
        gpu(0, 3, "A100-40GB", true),
        gpu(1, 5, "H100-80GB", false),
    ]);
    let api = Api(node.load());
    api.init().expect("init");
    (node, api)
}

fn state(node: &SimNode) -> NodeState {
    node.store().read().expect("read state")
}

#[test]
fn init_is_reference_counted_and_calls_before_it_are_uninitialized() {
    let node = SimNode::new(vec![gpu(0, 0, "A100-40GB", false)]);
    let api = Api(node.load());
    assert_eq!(api.count(), Err(UNINITIALIZED));
    assert_eq!(api.shutdown(), Err(UNINITIALIZED));
    api.init().unwrap();
    // SAFETY: no arguments.
    assert_eq!(unsafe { api.0.nvmlInitWithFlags(0) }, SUCCESS);
    assert_eq!(api.count(), Ok(1));
    api.shutdown().unwrap();
    assert_eq!(api.count(), Ok(1), "one init reference left");
    api.shutdown().unwrap();
    assert_eq!(api.count(), Err(UNINITIALIZED));
    assert_eq!(api.shutdown(), Err(UNINITIALIZED));
    // The NVML 1 name, which the bindings only declare behind a feature:
    // the same file loaded again is the same library instance.
    // SAFETY: loads the library already loaded above.
    let again = unsafe { libloading::Library::new(node.lib_path()) }.unwrap();
    // SAFETY: `nvmlInit` has this signature in nvml.h.
    let init_v1 = unsafe { again.get::<unsafe extern "C" fn() -> nvmlReturn_t>(b"nvmlInit\0") }
        .expect("nvmlInit is exported");
    // SAFETY: no arguments.
    assert_eq!(unsafe { init_v1() }, SUCCESS, "re-init after shutdown");
    assert_eq!(api.count(), Ok(1));
}

#[test]
fn error_strings_are_static_text() {
    let node = SimNode::new(vec![]);
    let api = Api(node.load());
    let s = |code| {
        // SAFETY: returns a static NUL-terminated string; needs no init.
        unsafe { CStr::from_ptr(api.0.nvmlErrorString(code)) }
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(s(SUCCESS), "Success");
    assert_eq!(s(INSUFFICIENT_RESOURCES), "Insufficient resources");
    assert_eq!(s(4242), "Unknown Error");
}

#[test]
fn a_root_without_state_is_driver_not_loaded() {
    let node = SimNode::without_state();
    let api = Api(node.load());
    assert_eq!(api.init(), Err(DRIVER_NOT_LOADED));
    assert_eq!(api.count(), Err(UNINITIALIZED));
}

#[test]
fn system_versions_come_from_the_state() {
    let (_node, api) = two_gpu_node();
    let mut buf = [0 as c_char; 80];
    // SAFETY: buffer of the length passed.
    check(unsafe { api.0.nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 80) }).unwrap();
    assert_eq!(text(&buf), "570.133.20");
    // SAFETY: buffer of the length passed.
    check(unsafe { api.0.nvmlSystemGetNVMLVersion(buf.as_mut_ptr(), 80) }).unwrap();
    assert_eq!(text(&buf), "12.570.133.20");
    let mut cuda = 0;
    // SAFETY: out-pointer to a local.
    check(unsafe { api.0.nvmlSystemGetCudaDriverVersion_v2(&mut cuda) }).unwrap();
    assert_eq!(cuda, 12080);
    // SAFETY: out-pointer to a local.
    check(unsafe { api.0.nvmlSystemGetCudaDriverVersion(&mut cuda) }).unwrap();
    assert_eq!(cuda, 12080);
}

#[test]
fn devices_report_the_state_identity_and_model() {
    let (node, api) = two_gpu_node();
    let s = state(&node);
    assert_eq!(api.count(), Ok(2));
    let a100 = api.device(0).unwrap();
    let h100 = api.device(1).unwrap();
    assert_eq!(api.device(2), Err(INVALID_ARGUMENT));
    assert_eq!(api.uuid(a100).unwrap(), s.gpus[0].uuid);
    assert_eq!(api.uuid(h100).unwrap(), s.gpus[1].uuid);
    assert_eq!(api.name(a100).unwrap(), "NVIDIA A100-SXM4-40GB");
    assert_eq!(api.name(h100).unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(api.minor(a100), Ok(3));
    assert_eq!(api.minor(h100), Ok(5));
    assert_eq!(api.index(h100), Ok(1));
    assert_eq!(api.by_uuid(&s.gpus[1].uuid), Ok(h100));
    assert_eq!(
        api.by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NOT_FOUND)
    );

    // A100-SXM4-40GB: 40960 MiB as the simulated node serves it (literal, not
    // the catalogue: a change of the catalogue must show here).
    let total = 40960 * MIB;
    let m = api.memory(a100).unwrap();
    assert_eq!((m.total, m.free + m.used), (total, total));
    let m2 = api.memory_v2(a100, MEMORY_V2).unwrap();
    assert_eq!((m2.total, m2.free + m2.used), (total, total));
    assert_eq!(
        api.memory_v2(a100, MEMORY_V2 + 1).err(),
        Some(VERSION_MISMATCH)
    );
}

#[test]
fn bad_handles_short_buffers_and_null_outputs_are_refused() {
    let (_node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();
    let garbage: nvmlDevice_t = ptr::without_provenance_mut(0x1234_5678);
    assert_eq!(api.uuid(garbage), Err(INVALID_ARGUMENT));
    assert_eq!(api.minor(ptr::null_mut()), Err(INVALID_ARGUMENT));
    assert_eq!(
        api.uuid(garbage.wrapping_byte_add(1 << 60)),
        Err(INVALID_ARGUMENT)
    );

    let mut short = [0 as c_char; 10];
    // SAFETY: buffer of the length passed.
    let code = unsafe { api.0.nvmlDeviceGetUUID(a100, short.as_mut_ptr(), 10) };
    assert_eq!(code, INSUFFICIENT_SIZE);
    // SAFETY: a null buffer must be refused, not written.
    let code = unsafe { api.0.nvmlDeviceGetName(a100, ptr::null_mut(), 96) };
    assert_eq!(code, INVALID_ARGUMENT);
    // SAFETY: a null out-pointer must be refused, not written.
    let code = unsafe { api.0.nvmlDeviceGetCount_v2(ptr::null_mut()) };
    assert_eq!(code, INVALID_ARGUMENT);
    // A GPU-instance handle is not a device handle.
    let gi = api.create_gi(a100, P_7G, Some((0, 8))).unwrap();
    assert_eq!(api.uuid(gi.cast()), Err(INVALID_ARGUMENT));
}

#[test]
fn mig_mode_is_reported_and_can_be_switched() {
    let (node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();
    let h100 = api.device(1).unwrap();
    assert_eq!(
        api.mig_mode(a100),
        Ok((NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE))
    );
    assert_eq!(
        api.mig_mode(h100),
        Ok((NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE))
    );
    assert_eq!(api.max_mig(h100), Ok(0), "no MIG devices while MIG is off");
    assert_eq!(api.mig(h100, 0), Err(NOT_SUPPORTED));
    assert_eq!(api.create_gi(h100, P_1G, Some((0, 1))), Err(NOT_SUPPORTED));

    assert_eq!(api.set_mig_mode(h100, NVML_DEVICE_MIG_ENABLE), Ok(SUCCESS));
    assert_eq!(api.mig_mode(h100), Ok((1, 1)));
    assert!(
        state(&node).gpus[1].mig_enabled,
        "written to the state file"
    );
    assert_eq!(api.max_mig(h100), Ok(7));
    assert_eq!(api.set_mig_mode(h100, 2), Err(INVALID_ARGUMENT));

    // Disabling with a GPU instance present only changes the pending mode.
    api.create_gi(a100, P_1G, Some((0, 1))).unwrap();
    assert_eq!(api.set_mig_mode(a100, NVML_DEVICE_MIG_DISABLE), Ok(IN_USE));
    assert_eq!(api.mig_mode(a100), Ok((1, 0)));
}

#[test]
fn profile_info_is_queried_by_enum_index() {
    let (_node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();
    let h100 = api.device(1).unwrap();

    let one = api
        .profile_v1(a100, NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        .unwrap();
    assert_eq!((one.id, one.sliceCount, one.instanceCount), (19, 1, 7));
    // 1g.5gb: 14 SMs (mig.md); 4864 MiB = 4.75 GiB (mig.md's ≈ 4.75 GiB).
    assert_eq!((one.multiprocessorCount, one.memorySizeMB), (14, 4864));
    let double = api
        .profile_v1(a100, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
        .unwrap();
    assert_eq!((double.id, double.instanceCount), (15, 4));
    assert_eq!(
        api.profile_v1(a100, NVML_GPU_INSTANCE_PROFILE_8_SLICE)
            .err(),
        Some(NOT_SUPPORTED)
    );
    assert_eq!(
        api.profile_v1(a100, 0x12).err(),
        Some(INVALID_ARGUMENT),
        "past the enum"
    );
    assert_eq!(
        api.profile_v1(h100, 0).err(),
        Some(NOT_SUPPORTED),
        "MIG off"
    );

    // Enumerating until INVALID_ARGUMENT finds the A100's seven profiles.
    let ids: Vec<u32> = (0..)
        .map(|e| api.profile_v1(a100, e))
        .take_while(|r| r.as_ref().err() != Some(&INVALID_ARGUMENT))
        .filter_map(Result::ok)
        .map(|p| p.id)
        .collect();
    assert_eq!(ids, [19, 14, 9, 5, 0, 20, 15]);

    let v2 = api
        .profile_v2(a100, NVML_GPU_INSTANCE_PROFILE_3_SLICE, GI_INFO_V2)
        .unwrap();
    assert_eq!((v2.version, v2.id, v2.sliceCount), (GI_INFO_V2, 9, 3));
    assert_eq!(text(&v2.name), "MIG 3g.20gb");
    let v3 = api
        .profile_v3(a100, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)
        .unwrap();
    assert_eq!((v3.version, v3.id, v3.instanceCount), (GI_INFO_V3, 20, 1));
    assert_eq!(text(&v3.name), "MIG 1g.5gb+me");
    assert_eq!((v3.decoderCount, v3.jpegCount, v3.ofaCount), (1, 1, 1));
    assert_eq!(v3.capabilities, 0);
    assert_eq!(
        api.profile_v2(a100, 0, GI_INFO_V2 + 1).err(),
        Some(VERSION_MISMATCH)
    );
    assert_eq!(api.profile_v2(a100, 0, 0).err(), Some(VERSION_MISMATCH));
}

/// A GPU-instance profile as NVML must report it, stated as literals from
/// `shared/reference/mig.md` (ids, enum indices, slices, instance counts,
/// SMs, placements) and, where mig.md gives only a range, the MiB the
/// simulated node chose in it — never read from `tessera_model`'s catalogue,
/// which is what the simulated library serves.
struct WantProfile {
    enum_index: u32,
    id: u32,
    name: &'static str,
    slices: u32,
    instances: u32,
    sms: u32,
    mib: u32,
    starts: &'static [u32],
    size: u32,
}

/// One model per family, with its whole-GPU name and memory.
struct WantModel {
    key: &'static str,
    product: &'static str,
    mib: u64,
    profiles: &'static [WantProfile],
}

const fn want(
    enum_index: u32,
    id: u32,
    name: &'static str,
    (slices, instances, sms, mib): (u32, u32, u32, u32),
    starts: &'static [u32],
    size: u32,
) -> WantProfile {
    WantProfile {
        enum_index,
        id,
        name,
        slices,
        instances,
        sms,
        mib,
        starts,
        size,
    }
}

const ALL_7: &[u32] = &[0, 1, 2, 3, 4, 5, 6];

const FAMILIES: [WantModel; 6] = [
    WantModel {
        key: "A100-40GB",
        product: "NVIDIA A100-SXM4-40GB",
        mib: 40960,
        profiles: &[
            want(0, 19, "1g.5gb", (1, 7, 14, 4864), ALL_7, 1),
            want(1, 14, "2g.10gb", (2, 3, 28, 9856), &[0, 2, 4], 2),
            want(2, 9, "3g.20gb", (3, 2, 42, 20096), &[0, 4], 4),
            want(3, 5, "4g.20gb", (4, 1, 56, 20096), &[0], 4),
            want(4, 0, "7g.40gb", (7, 1, 98, 40448), &[0], 8),
            want(7, 20, "1g.5gb+me", (1, 1, 14, 4864), ALL_7, 1),
            want(9, 15, "1g.10gb", (1, 4, 14, 9856), &[0, 2, 4, 6], 2),
        ],
    },
    WantModel {
        key: "H100-80GB",
        product: "NVIDIA H100 80GB HBM3",
        mib: 81559,
        profiles: &[
            want(0, 19, "1g.10gb", (1, 7, 16, 9984), ALL_7, 1),
            want(1, 14, "2g.20gb", (2, 3, 32, 20096), &[0, 2, 4], 2),
            want(2, 9, "3g.40gb", (3, 2, 60, 40448), &[0, 4], 4),
            want(3, 5, "4g.40gb", (4, 1, 64, 40448), &[0], 4),
            want(4, 0, "7g.80gb", (7, 1, 132, 81152), &[0], 8),
            want(9, 15, "1g.20gb", (1, 4, 26, 20096), &[0, 2, 4, 6], 2),
        ],
    },
    WantModel {
        key: "H200-141GB",
        product: "NVIDIA H200",
        mib: 143771,
        profiles: &[
            // 16 GiB, 32.5 GiB and 140 GiB: verified in mig.md.
            want(0, 19, "1g.18gb", (1, 7, 16, 16384), ALL_7, 1),
            want(1, 14, "2g.35gb", (2, 3, 32, 33280), &[0, 2, 4], 2),
            want(4, 0, "7g.141gb", (7, 1, 132, 143360), &[0], 8),
        ],
    },
    WantModel {
        key: "B200",
        product: "NVIDIA B200",
        mib: 183359,
        profiles: &[
            // 1g = 18 SMs, 148 in all (mig.md); 3g takes 4 of 8 memory slices.
            want(0, 19, "1g.23gb", (1, 7, 18, 22784), ALL_7, 1),
            want(2, 9, "3g.90gb", (3, 2, 54, 90880), &[0, 4], 4),
            want(4, 0, "7g.180gb", (7, 1, 148, 182272), &[0], 8),
        ],
    },
    WantModel {
        key: "A30",
        product: "NVIDIA A30",
        mib: 24576,
        profiles: &[
            // 5952 / 11968 MiB verified (mig.md); a 4-slice axis.
            want(0, 14, "1g.6gb", (1, 4, 14, 5952), &[0, 1, 2, 3], 1),
            want(1, 5, "2g.12gb", (2, 2, 28, 11968), &[0, 2], 2),
            want(3, 0, "4g.24gb", (4, 1, 56, 24192), &[0], 4),
            want(7, 21, "1g.6gb+me", (1, 1, 14, 5952), &[0, 1, 2, 3], 1),
            want(8, 6, "2g.12gb+me", (2, 1, 28, 11968), &[0, 2], 2),
        ],
    },
    WantModel {
        key: "RTX-PRO-6000",
        product: "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        mib: 97887,
        profiles: &[
            // A 12-slice axis (mig.md).
            want(0, 14, "1g.24gb", (1, 4, 46, 24064), &[0, 3, 6, 9], 3),
            want(1, 5, "2g.48gb", (2, 2, 94, 48384), &[0, 6], 6),
            want(3, 0, "4g.96gb", (4, 1, 188, 97024), &[0], 12),
            want(0xA, 47, "1g.24gb+gfx", (1, 4, 46, 24064), &[0, 3, 6, 9], 3),
        ],
    },
];

#[test]
fn every_family_serves_the_reference_profiles() {
    let gpus = FAMILIES
        .iter()
        .zip(0..)
        .map(|(m, i)| gpu(i, i, m.key, true))
        .collect();
    let node = SimNode::new(gpus);
    let api = Api(node.load());
    api.init().expect("init");
    for (model, i) in FAMILIES.iter().zip(0..) {
        let d = api.device(i).unwrap();
        assert_eq!(api.name(d).unwrap(), model.product, "{}", model.key);
        assert_eq!(
            api.memory(d).unwrap().total,
            model.mib * MIB,
            "{}",
            model.key
        );
        for p in model.profiles {
            let what = format!("{} {} (enum {})", model.key, p.name, p.enum_index);
            let info = api
                .profile_v2(d, p.enum_index, GI_INFO_V2)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(text(&info.name), format!("MIG {}", p.name), "{what}");
            assert_eq!(
                (
                    info.id,
                    info.sliceCount,
                    info.instanceCount,
                    info.multiprocessorCount,
                    info.memorySizeMB
                ),
                (p.id, p.slices, p.instances, p.sms, u64::from(p.mib)),
                "{what}: (id, slices, instances, SMs, MiB)"
            );
            let want: Vec<(u32, u32)> = p.starts.iter().map(|s| (*s, p.size)).collect();
            assert_eq!(api.placements(d, p.id).unwrap(), want, "{what}: placements");
        }
    }
}

#[test]
fn possible_placements_count_then_fill() {
    let (_node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();
    let h100 = api.device(1).unwrap();
    assert_eq!(api.placement_count(a100, P_3G), Ok(2));
    assert_eq!(api.placements(a100, P_3G).unwrap(), [(0, 4), (4, 4)]);
    assert_eq!(
        api.placements(a100, P_2G).unwrap(),
        [(0, 2), (2, 2), (4, 2)]
    );
    assert_eq!(api.placements(a100, P_1G).unwrap().len(), 7);
    assert_eq!(
        api.placements(h100, P_7G).unwrap(),
        [(0, 8)],
        "answered while MIG is off"
    );
    assert_eq!(api.placement_count(a100, 77), Err(INVALID_ARGUMENT));
}

#[test]
fn gpu_instances_are_created_listed_and_destroyed_by_the_driver_rules() {
    let (node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();

    let gi = api.create_gi(a100, P_3G, Some((4, 4))).unwrap();
    let info = api.gi_info(gi).unwrap();
    assert_eq!(info.id, 1, "driver-assigned id, not the start");
    assert_eq!(
        (info.profileId, info.placement.start, info.placement.size),
        (P_3G, 4, 4)
    );
    assert_eq!(info.device, a100);
    assert_eq!(
        state(&node).gpus[0].gpu_instances[0].start,
        4,
        "in the state file"
    );

    assert_eq!(
        api.create_gi(a100, P_2G, Some((4, 2))),
        Err(INSUFFICIENT_RESOURCES),
        "overlaps the 3g at 4"
    );
    assert_eq!(
        api.create_gi(a100, P_3G, Some((2, 4))),
        Err(INVALID_ARGUMENT),
        "illegal start"
    );
    assert_eq!(
        api.create_gi(a100, P_3G, Some((0, 2))),
        Err(INVALID_ARGUMENT),
        "wrong size"
    );
    assert_eq!(
        api.create_gi(a100, 77, Some((0, 1))),
        Err(INVALID_ARGUMENT),
        "unknown profile"
    );
    assert_eq!(api.remaining(a100, P_3G), Ok(1));
    assert_eq!(api.remaining(a100, P_7G), Ok(0));

    let second = api.create_gi(a100, P_3G, Some((0, 4))).unwrap();
    assert_eq!(api.gi_info(second).unwrap().id, 2);
    assert_eq!(api.gis(a100, P_3G).unwrap(), [gi, second]);
    assert_eq!(api.gis(a100, P_1G).unwrap(), []);
    assert_eq!(api.gi_by_id(a100, 1), Ok(gi));
    assert_eq!(api.gi_by_id(a100, 5), Err(NOT_FOUND));

    // A compute instance spanning the GI.
    assert_eq!(
        api.ci_profile_v1(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
            .err(),
        Some(NOT_SUPPORTED)
    );
    assert_eq!(api.ci_profile_v1(gi, 9).err(), Some(INVALID_ARGUMENT));
    let cip = api
        .ci_profile_v1(gi, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
        .unwrap();
    assert_eq!(
        (
            cip.id,
            cip.sliceCount,
            cip.instanceCount,
            cip.multiprocessorCount
        ),
        (2, 3, 1, 42),
        "3g.20gb: 42 SMs (mig.md)"
    );
    let v2 = api.ci_profile_v2(gi, 2, CI_INFO_V2).unwrap();
    assert_eq!(text(&v2.name), "MIG 3g.20gb");
    assert_eq!(
        api.ci_profile_v2(gi, 2, CI_INFO_V3).unwrap().version,
        CI_INFO_V3
    );
    assert_eq!(api.ci_profile_v2(gi, 2, 7).err(), Some(VERSION_MISMATCH));
    assert_eq!(api.ci_remaining(gi, 2), Ok(1));

    let ci = api.create_ci(gi, 2).unwrap();
    assert_eq!(
        api.create_ci(gi, 2),
        Err(INSUFFICIENT_RESOURCES),
        "one CI per GI"
    );
    assert_eq!(api.ci_remaining(gi, 2), Ok(0));
    assert_eq!(api.cis(gi, 2).unwrap(), [ci]);
    let ci_info = api.ci_info(ci).unwrap();
    assert_eq!((ci_info.id, ci_info.profileId), (0, 2));
    assert_eq!((ci_info.device, ci_info.gpuInstance), (a100, gi));
    assert_eq!((ci_info.placement.start, ci_info.placement.size), (0, 3));

    assert_eq!(api.destroy_gi(gi), Err(IN_USE), "CI still inside");
    api.destroy_ci(ci).unwrap();
    assert_eq!(api.destroy_ci(ci), Err(INVALID_ARGUMENT), "stale handle");
    api.destroy_gi(gi).unwrap();
    assert_eq!(api.destroy_gi(gi), Err(INVALID_ARGUMENT), "stale handle");
    assert_eq!(api.gi_info(gi).err(), Some(INVALID_ARGUMENT));
    let ids: Vec<u32> = state(&node).gpus[0]
        .gpu_instances
        .iter()
        .map(|g| g.id)
        .collect();
    assert_eq!(ids, [2]);
}

#[test]
fn create_without_placement_takes_the_first_free_legal_start() {
    let (_node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();
    api.create_gi(a100, P_2G, Some((0, 2))).unwrap();
    let gi = api.create_gi(a100, P_2G, None).unwrap();
    let info = api.gi_info(gi).unwrap();
    assert_eq!((info.placement.start, info.id), (2, 4));
    api.create_gi(a100, P_2G, None).unwrap();
    assert_eq!(
        api.create_gi(a100, P_2G, None),
        Err(INSUFFICIENT_RESOURCES),
        "3 is the limit"
    );
}

#[test]
fn mig_devices_are_handles_to_compute_instances() {
    let (node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();
    let (gi_a, uuid_a) = api.make_instance(a100, P_1G, (6, 1));
    let (gi_b, uuid_b) = api.make_instance(a100, P_3G, (0, 4));
    assert_eq!((gi_a, gi_b), (13, 2));
    assert!(
        uuid_a.starts_with("MIG-") && uuid_b.starts_with("MIG-"),
        "{uuid_a} {uuid_b}"
    );
    assert_ne!(uuid_a, uuid_b);

    assert_eq!(api.max_mig(a100), Ok(7));
    // Numbered by GI id: the 3g (GI 2) first.
    let first = api.mig(a100, 0).unwrap();
    let second = api.mig(a100, 1).unwrap();
    assert_eq!(api.mig(a100, 2), Err(NOT_FOUND), "empty slot");
    assert_eq!(api.mig(a100, 7), Err(INVALID_ARGUMENT), "past the maximum");
    assert_eq!(api.uuid(first).unwrap(), uuid_b);
    assert_eq!(api.uuid(second).unwrap(), uuid_a);
    assert_eq!(api.mig_ids(first), Ok((2, 0)));
    assert_eq!(api.index(second), Ok(1));
    assert_eq!(api.is_mig(first), Ok(true));
    assert_eq!(api.is_mig(a100), Ok(false));
    assert_eq!(api.parent(first), Ok(a100));
    assert_eq!(api.parent(a100), Err(INVALID_ARGUMENT));
    assert_eq!(api.mig_ids(a100), Err(NOT_SUPPORTED));
    assert_eq!(api.by_uuid(&uuid_a), Ok(second));

    assert_eq!(
        api.name(first).unwrap(),
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    );
    let mem = api.memory(second).unwrap();
    assert_eq!(mem.total, 4864 * MIB, "the 1g.5gb profile's memory");
    assert_eq!(
        api.memory_v2(first, MEMORY_V2).unwrap().total,
        20096 * MIB,
        "the 3g.20gb profile's memory (≈ 19.62 GiB)"
    );
    assert_eq!(api.minor(first), Err(NOT_SUPPORTED), "ask the parent");
    assert_eq!(api.mig_mode(first), Err(NOT_SUPPORTED));

    // The state file records the same UUIDs.
    let s = state(&node);
    let recorded: Vec<&str> = s.gpus[0]
        .gpu_instances
        .iter()
        .flat_map(|gi| gi.compute_instances.iter().map(|ci| ci.uuid.as_str()))
        .collect();
    assert_eq!(recorded, [uuid_b.as_str(), uuid_a.as_str()]);
}

#[test]
fn instances_made_by_another_process_are_seen_and_the_other_way_round() {
    let (node, api) = two_gpu_node();
    let a100 = api.device(0).unwrap();
    api.make_instance(a100, P_3G, (4, 4));
    assert_eq!(api.gis(a100, P_3G).unwrap().len(), 1);

    // The child loads its own copy from the root, sees the 3g, adds a 1g+CI.
    let output = node.run_child("add-1g", &[]);
    assert_child_ok("child process", &output);

    // The cached state is refreshed: the child's instance is visible here.
    let gis = api.gis(a100, P_1G).unwrap();
    assert_eq!(gis.len(), 1, "the child's GI");
    assert_eq!(api.gi_info(gis[0]).unwrap().placement.start, 0);
    assert!(api.mig(a100, 1).is_ok(), "the child's MIG device");
}

#[test]
fn root_env_var_serves_a_library_loaded_from_anywhere() {
    let node = SimNode::new(vec![gpu(0, 0, "A30", true)]);
    let root = node.root().to_str().expect("utf-8 temp path");
    let output = node.run_child("env-root", &[("TESSERA_SIM_ROOT", root)]);
    assert_child_ok("child with TESSERA_SIM_ROOT", &output);
}

/// Not a test of its own: the body a child process runs (see
/// [`SimNode::run_child`], which passes `--ignored`).
#[test]
#[ignore = "run as a child process by the tests of this file"]
fn child_process_role() {
    let role = std::env::var_os(CHILD_ROLE).expect("started by a test of this file, with a role");
    let root = std::path::PathBuf::from(std::env::var_os(CHILD_ROOT).expect("root"));
    match role.to_str().expect("role") {
        "add-1g" => {
            let api = Api(common::load(&root.join(LIB_IN_ROOT)));
            api.init().expect("init in child");
            let a100 = api.device(0).unwrap();
            assert_eq!(
                api.gis(a100, P_3G).unwrap().len(),
                1,
                "the parent's 3g is visible"
            );
            api.make_instance(a100, P_1G, (0, 1));
            api.shutdown().unwrap();
        }
        "env-root" => {
            // Loaded from the build directory, which is no node root.
            let api = Api(common::load(&common::built_library()));
            api.init().expect("init with TESSERA_SIM_ROOT");
            let a30 = api.device(0).unwrap();
            assert_eq!(api.name(a30).unwrap(), "NVIDIA A30");
            assert_eq!(api.placements(a30, 5).unwrap(), [(0, 2), (2, 2)]);
            let gi = api.create_gi(a30, 5, Some((2, 2))).unwrap();
            assert_eq!(api.gi_info(gi).unwrap().id, 1, "A30: 2g@2 is GI 1");
        }
        other => panic!("unknown child role {other}"),
    }
}
