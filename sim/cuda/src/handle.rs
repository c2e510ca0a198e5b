//! Opaque CUDA handles as tagged integers.
//!
//! The real driver hands out pointers to its own structures. Ours carry the
//! kind of object, the device ordinal and a serial in the pointer value, so
//! the launch path can tell a stream's device without a lookup, and a bogus
//! or stale pointer is never dereferenced:
//!
//! ```text
//!  63      48 47  44 43       32 31                     0
//! +----------+------+-----------+------------------------+
//! |  0x7E5C  | kind |  device   |         serial         |
//! +----------+------+-----------+------------------------+
//! ```
//!
//! The magic makes every handle a non-canonical x86-64 address, so none can
//! equal a real pointer. The values 0, 1 and 2 that CUDA gives meaning as
//! streams (`NULL`, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) never
//! decode. Whether the object still exists is the registry's business
//! (`crate::driver`).

#[cfg(not(target_pointer_width = "64"))]
compile_error!("tessera-sim-cuda encodes handles in 64-bit pointers");

const MAGIC: u64 = 0x7E5C;
const MAGIC_SHIFT: u32 = 48;
const KIND_SHIFT: u32 = 44;
const DEVICE_SHIFT: u32 = 32;
const KIND_MASK: u64 = 0xF;
const DEVICE_MASK: u64 = 0xFFF;
const SERIAL_MASK: u64 = 0xFFFF_FFFF;

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// `CUcontext`; serial 0 is the device's primary context.
    Context = 1,
    /// `CUstream`.
    Stream = 2,
    /// `CUmodule`.
    Module = 3,
    /// `CUfunction`.
    Function = 4,
    /// `CUgraph`.
    Graph = 5,
    /// `CUgraphNode`.
    GraphNode = 6,
    /// `CUgraphExec`.
    GraphExec = 7,
    /// `CUmemoryPool`; serial 0 is the device's default pool.
    Pool = 8,
    /// `CUarray`.
    Array = 9,
    /// `CUmipmappedArray`.
    MipmappedArray = 10,
    /// `CUmemGenericAllocationHandle` (an integer, not a pointer, in C).
    MemHandle = 11,
}

impl Kind {
    fn from_bits(bits: u64) -> Option<Kind> {
        Some(match bits {
            1 => Kind::Context,
            2 => Kind::Stream,
            3 => Kind::Module,
            4 => Kind::Function,
            5 => Kind::Graph,
            6 => Kind::GraphNode,
            7 => Kind::GraphExec,
            8 => Kind::Pool,
            9 => Kind::Array,
            10 => Kind::MipmappedArray,
            11 => Kind::MemHandle,
            _ => return None,
        })
    }
}

/// A decoded handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    /// What it names.
    pub kind: Kind,
    /// Device ordinal of the object.
    pub device: u32,
    /// Serial, unique per process among live objects.
    pub serial: u32,
}

impl Handle {
    /// A handle of `kind` for the object `serial` on `device`.
    pub const fn new(kind: Kind, device: u32, serial: u32) -> Handle {
        Handle {
            kind,
            device,
            serial,
        }
    }

    /// The handle's integer value (devices past 4095 cannot occur: the
    /// driver never enumerates that many).
    #[inline]
    pub fn value(self) -> u64 {
        (MAGIC << MAGIC_SHIFT)
            | ((self.kind as u64) << KIND_SHIFT)
            | ((u64::from(self.device) & DEVICE_MASK) << DEVICE_SHIFT)
            | u64::from(self.serial)
    }

    /// The handle as an opaque C pointer.
    #[inline]
    pub fn ptr<T>(self) -> *mut T {
        std::ptr::without_provenance_mut(self.value() as usize)
    }

    /// The handle behind `value`, or `None` for anything this library did not make.
    #[inline]
    pub fn decode(value: u64) -> Option<Handle> {
        if value >> MAGIC_SHIFT != MAGIC {
            return None;
        }
        let kind = Kind::from_bits((value >> KIND_SHIFT) & KIND_MASK)?;
        Some(Handle {
            kind,
            device: ((value >> DEVICE_SHIFT) & DEVICE_MASK) as u32,
            serial: (value & SERIAL_MASK) as u32,
        })
    }

    /// The handle behind a C pointer, if it is one of `kind`.
    #[inline]
    pub fn of<T>(ptr: *mut T, kind: Kind) -> Option<Handle> {
        Handle::decode(ptr.addr() as u64).filter(|h| h.kind == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_strangers_do_not_decode() {
        for h in [
            Handle::new(Kind::Context, 0, 0),
            Handle::new(Kind::Stream, 7, 123_456),
            Handle::new(Kind::MemHandle, 4095, u32::MAX),
        ] {
            assert_eq!(Handle::decode(h.value()), Some(h));
            assert_eq!(Handle::of(h.ptr::<u8>(), h.kind), Some(h));
        }
        for v in [0u64, 1, 2, 0x7fff_dead_beef, u64::MAX] {
            assert_eq!(Handle::decode(v), None, "{v:#x}");
        }
        let ctx = Handle::new(Kind::Context, 1, 2);
        assert_eq!(Handle::of(ctx.ptr::<u8>(), Kind::Stream), None);
        assert_eq!(Handle::decode(ctx.value() & !(0xF << 44)), None);
    }
}
