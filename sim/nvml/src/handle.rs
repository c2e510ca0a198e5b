//! Opaque NVML handles as tagged integers.
//!
//! Real NVML hands out pointers to its own structures. Ours carry their whole
//! meaning in the pointer value, so there is nothing to allocate, free or keep
//! alive, and a handle from before a reload of the state file stays usable
//! exactly as long as the object it names exists. Nothing ever dereferences
//! one.
//!
//! Layout of the 64-bit value:
//!
//! ```text
//!  63      48 47  44 43       32 31        16 15         0
//! +----------+------+-----------+------------+------------+
//! |  0x7E55  | kind | gpu index |   GI id    |   CI id    |
//! +----------+------+-----------+------------+------------+
//! ```
//!
//! The magic makes every handle a non-canonical x86-64 address, so it can
//! never equal a real pointer and cannot be confused with one; `kind` is
//! 1 = GPU, 2 = GPU instance, 3 = compute instance, 4 = MIG device, 5 = event
//! set (its 32-bit id across the GI and CI fields, the GPU field zero). Fields
//! a kind does not use must be zero. A MIG device handle names the compute
//! instance behind it, ⟨gpu, GI id, CI id⟩, not its MIG index, so it keeps
//! naming the same device when others come and go. Decoding checks only the
//! shape; whether the object exists is checked against the node state by the
//! caller ([`crate::node`]), and anything else is `INVALID_ARGUMENT`.

#[cfg(not(target_pointer_width = "64"))]
compile_error!("tessera-sim-nvml encodes handles in 64-bit pointers");

const MAGIC: u64 = 0x7E55;
const MAGIC_SHIFT: u32 = 48;
const KIND_SHIFT: u32 = 44;
const GPU_SHIFT: u32 = 32;
const GI_SHIFT: u32 = 16;
const KIND_MASK: u64 = 0xF;
const GPU_MASK: u64 = 0xFFF;
const ID_MASK: u64 = 0xFFFF;

const KIND_GPU: u64 = 1;
const KIND_GPU_INSTANCE: u64 = 2;
const KIND_COMPUTE_INSTANCE: u64 = 3;
const KIND_MIG_DEVICE: u64 = 4;
const KIND_EVENT_SET: u64 = 5;

/// What an NVML handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handle {
    /// A physical GPU (`nvmlDevice_t`), by NVML index.
    Gpu {
        /// NVML index.
        gpu: u32,
    },
    /// A GPU instance (`nvmlGpuInstance_t`).
    GpuInstance {
        /// NVML index of the parent GPU.
        gpu: u32,
        /// Driver-assigned GI id.
        gi: u32,
    },
    /// A compute instance (`nvmlComputeInstance_t`).
    ComputeInstance {
        /// NVML index of the parent GPU.
        gpu: u32,
        /// GI id.
        gi: u32,
        /// CI id within the GI.
        ci: u32,
    },
    /// A MIG device (an `nvmlDevice_t` standing for one compute instance).
    MigDevice {
        /// NVML index of the parent GPU.
        gpu: u32,
        /// GI id.
        gi: u32,
        /// CI id within the GI.
        ci: u32,
    },
    /// An event set (`nvmlEventSet_t`), by the id the library gave it.
    EventSet {
        /// The set's id (never 0).
        id: u32,
    },
}

impl Handle {
    /// The handle's pointer value; `None` when an index or id does not fit its
    /// field (GPU index ≥ 4096, ids ≥ 65536), which no real node reaches.
    pub fn encode(self) -> Option<usize> {
        let (kind, gpu, gi, ci) = match self {
            Handle::Gpu { gpu } => (KIND_GPU, gpu, 0, 0),
            Handle::GpuInstance { gpu, gi } => (KIND_GPU_INSTANCE, gpu, gi, 0),
            Handle::ComputeInstance { gpu, gi, ci } => (KIND_COMPUTE_INSTANCE, gpu, gi, ci),
            Handle::MigDevice { gpu, gi, ci } => (KIND_MIG_DEVICE, gpu, gi, ci),
            Handle::EventSet { id } => (KIND_EVENT_SET, 0, id >> 16, id & 0xFFFF),
        };
        let (gpu, gi, ci) = (u64::from(gpu), u64::from(gi), u64::from(ci));
        if gpu > GPU_MASK || gi > ID_MASK || ci > ID_MASK {
            return None;
        }
        let value = (MAGIC << MAGIC_SHIFT)
            | (kind << KIND_SHIFT)
            | (gpu << GPU_SHIFT)
            | (gi << GI_SHIFT)
            | ci;
        usize::try_from(value).ok()
    }

    /// The handle a pointer value stands for, or `None` for anything this
    /// library did not hand out (null, a real pointer, a corrupted value).
    pub fn decode(value: usize) -> Option<Handle> {
        let value = value as u64;
        if value >> MAGIC_SHIFT != MAGIC {
            return None;
        }
        let kind = (value >> KIND_SHIFT) & KIND_MASK;
        let gpu = ((value >> GPU_SHIFT) & GPU_MASK) as u32;
        let gi = ((value >> GI_SHIFT) & ID_MASK) as u32;
        let ci = (value & ID_MASK) as u32;
        match kind {
            KIND_GPU if gi == 0 && ci == 0 => Some(Handle::Gpu { gpu }),
            KIND_GPU_INSTANCE if ci == 0 => Some(Handle::GpuInstance { gpu, gi }),
            KIND_COMPUTE_INSTANCE => Some(Handle::ComputeInstance { gpu, gi, ci }),
            KIND_MIG_DEVICE => Some(Handle::MigDevice { gpu, gi, ci }),
            KIND_EVENT_SET if gpu == 0 && (gi | ci) != 0 => Some(Handle::EventSet {
                id: (gi << 16) | ci,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        let all = [
            Handle::Gpu { gpu: 0 },
            Handle::Gpu { gpu: 4095 },
            Handle::GpuInstance { gpu: 3, gi: 0 },
            Handle::GpuInstance { gpu: 3, gi: 13 },
            Handle::ComputeInstance {
                gpu: 7,
                gi: 2,
                ci: 0,
            },
            Handle::MigDevice {
                gpu: 7,
                gi: 2,
                ci: 0,
            },
            Handle::MigDevice {
                gpu: 1,
                gi: 65535,
                ci: 65535,
            },
            Handle::EventSet { id: 1 },
            Handle::EventSet { id: u32::MAX },
        ];
        for h in all {
            let v = h.encode().expect("fits");
            assert_ne!(v, 0, "{h:?} encodes to null");
            assert_eq!(Handle::decode(v), Some(h), "{h:?} -> {v:#x}");
        }
    }

    #[test]
    fn kinds_with_equal_ids_encode_differently() {
        let ci = Handle::ComputeInstance {
            gpu: 0,
            gi: 1,
            ci: 0,
        }
        .encode();
        let mig = Handle::MigDevice {
            gpu: 0,
            gi: 1,
            ci: 0,
        }
        .encode();
        assert_ne!(ci, mig);
    }

    #[test]
    fn garbage_does_not_decode() {
        let gpu0 = Handle::Gpu { gpu: 0 }.encode().unwrap();
        for v in [
            0usize,
            1,
            0x7fff_dead_beef,
            usize::MAX,
            gpu0 | 0x1,
            gpu0 | (5 << 44),
        ] {
            assert_eq!(Handle::decode(v), None, "{v:#x}");
        }
        let gi = Handle::GpuInstance { gpu: 0, gi: 1 }.encode().unwrap();
        assert_eq!(Handle::decode(gi | 1), None, "a GI handle with a CI field");
    }

    #[test]
    fn out_of_range_ids_do_not_encode() {
        assert_eq!(Handle::Gpu { gpu: 4096 }.encode(), None);
        assert_eq!(Handle::GpuInstance { gpu: 0, gi: 65536 }.encode(), None);
    }
}
