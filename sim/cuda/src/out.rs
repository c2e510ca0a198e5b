//! Reading arguments from and writing results to the caller's memory.
//!
//! Every pointer a driver function receives is checked for null here
//! (`CUDA_ERROR_INVALID_VALUE`); beyond that, the CUDA contract is that a
//! non-null pointer is valid for the access its documentation describes,
//! and these helpers rely on that and on nothing else. Accesses are
//! unaligned so a packed caller struct cannot trip them.

use std::ffi::{CStr, c_char, c_int};

use crate::driver::Res;
use crate::ffi::CUDA_ERROR_INVALID_VALUE;

/// Writes `value` through `out`.
///
/// # Safety
/// `out` is null or valid for writing one `T`.
#[inline]
pub unsafe fn write<T>(out: *mut T, value: T) -> Res<()> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for one write of T by this function's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Reads one `T` from `ptr`.
///
/// # Safety
/// `ptr` is null or valid for reading one `T`.
#[inline]
pub unsafe fn read<T: Copy>(ptr: *const T) -> Res<T> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for one read of T by this function's contract.
    Ok(unsafe { ptr.read_unaligned() })
}

/// The caller's NUL-terminated string.
///
/// # Safety
/// `text` is null or points to a NUL-terminated string that stays valid
/// and unchanged for `'a`.
pub unsafe fn read_str<'a>(text: *const c_char) -> Res<&'a CStr> {
    if text.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and NUL-terminated by this function's contract.
    Ok(unsafe { CStr::from_ptr(text) })
}

/// Copies `text` into the caller's buffer of `len` bytes, cut to `len − 1`
/// bytes and NUL-terminated, as the driver's string queries do.
///
/// # Safety
/// `buf` is null or valid for writing `len` bytes.
pub unsafe fn write_str(buf: *mut c_char, len: c_int, text: &[u8]) -> Res<()> {
    let Ok(len) = usize::try_from(len) else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    if buf.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = text.len().min(len - 1);
    // SAFETY: the buffer holds `len` > n bytes by this function's contract;
    // the source is our own string, so they cannot overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_cut_and_terminated() {
        let mut buf = [0x55 as c_char; 8];
        // SAFETY: buf holds 8 bytes.
        unsafe { write_str(buf.as_mut_ptr(), 4, b"hello") }.unwrap();
        assert_eq!(&buf[..5], b"hel\0\x55".map(|b| b as c_char));
        // SAFETY: null is allowed.
        let err = unsafe { write_str(std::ptr::null_mut(), 4, b"x") };
        assert_eq!(err, Err(CUDA_ERROR_INVALID_VALUE));
        // SAFETY: buf holds 8 bytes; a zero length writes nothing.
        let zero = unsafe { write_str(buf.as_mut_ptr(), 0, b"x") };
        assert_eq!(zero, Err(CUDA_ERROR_INVALID_VALUE));
    }
}
