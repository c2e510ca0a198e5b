//! Reading arguments from and writing results to the caller's memory.
//!
//! Every pointer an NVML function receives is checked for null here
//! (`INVALID_ARGUMENT`); beyond that, NVML's contract is that a non-null
//! pointer is valid for the access its documentation describes, and these
//! helpers rely on that and on nothing else. Accesses are unaligned so a
//! packed caller struct cannot trip them.

use std::ffi::{CStr, c_char, c_uint};

use crate::ffi::{ERROR_INSUFFICIENT_SIZE, ERROR_INVALID_ARGUMENT, ERROR_UNKNOWN};
use crate::node::Res;

/// Writes `value` through `out`.
///
/// # Safety
/// `out` is null or valid for writing one `T`.
pub unsafe fn write<T>(out: *mut T, value: T) -> Res<()> {
    if out.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for one write of T by this function's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Writes `values` to the array at `out`.
///
/// # Safety
/// `out` is null or valid for writing `values.len()` consecutive `T`s.
pub unsafe fn write_all<T: Copy>(out: *mut T, values: &[T]) -> Res<()> {
    if out.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    for (i, value) in values.iter().enumerate() {
        // SAFETY: non-null, and element i < values.len() is in the caller's
        // array by this function's contract.
        unsafe { out.add(i).write_unaligned(*value) };
    }
    Ok(())
}

/// Writes an NVML array result whose array and count are both required:
/// `values` to `array`, their number to `*count`.
///
/// # Safety
/// `array` is null or valid for writing `values.len()` consecutive `T`s;
/// `count` is null or valid for one write.
pub unsafe fn write_array<T: Copy>(array: *mut T, count: *mut c_uint, values: &[T]) -> Res<()> {
    if array.is_null() || count.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let n = c_uint::try_from(values.len()).map_err(|_| ERROR_UNKNOWN)?;
    // SAFETY: both non-null, and valid by this function's contract.
    unsafe {
        write_all(array, values)?;
        write(count, n)
    }
}

/// Writes an NVML array result whose array may be NULL (a size query): the
/// number of `values` to `*count` and, unless `array` is null, `values` to it.
///
/// # Safety
/// `array` is null or valid for writing `values.len()` consecutive `T`s;
/// `count` is null or valid for one write.
pub unsafe fn write_counted<T: Copy>(array: *mut T, count: *mut c_uint, values: &[T]) -> Res<()> {
    if count.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    if !array.is_null() {
        // SAFETY: non-null, and valid by this function's contract.
        unsafe { write_all(array, values) }?;
    }
    let n = c_uint::try_from(values.len()).map_err(|_| ERROR_UNKNOWN)?;
    // SAFETY: non-null, and valid by this function's contract.
    unsafe { write(count, n) }
}

/// Reads one `T` from `ptr`.
///
/// # Safety
/// `ptr` is null or valid for reading one `T`.
pub unsafe fn read<T: Copy>(ptr: *const T) -> Res<T> {
    if ptr.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for one read of T by this function's contract.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Reads the `version` word that opens every versioned NVML struct.
///
/// # Safety
/// `info` is null or points to a struct that starts with an `unsigned int`.
pub unsafe fn read_version<T>(info: *const T) -> Res<c_uint> {
    // SAFETY: forwarded contract: a non-null `info` starts with a readable c_uint.
    unsafe { read(info.cast::<c_uint>()) }
}

/// Copies `text` and a NUL into the caller's buffer of `length` bytes;
/// `INSUFFICIENT_SIZE` when it does not fit, as NVML does.
///
/// # Safety
/// `buf` is null or valid for writing `length` bytes.
pub unsafe fn write_str(buf: *mut c_char, length: c_uint, text: &str) -> Res<()> {
    if buf.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if (length as usize) < bytes.len() + 1 {
        return Err(ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `length` ≥ bytes.len() + 1 bytes by this
    // function's contract; source and destination cannot overlap, the source
    // being our own string.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// The caller's NUL-terminated string, if it is UTF-8.
///
/// # Safety
/// `text` is null or points to a NUL-terminated string that stays valid and
/// unchanged for the lifetime `'a`.
pub unsafe fn read_str<'a>(text: *const c_char) -> Res<&'a str> {
    if text.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by this function's contract.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| ERROR_INVALID_ARGUMENT)
}

/// Fills a fixed `char name[N]` field: `text` cut to `N - 1` bytes, then NULs.
pub fn fill_name<const N: usize>(field: &mut [c_char; N], text: &str) {
    field.fill(0);
    for (dst, src) in field.iter_mut().zip(text.bytes().take(N.saturating_sub(1))) {
        *dst = src as c_char;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::ERROR_INSUFFICIENT_SIZE;

    #[test]
    fn strings_need_room_for_the_nul() {
        let mut buf = [0x55 as c_char; 8];
        // SAFETY: buf is 8 writable bytes.
        let short = unsafe { write_str(buf.as_mut_ptr(), 5, "hello") };
        assert_eq!(short, Err(ERROR_INSUFFICIENT_SIZE));
        // SAFETY: buf is 8 writable bytes.
        unsafe { write_str(buf.as_mut_ptr(), 6, "hello") }.unwrap();
        assert_eq!(&buf[..6], b"hello\0".map(|b| b as c_char));
        assert_eq!(buf[6], 0x55, "nothing written past the NUL");
    }

    #[test]
    fn null_pointers_are_invalid_arguments() {
        // SAFETY: null is allowed by every helper's contract.
        unsafe {
            assert_eq!(
                write(std::ptr::null_mut::<u32>(), 1),
                Err(ERROR_INVALID_ARGUMENT)
            );
            assert_eq!(
                write_str(std::ptr::null_mut(), 80, "x"),
                Err(ERROR_INVALID_ARGUMENT)
            );
            assert_eq!(read_str(std::ptr::null()), Err(ERROR_INVALID_ARGUMENT));
            assert_eq!(read(std::ptr::null::<u32>()), Err(ERROR_INVALID_ARGUMENT));
        }
    }

    #[test]
    fn names_are_cut_and_terminated() {
        let mut field = [1 as c_char; 4];
        fill_name(&mut field, "MIG 1g.10gb");
        assert_eq!(field, [b'M', b'I', b'G', 0].map(|b| b as c_char));
    }
}
