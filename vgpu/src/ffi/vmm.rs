//! Virtual memory management: VMM memory counts while a handle reference
//! or a mapping remains (the ledger is `crate::vmm`'s). `cuMemCreate`
//! charges, the rest follow references, mappings, and handles shared
//! between processes as file descriptors.

use std::ffi::{c_int, c_void};

use super::driver::rt;
use super::guard::{contained, protect};
use super::types::{
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_LOCATION_TYPE_DEVICE, CUdeviceptr, CUresult,
    CuMemAllocationProp,
};
use crate::memory::{OUT_OF_MEMORY, SUCCESS};
use crate::names::Hook;
use crate::vmm;

intercept! {
    /// `cuMemCreate`: charged to the device the location names (host
    /// locations are not counted) before the driver call; the memory then
    /// lives as long as a handle reference or a mapping does.
    MemCreate => fn cuMemCreate(
        handle: *mut u64,
        size: usize,
        prop: *const CuMemAllocationProp,
        flags: u64,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(handle, size, prop, flags) };
        if handle.is_null() || prop.is_null() {
            return call();
        }
        // SAFETY: prop is non-null and points to the caller's CUmemAllocationProp.
        let location = unsafe { std::ptr::addr_of!((*prop).location).read_unaligned() };
        if location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
            return call();
        }
        protect(
            cuMemCreate::HOOK,
            |driver| {
                let rt = rt();
                let Some(device) = rt.device(location.id).filter(|_| rt.enforcing()) else {
                    return driver.call(call);
                };
                let Some(limit) = device.memory_limit else {
                    return driver.call(call);
                };
                if !rt.try_charge(device, size as u64, limit) {
                    return OUT_OF_MEMORY;
                }
                let rc = driver.call(call);
                if rc == SUCCESS {
                    // SAFETY: handle is non-null; written on success.
                    let h = unsafe { handle.read_unaligned() };
                    if let Some((slot, bytes)) = vmm::global().created(h, device.slot, size as u64)
                    {
                        rt.uncharge(slot, bytes);
                    }
                } else {
                    rt.uncharge(device.slot, size as u64);
                }
                rc
            },
            call,
        )
    }
}

/// Gives back what the VMM ledger says is gone.
fn give_back(freed: impl IntoIterator<Item = vmm::Freed>) {
    let rt = rt();
    for (slot, bytes) in freed {
        rt.uncharge(slot, bytes);
    }
}

intercept! {
    /// `cuMemRelease`: one handle reference less; the charge goes with the
    /// last reference and mapping.
    MemRelease => fn cuMemRelease(handle: u64) -> CUresult;
    |real| {
        // SAFETY: the caller's argument, unchanged.
        let call = || unsafe { real(handle) };
        let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
            if rc == SUCCESS {
                let _ = contained("cuMemRelease", || give_back(ledger.released(handle)));
            }
        });
        rc
    }
}

intercept! {
    /// `cuMemMap`: the mapping keeps the physical memory alive.
    MemMap => fn cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: u64,
        flags: u64,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(ptr, size, offset, handle, flags) };
        let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
            if rc == SUCCESS {
                let _ = contained("cuMemMap", || ledger.mapped(ptr, size as u64, handle));
            }
        });
        rc
    }
}

/// `cuMemUnmap` or `cuMemAddressFree` of `[ptr, ptr + size)`: mappings that
/// start in the range are gone; physical memory whose last reference and
/// mapping went is given back.
fn unmapped(hook: Hook, ptr: CUdeviceptr, size: usize, call: impl Fn() -> CUresult) -> CUresult {
    let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
        if rc == SUCCESS {
            let _ = contained(hook.symbol(), || {
                give_back(ledger.unmapped(ptr, size as u64))
            });
        }
    });
    rc
}

intercept! {
    /// `cuMemUnmap`: see `unmapped`.
    MemUnmap => fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        unmapped(cuMemUnmap::HOOK, ptr, size, || unsafe { real(ptr, size) })
    }
}

intercept! {
    /// `cuMemAddressFree`: see `unmapped`.
    MemAddressFree => fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        unmapped(cuMemAddressFree::HOOK, ptr, size, || unsafe { real(ptr, size) })
    }
}

intercept! {
    /// `cuMemRetainAllocationHandle`: one more reference to the mapped memory.
    MemRetainAllocationHandle => fn cuMemRetainAllocationHandle(
        handle: *mut u64,
        addr: *mut c_void,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(handle, addr) };
        let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
            if rc == SUCCESS && !handle.is_null() {
                let _ = contained("cuMemRetainAllocationHandle", || {
                    // SAFETY: handle is non-null; written on success.
                    ledger.referenced(unsafe { handle.read_unaligned() }, 0);
                });
            }
        });
        rc
    }
}

/// The identity (device, inode) of the file a descriptor names.
fn file_identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: a zeroed stat is a valid out-buffer; fstat writes it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on the caller's descriptor with a live buffer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

intercept! {
    /// `cuMemExportToShareableHandle`: remembers which allocation a POSIX
    /// file descriptor names, so that importing it again in this process
    /// counts as one more reference to the same memory.
    MemExportToShareableHandle => fn cuMemExportToShareableHandle(
        shareable: *mut c_void,
        handle: u64,
        kind: c_int,
        flags: u64,
    ) -> CUresult;
    |real| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { real(shareable, handle, kind, flags) };
        if rc == SUCCESS && kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && !shareable.is_null()
        {
            let _ = contained("cuMemExportToShareableHandle", || {
                // SAFETY: for this handle type the driver wrote an int there.
                let fd = unsafe { shareable.cast::<c_int>().read_unaligned() };
                if let Some(object) = file_identity(fd) {
                    vmm::global().exported(handle, object);
                }
            });
        }
        rc
    }
}

intercept! {
    /// `cuMemImportFromShareableHandle`: a descriptor this process exported
    /// is one more reference to its allocation (under a new handle); another
    /// process's is tracked (that process charged it).
    MemImportFromShareableHandle => fn cuMemImportFromShareableHandle(
        handle: *mut u64,
        os_handle: *mut c_void,
        kind: c_int,
    ) -> CUresult;
    |real| {
        let object = (kind == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            .then(|| file_identity(os_handle as usize as c_int))
            .flatten();
        // SAFETY: the caller's arguments, unchanged.
        let call = || unsafe { real(handle, os_handle, kind) };
        let (rc, _) = vmm::global().locked(call, |&rc, ledger| {
            if rc == SUCCESS && !handle.is_null() {
                let _ = contained("cuMemImportFromShareableHandle", || {
                    // SAFETY: handle is non-null; written on success.
                    let h = unsafe { handle.read_unaligned() };
                    if !object.is_some_and(|o| ledger.imported(h, o)) {
                        ledger.referenced(h, 0);
                    }
                });
            }
        });
        rc
    }
}
