//! The one way the stand-ins and their readers map a small file that
//! several processes share (a device timeline, a process's utilization
//! file): shared, read-write, the whole file, unmapped when dropped.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A shared read-write mapping of a whole file, which it keeps open.
#[derive(Debug)]
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
    file: File,
}

// SAFETY: the mapping is owned by this value alone; what is stored through
// it is the owner's concern (every user here accesses it atomically).
unsafe impl Send for SharedMap {}

impl SharedMap {
    /// Maps the first `len` bytes of `file`. The caller has made sure the
    /// file is at least `len` bytes long (a touch past its end is SIGBUS).
    pub fn new(file: File, len: usize) -> io::Result<SharedMap> {
        // SAFETY: a new shared mapping at an address the kernel picks, of a
        // file kept open while mapped; nothing is dereferenced here.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: map.cast(),
            len,
            file,
        })
    }

    /// The start of the mapping: page-aligned, `len` bytes, readable and
    /// writable for as long as this value lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Keeps the mapping for the life of the process (the file is closed:
    /// a mapping does not need it).
    pub fn leak(self) -> *mut u8 {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the file is read out once and dropped; `this` is never
        // dropped, so neither the file nor the mapping is released twice.
        drop(unsafe { std::ptr::read(&this.file) });
        this.ptr
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in new; its users borrow
        // this value, so no reference outlives it.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
