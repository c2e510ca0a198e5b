//! Device virtual addresses.
//!
//! Device pointers are fake: nothing backs them and nothing reads through
//! them. They come from one address range the process reserves at `cuInit`
//! with an inaccessible, unbacked mapping (`PROT_NONE`, `MAP_NORESERVE`), so
//! they are unique, never collide with host memory (as with the real
//! driver's unified addressing), and fault if anything dereferences one.
//! When the reservation is refused (an address-space limit) the same range
//! is used unreserved.
//!
//! Allocation is a bump pointer with free lists per (size, alignment)
//! class: O(1) both ways, and addresses are reused when the same sizes come
//! back, which keeps a long alloc/free loop inside the range.

use crate::fasthash::IntMap;

/// Size of the reserved range: 16 TiB.
pub const RANGE_BYTES: u64 = 16 << 40;
/// Where the range is asked for.
const RANGE_HINT: u64 = 0x2000_0000_0000;
/// Alignment of small allocations (what `cuMemAlloc` guarantees and more).
pub const SMALL_ALIGN: u64 = 512;
/// Alignment of allocations of 2 MiB and more, and the VMM granularity.
pub const LARGE_ALIGN: u64 = 2 << 20;

/// The range and its allocator.
#[derive(Debug)]
pub struct VaSpace {
    base: u64,
    end: u64,
    next: u64,
    free: IntMap<(u64, u64), Vec<u64>>,
}

impl VaSpace {
    /// Reserves the range (or falls back to an unreserved one).
    pub fn reserve() -> VaSpace {
        // SAFETY: an anonymous PROT_NONE mapping at a hint address; the
        // kernel picks another address if the hint is taken, and with
        // MAP_NORESERVE nothing is committed. The mapping is never unmapped:
        // it lives as long as the process, like the driver's.
        let base = unsafe {
            libc::mmap(
                RANGE_HINT as *mut libc::c_void,
                RANGE_BYTES as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        let base = if base == libc::MAP_FAILED {
            RANGE_HINT
        } else {
            base as u64
        };
        VaSpace::at(
            base.next_multiple_of(LARGE_ALIGN),
            RANGE_BYTES - LARGE_ALIGN,
        )
    }

    /// An allocator over `[base, base + len)` (tests).
    pub fn at(base: u64, len: u64) -> VaSpace {
        VaSpace {
            base,
            end: base + len,
            next: base,
            free: IntMap::default(),
        }
    }

    /// The alignment `cuMemAlloc` gives an allocation of `bytes`.
    pub fn default_align(bytes: u64) -> u64 {
        if bytes >= LARGE_ALIGN {
            LARGE_ALIGN
        } else {
            SMALL_ALIGN
        }
    }

    /// `bytes` (rounded up to `align`) at an `align`-aligned address, or
    /// `None` when the range is used up. `align` is a power of two ≥ 512.
    pub fn alloc(&mut self, bytes: u64, align: u64) -> Option<u64> {
        let size = bytes.max(1).checked_next_multiple_of(align)?;
        if let Some(addr) = self.free.get_mut(&(size, align)).and_then(Vec::pop) {
            return Some(addr);
        }
        let addr = self.next.checked_next_multiple_of(align)?;
        let end = addr.checked_add(size)?;
        if end > self.end {
            return None;
        }
        self.next = end;
        Some(addr)
    }

    /// Returns what [`VaSpace::alloc`] gave for the same `bytes` and `align`.
    pub fn free(&mut self, addr: u64, bytes: u64, align: u64) {
        if let Some(size) = bytes.max(1).checked_next_multiple_of(align) {
            self.free.entry((size, align)).or_default().push(addr);
        }
    }

    /// Whether `addr` lies in the range.
    pub fn contains(&self, addr: u64) -> bool {
        (self.base..self.end).contains(&addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_aligned_unique_and_reused() {
        let mut va = VaSpace::at(1 << 40, 1 << 30);
        let a = va.alloc(100, SMALL_ALIGN).unwrap();
        let b = va.alloc(3 << 20, LARGE_ALIGN).unwrap();
        let c = va.alloc(100, SMALL_ALIGN).unwrap();
        assert_eq!(a % SMALL_ALIGN, 0);
        assert_eq!(b % LARGE_ALIGN, 0);
        assert!(b >= a + 512 && c >= b + (4 << 20));
        va.free(b, 3 << 20, LARGE_ALIGN);
        assert_eq!(va.alloc(3 << 20, LARGE_ALIGN), Some(b));
        assert!(va.contains(a) && !va.contains(1));
    }

    #[test]
    fn the_range_runs_out() {
        let mut va = VaSpace::at(1 << 40, 4 << 20);
        assert!(va.alloc(2 << 20, LARGE_ALIGN).is_some());
        assert!(va.alloc(2 << 20, LARGE_ALIGN).is_some());
        assert_eq!(va.alloc(2 << 20, LARGE_ALIGN), None);
    }
}
