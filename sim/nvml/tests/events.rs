//! Event sets and lost GPUs through the C ABI: XIDs recorded in the node's
//! state (as `tessera-sim inject-xid` records them) delivered by
//! `nvmlEventSetWait_v2`, and `GPU_IS_LOST` for a GPU marked lost.

mod common;

use std::ptr;
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;
use tessera_sim::health;

use common::{SimNode, gpu};

const SUCCESS: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const TIMEOUT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_TIMEOUT;
const GPU_IS_LOST: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const INVALID_ARGUMENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const XID: u64 = nvmlEventTypeXidCriticalError as u64;

/// GPU 0 plain H100, GPU 1 an A100 with MIG on and one 3g.20gb GI (id 2) + CI 0.
fn node() -> SimNode {
    let node = SimNode::new(vec![
        gpu(0, 0, "H100-80GB", false),
        gpu(1, 1, "A100-40GB", true),
    ]);
    node.store()
        .update(|s| {
            let gi = tessera_sim::mig::create_gpu_instance(s.gpu_mut(1).expect("GPU 1"), 9, 4)?;
            tessera_sim::mig::create_compute_instance(s, 1, gi)
        })
        .expect("a 3g.20gb MIG device on GPU 1");
    node
}

fn wait(lib: &NvmlLib, set: nvmlEventSet_t, ms: u32) -> (nvmlReturn_t, nvmlEventData_t) {
    // SAFETY: all-zero is a valid event data struct.
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` came from nvmlEventSetCreate; `data` is a local.
    let rc = unsafe { lib.nvmlEventSetWait_v2(set, &mut data, ms) };
    (rc, data)
}

#[test]
fn xids_recorded_after_registration_are_delivered_in_order() {
    let node = node();
    let lib = node.load();
    // SAFETY: plain calls with out-pointers to locals throughout.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let store = node.store();
        store
            .update(|s| health::inject_xid(s, 0, 13, None).map(|_| ()))
            .unwrap();
        let (mut gpu0, mut gpu1) = (ptr::null_mut(), ptr::null_mut());
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut gpu0), SUCCESS);
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(1, &mut gpu1), SUCCESS);
        let mut types = 0u64;
        assert_eq!(
            lib.nvmlDeviceGetSupportedEventTypes(gpu0, &mut types),
            SUCCESS
        );
        assert_eq!(types, XID);

        let mut set = ptr::null_mut();
        assert_eq!(lib.nvmlEventSetCreate(&mut set), SUCCESS);
        assert_eq!(
            lib.nvmlDeviceRegisterEvents(gpu0, XID | 0x2, set),
            NOT_SUPPORTED
        );
        assert_eq!(lib.nvmlDeviceRegisterEvents(gpu0, 0, set), INVALID_ARGUMENT);
        let mut mig = ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0, &mut mig),
            SUCCESS
        );
        assert_eq!(lib.nvmlDeviceRegisterEvents(mig, XID, set), NOT_SUPPORTED);
        assert_eq!(lib.nvmlDeviceRegisterEvents(gpu0, XID, set), SUCCESS);
        assert_eq!(lib.nvmlDeviceRegisterEvents(gpu1, XID, set), SUCCESS);

        // The XID from before the registration is not delivered.
        let started = Instant::now();
        assert_eq!(wait(&lib, set, 100).0, TIMEOUT);
        assert!(started.elapsed() >= Duration::from_millis(100));

        let (mut gi, mut ci) = (0, 0);
        assert_eq!(lib.nvmlDeviceGetGpuInstanceId(mig, &mut gi), SUCCESS);
        assert_eq!(lib.nvmlDeviceGetComputeInstanceId(mig, &mut ci), SUCCESS);
        store
            .update(|s| {
                health::inject_xid(s, 1, 48, Some((gi, ci)))?;
                health::inject_xid(s, 0, 79, None).map(|_| ())
            })
            .unwrap();
        let (rc, data) = wait(&lib, set, 1000);
        assert_eq!(rc, SUCCESS);
        assert_eq!(
            (data.device, data.eventType, data.eventData),
            (gpu1, XID, 48)
        );
        assert_eq!((data.gpuInstanceId, data.computeInstanceId), (gi, ci));
        let (rc, data) = wait(&lib, set, 1000);
        assert_eq!(rc, SUCCESS);
        assert_eq!((data.device, data.eventData), (gpu0, 79));
        assert_eq!(
            (data.gpuInstanceId, data.computeInstanceId),
            (u32::MAX, u32::MAX)
        );
        assert_eq!(wait(&lib, set, 0).0, TIMEOUT);

        assert_eq!(lib.nvmlEventSetFree(set), SUCCESS);
        assert_eq!(wait(&lib, set, 0).0, INVALID_ARGUMENT);
        assert_eq!(lib.nvmlEventSetFree(set), INVALID_ARGUMENT);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}

#[test]
fn a_lost_gpu_answers_gpu_is_lost_until_restored() {
    let node = node();
    let lib = node.load();
    // SAFETY: plain calls with out-pointers to locals throughout.
    unsafe {
        assert_eq!(lib.nvmlInit_v2(), SUCCESS);
        let mut gpu1 = ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(1, &mut gpu1), SUCCESS);
        let mut mig = ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0, &mut mig),
            SUCCESS
        );
        let mut set = ptr::null_mut();
        assert_eq!(lib.nvmlEventSetCreate(&mut set), SUCCESS);
        assert_eq!(lib.nvmlDeviceRegisterEvents(gpu1, XID, set), SUCCESS);

        let store = node.store();
        store
            .update(|s| health::set_lost(s, 1, true).map(|_| ()))
            .unwrap();
        let mut count = 0;
        assert_eq!(lib.nvmlDeviceGetCount_v2(&mut count), SUCCESS);
        assert_eq!(count, 2, "a lost GPU is still counted");
        let mut handle = ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetHandleByIndex_v2(1, &mut handle),
            GPU_IS_LOST
        );
        let mut minor = 0;
        assert_eq!(lib.nvmlDeviceGetMinorNumber(gpu1, &mut minor), GPU_IS_LOST);
        let mut memory: nvmlMemory_t = std::mem::zeroed();
        assert_eq!(lib.nvmlDeviceGetMemoryInfo(mig, &mut memory), GPU_IS_LOST);
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut handle), SUCCESS);
        // The wait reports the loss once.
        assert_eq!(wait(&lib, set, 1000).0, GPU_IS_LOST);
        assert_eq!(wait(&lib, set, 50).0, TIMEOUT);

        store
            .update(|s| health::set_lost(s, 1, false).map(|_| ()))
            .unwrap();
        assert_eq!(lib.nvmlDeviceGetMinorNumber(gpu1, &mut minor), SUCCESS);
        assert_eq!(minor, 1);
        assert_eq!(wait(&lib, set, 50).0, TIMEOUT, "a restore is no event");
        assert_eq!(lib.nvmlEventSetFree(set), SUCCESS);
        assert_eq!(lib.nvmlShutdown(), SUCCESS);
    }
}
