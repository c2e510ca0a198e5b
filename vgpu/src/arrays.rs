//! Bytes a CUDA array takes, computed from its descriptor.
//!
//! The driver rounds arrays up to its own tiling and alignment, which it does
//! not publish; the sizes here are the texel data itself (a lower bound, the
//! same for every caller), so a slice counts arrays consistently and a
//! workload cannot hide memory in arrays the way it could when arrays were
//! not counted at all.

/// `CUDA_ARRAY3D_LAYERED`: `depth` counts layers, not a third dimension.
pub const ARRAY3D_LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`: `depth` counts faces (6, or 6 x layers when layered).
pub const ARRAY3D_CUBEMAP: u32 = 0x04;

/// The shape of an array, as `CUDA_ARRAY_DESCRIPTOR` or
/// `CUDA_ARRAY3D_DESCRIPTOR` give it (0 for a dimension means "not used").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayShape {
    /// `Width`, in elements.
    pub width: u64,
    /// `Height`, in elements (0 for 1D).
    pub height: u64,
    /// `Depth`, in elements or layers (0 for 1D and 2D).
    pub depth: u64,
    /// `Format` (`CUarray_format`).
    pub format: u32,
    /// `NumChannels`.
    pub channels: u32,
    /// `Flags` (3D descriptors only).
    pub flags: u32,
}

/// Texel footprint of a format: bytes per `per_pixels` texels of one channel
/// (`channels_included`: the format already names its channel count).
struct Footprint {
    bytes: u64,
    per_pixels: u64,
    channels_included: bool,
}

fn footprint(format: u32) -> Footprint {
    let per_channel = |bytes| Footprint {
        bytes,
        per_pixels: 1,
        channels_included: false,
    };
    let packed = |bytes, per_pixels| Footprint {
        bytes,
        per_pixels,
        channels_included: true,
    };
    match format {
        // UNSIGNED_INT8, SIGNED_INT8
        0x01 | 0x08 => per_channel(1),
        // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x02 | 0x09 | 0x10 => per_channel(2),
        // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0x03 | 0x0a | 0x20 => per_channel(4),
        // NV12: 8-bit luma plus half-resolution interleaved chroma, 3 bytes per 2 texels.
        0xb0 => packed(3, 2),
        // UNORM_INT8X1, SNORM_INT8X1
        0xc0 | 0xc6 => packed(1, 1),
        // UNORM_INT8X2, UNORM_INT16X1, SNORM_INT8X2, SNORM_INT16X1
        0xc1 | 0xc3 | 0xc7 | 0xc9 => packed(2, 1),
        // UNORM_INT8X4, UNORM_INT16X2, SNORM_INT8X4, SNORM_INT16X2
        0xc2 | 0xc4 | 0xc8 | 0xca => packed(4, 1),
        // UNORM_INT16X4, SNORM_INT16X4
        0xc5 | 0xcb => packed(8, 1),
        // BC1 and BC4 (UNORM, SRGB, SNORM): 8 bytes per 4x4 block.
        0x91 | 0x92 | 0x97 | 0x98 => packed(8, 16),
        // BC2, BC3, BC5, BC6H, BC7: 16 bytes per 4x4 block.
        0x93..=0x96 | 0x99..=0x9e => packed(16, 16),
        // UNORM_INT_101010_2 and other 32-bit packed formats.
        0x50 => packed(4, 1),
        // Unknown (newer) formats: count 4 bytes per channel, the widest
        // plain element, rather than nothing.
        _ => per_channel(4),
    }
}

impl ArrayShape {
    /// Bytes of level 0 of the array.
    pub fn bytes(&self) -> u64 {
        self.level_bytes(0)
    }

    /// Bytes of a mipmapped array with `levels` levels (each level halves
    /// width, height and — unless layered — depth, down to 1).
    pub fn mipmapped_bytes(&self, levels: u32) -> u64 {
        (0..levels.max(1))
            .map(|level| self.level_bytes(level))
            .fold(0u64, u64::saturating_add)
    }

    fn level_bytes(&self, level: u32) -> u64 {
        let shrink = |dim: u64| (dim.max(1) >> level.min(63)).max(1);
        let layered = self.flags & ARRAY3D_LAYERED != 0;
        let cubemap = self.flags & ARRAY3D_CUBEMAP != 0;
        let width = shrink(self.width);
        let height = shrink(self.height);
        // Layers and cube faces (a cubemap's depth is 6, or 6 x layers) do
        // not shrink with the level.
        let depth = if layered || cubemap {
            self.depth.max(1)
        } else {
            shrink(self.depth)
        };
        let texels = width.saturating_mul(height).saturating_mul(depth);
        let fp = footprint(self.format);
        let channels = if fp.channels_included {
            1
        } else {
            u64::from(self.channels.max(1))
        };
        texels
            .saturating_mul(fp.bytes)
            .saturating_mul(channels)
            .div_ceil(fp.per_pixels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(width: u64, height: u64, depth: u64, format: u32, channels: u32) -> ArrayShape {
        ArrayShape {
            width,
            height,
            depth,
            format,
            channels,
            flags: 0,
        }
    }

    #[test]
    fn plain_formats_count_texels_times_channels_times_element() {
        assert_eq!(shape(1024, 0, 0, 0x01, 1).bytes(), 1024);
        assert_eq!(shape(1024, 1024, 0, 0x20, 4).bytes(), 16 << 20);
        assert_eq!(shape(256, 256, 16, 0x10, 2).bytes(), 256 * 256 * 16 * 2 * 2);
    }

    #[test]
    fn packed_and_compressed_formats_ignore_the_channel_count() {
        assert_eq!(shape(1920, 1080, 0, 0xb0, 1).bytes(), 1920 * 1080 * 3 / 2);
        assert_eq!(shape(64, 64, 0, 0x91, 4).bytes(), 64 * 64 / 2);
        assert_eq!(shape(64, 64, 0, 0x9e, 4).bytes(), 64 * 64);
        assert_eq!(shape(10, 10, 0, 0xc5, 4).bytes(), 800);
    }

    #[test]
    fn layers_and_cube_faces_multiply_without_shrinking() {
        let layered = ArrayShape {
            flags: ARRAY3D_LAYERED,
            ..shape(512, 512, 8, 0x03, 1)
        };
        assert_eq!(layered.bytes(), 512 * 512 * 8 * 4);
        assert_eq!(layered.mipmapped_bytes(2), (512 * 512 + 256 * 256) * 8 * 4);
        let cube = ArrayShape {
            flags: ARRAY3D_CUBEMAP,
            ..shape(64, 64, 6, 0x01, 1)
        };
        assert_eq!(cube.bytes(), 64 * 64 * 6);
        assert_eq!(cube.mipmapped_bytes(2), (64 * 64 + 32 * 32) * 6);
    }

    #[test]
    fn mip_levels_halve_every_dimension_down_to_one() {
        let s = shape(8, 4, 0, 0x01, 1);
        // 8x4 + 4x2 + 2x1 + 1x1 + 1x1
        assert_eq!(s.mipmapped_bytes(5), 32 + 8 + 2 + 1 + 1);
        assert_eq!(s.mipmapped_bytes(0), 32);
    }

    #[test]
    fn absurd_sizes_saturate_instead_of_wrapping() {
        assert_eq!(shape(u64::MAX, u64::MAX, 0, 0x20, 4).bytes(), u64::MAX);
    }
}
