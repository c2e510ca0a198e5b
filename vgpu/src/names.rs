//! Which driver entry points the library answers, under which names.
//!
//! A function can be reached three ways, and every way must land on the same
//! wrapper:
//!
//! - by its exported symbol (a program linked to `libcuda.so.1`, or `dlsym`
//!   on a handle): the *exact* name, e.g. `cuMemAlloc_v2`, or `cuMemAlloc`
//!   for the legacy 32-bit entry point ([`Hook::by_symbol`]);
//! - through `cuGetProcAddress[_v2]`, the way every CUDA ≥ 11.3 runtime finds
//!   the driver: a *base* name, the CUDA version the caller was built for, and
//!   the default-stream flag ([`Hook::by_proc`]), which together pick one ABI
//!   version (`cuMemAlloc` at 3020 and later is `cuMemAlloc_v2`; with the
//!   per-thread default stream, `cuLaunchKernel` is `cuLaunchKernel_ptsz`);
//! - NVML's memory queries, by exported symbol or `dlsym` only.
//!
//! This module is pure: it maps names to [`Hook`]s; `ffi` maps hooks to
//! wrapper and real function pointers.

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// The registry of intercepted entry points: every hook, once, with the
/// symbol it is exported under. Calls `$callback!` with the list
/// (`Variant => symbol,` …): [`Hook`] here, and `ffi`'s table of exports
/// from the same list, so a name cannot be registered without its export
/// (nor the other way round).
macro_rules! with_hooks {
    ($callback:ident) => {
        $callback! {
            GetProcAddress => cuGetProcAddress,
            GetProcAddressV2 => cuGetProcAddress_v2,
            MemAlloc => cuMemAlloc,
            MemAllocV2 => cuMemAlloc_v2,
            MemAllocPitch => cuMemAllocPitch,
            MemAllocPitchV2 => cuMemAllocPitch_v2,
            MemAllocManaged => cuMemAllocManaged,
            MemFree => cuMemFree,
            MemFreeV2 => cuMemFree_v2,
            MemCreate => cuMemCreate,
            MemRelease => cuMemRelease,
            MemAllocAsync => cuMemAllocAsync,
            MemAllocAsyncPtsz => cuMemAllocAsync_ptsz,
            MemAllocFromPoolAsync => cuMemAllocFromPoolAsync,
            MemAllocFromPoolAsyncPtsz => cuMemAllocFromPoolAsync_ptsz,
            MemFreeAsync => cuMemFreeAsync,
            MemFreeAsyncPtsz => cuMemFreeAsync_ptsz,
            ArrayCreate => cuArrayCreate,
            ArrayCreateV2 => cuArrayCreate_v2,
            Array3DCreate => cuArray3DCreate,
            Array3DCreateV2 => cuArray3DCreate_v2,
            ArrayDestroy => cuArrayDestroy,
            MipmappedArrayCreate => cuMipmappedArrayCreate,
            MipmappedArrayDestroy => cuMipmappedArrayDestroy,
            MemMap => cuMemMap,
            MemUnmap => cuMemUnmap,
            MemAddressFree => cuMemAddressFree,
            MemRetainAllocationHandle => cuMemRetainAllocationHandle,
            MemImportFromShareableHandle => cuMemImportFromShareableHandle,
            MemExportToShareableHandle => cuMemExportToShareableHandle,
            MemPoolCreate => cuMemPoolCreate,
            MemPoolDestroy => cuMemPoolDestroy,
            MemPoolTrimTo => cuMemPoolTrimTo,
            CtxCreateV2 => cuCtxCreate_v2,
            CtxCreateV3 => cuCtxCreate_v3,
            CtxCreateV4 => cuCtxCreate_v4,
            CtxDestroyV2 => cuCtxDestroy_v2,
            DevicePrimaryCtxRetain => cuDevicePrimaryCtxRetain,
            DevicePrimaryCtxRelease => cuDevicePrimaryCtxRelease,
            DevicePrimaryCtxReleaseV2 => cuDevicePrimaryCtxRelease_v2,
            DevicePrimaryCtxReset => cuDevicePrimaryCtxReset,
            DevicePrimaryCtxResetV2 => cuDevicePrimaryCtxReset_v2,
            CtxSetLimit => cuCtxSetLimit,
            MemGetInfo => cuMemGetInfo,
            MemGetInfoV2 => cuMemGetInfo_v2,
            DeviceTotalMem => cuDeviceTotalMem,
            DeviceTotalMemV2 => cuDeviceTotalMem_v2,
            LaunchKernel => cuLaunchKernel,
            LaunchKernelPtsz => cuLaunchKernel_ptsz,
            LaunchKernelEx => cuLaunchKernelEx,
            LaunchKernelExPtsz => cuLaunchKernelEx_ptsz,
            LaunchCooperativeKernel => cuLaunchCooperativeKernel,
            LaunchCooperativeKernelPtsz => cuLaunchCooperativeKernel_ptsz,
            GraphLaunch => cuGraphLaunch,
            GraphLaunchPtsz => cuGraphLaunch_ptsz,
            NvmlMemoryInfo => nvmlDeviceGetMemoryInfo,
            NvmlMemoryInfoV2 => nvmlDeviceGetMemoryInfo_v2,
        }
    };
}
pub(crate) use with_hooks;

macro_rules! hooks {
    ($($variant:ident => $symbol:ident,)*) => {
        /// One intercepted entry point: one ABI version of one driver or NVML
        /// function, with its own wrapper and its own cached real pointer.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Hook {
            $(
                #[doc = concat!("`", stringify!($symbol), "`.")]
                $variant,
            )*
        }

        impl Hook {
            /// Every hook, in declaration order (`ALL[h as usize] == h`).
            pub const ALL: &'static [Hook] = &[$(Hook::$variant,)*];

            /// The exported symbol name of this entry point.
            pub const fn symbol(self) -> &'static str {
                match self {
                    $(Hook::$variant => stringify!($symbol),)*
                }
            }

            /// The exported symbol name, NUL-terminated (for `dlsym`).
            pub const fn symbol_nul(self) -> &'static str {
                match self {
                    $(Hook::$variant => concat!(stringify!($symbol), "\0"),)*
                }
            }

            /// The hook exported under exactly `name`, if any.
            pub fn by_symbol(name: &[u8]) -> Option<Hook> {
                // Nearly every `dlsym` in every process of the container
                // passes through here: reject foreign names on their first
                // two bytes before comparing whole names.
                match name {
                    [b'c', b'u', ..] | [b'n', b'v', ..] => {}
                    _ => return None,
                }
                match std::str::from_utf8(name).ok()? {
                    $(stringify!($symbol) => Some(Hook::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

with_hooks!(hooks);

/// Number of hooks.
pub const HOOK_COUNT: usize = Hook::ALL.len();

/// Base names whose ABI changed in CUDA 3.2 (`_v2`, 64-bit sizes and device
/// pointers); callers built for 3020 or later get the `_v2` entry point.
const V2_AT_3020: &[(&[u8], Hook, Hook)] = &[
    (b"cuMemAlloc", Hook::MemAlloc, Hook::MemAllocV2),
    (
        b"cuMemAllocPitch",
        Hook::MemAllocPitch,
        Hook::MemAllocPitchV2,
    ),
    (b"cuMemFree", Hook::MemFree, Hook::MemFreeV2),
    (b"cuMemGetInfo", Hook::MemGetInfo, Hook::MemGetInfoV2),
    (
        b"cuDeviceTotalMem",
        Hook::DeviceTotalMem,
        Hook::DeviceTotalMemV2,
    ),
    (b"cuArrayCreate", Hook::ArrayCreate, Hook::ArrayCreateV2),
    (
        b"cuArray3DCreate",
        Hook::Array3DCreate,
        Hook::Array3DCreateV2,
    ),
];

/// ABI versions of one base name: `(first CUDA version, hook)`, oldest first.
type Versions = &'static [(i32, Hook)];

/// Base names with several ABI versions: `(first CUDA version, hook)`,
/// oldest first; a caller gets the newest at or below its version, and
/// nothing (the driver's own answer) below the first.
const VERSIONED: &[(&[u8], Versions)] = &[
    (
        b"cuCtxCreate",
        &[
            (3020, Hook::CtxCreateV2),
            (11040, Hook::CtxCreateV3),
            (12050, Hook::CtxCreateV4),
        ],
    ),
    (b"cuCtxDestroy", &[(4000, Hook::CtxDestroyV2)]),
    (
        b"cuDevicePrimaryCtxRelease",
        &[
            (7000, Hook::DevicePrimaryCtxRelease),
            (11000, Hook::DevicePrimaryCtxReleaseV2),
        ],
    ),
    (
        b"cuDevicePrimaryCtxReset",
        &[
            (7000, Hook::DevicePrimaryCtxReset),
            (11000, Hook::DevicePrimaryCtxResetV2),
        ],
    ),
];

/// Stream-ordered base names with a per-thread-default-stream (`_ptsz`) variant.
const PER_THREAD_STREAM: &[(&[u8], Hook, Hook)] = &[
    (
        b"cuMemAllocAsync",
        Hook::MemAllocAsync,
        Hook::MemAllocAsyncPtsz,
    ),
    (
        b"cuMemAllocFromPoolAsync",
        Hook::MemAllocFromPoolAsync,
        Hook::MemAllocFromPoolAsyncPtsz,
    ),
    (
        b"cuMemFreeAsync",
        Hook::MemFreeAsync,
        Hook::MemFreeAsyncPtsz,
    ),
    (
        b"cuLaunchKernel",
        Hook::LaunchKernel,
        Hook::LaunchKernelPtsz,
    ),
    (
        b"cuLaunchKernelEx",
        Hook::LaunchKernelEx,
        Hook::LaunchKernelExPtsz,
    ),
    (
        b"cuLaunchCooperativeKernel",
        Hook::LaunchCooperativeKernel,
        Hook::LaunchCooperativeKernelPtsz,
    ),
    (b"cuGraphLaunch", Hook::GraphLaunch, Hook::GraphLaunchPtsz),
];

impl Hook {
    /// The hook for a `cuGetProcAddress(symbol, version, flags)` request:
    /// a base name resolved by version and default-stream flag, or an exact
    /// versioned name (`cuMemAlloc_v2`, `cuLaunchKernel_ptsz`) as the driver
    /// may also answer those. NVML names are never resolved this way.
    pub fn by_proc(symbol: &[u8], cuda_version: i32, flags: u64) -> Option<Hook> {
        if !symbol.starts_with(b"cu") {
            return None;
        }
        if symbol == b"cuGetProcAddress" {
            return Some(if cuda_version >= 12000 {
                Hook::GetProcAddressV2
            } else {
                Hook::GetProcAddress
            });
        }
        if let Some(&(_, v1, v2)) = V2_AT_3020.iter().find(|(base, ..)| *base == symbol) {
            return Some(if cuda_version >= 3020 { v2 } else { v1 });
        }
        if let Some((_, versions)) = VERSIONED.iter().find(|(base, _)| *base == symbol) {
            return versions
                .iter()
                .rev()
                .find(|(first, _)| cuda_version >= *first)
                .map(|&(_, hook)| hook);
        }
        if let Some(&(_, legacy, ptsz)) =
            PER_THREAD_STREAM.iter().find(|(base, ..)| *base == symbol)
        {
            return Some(if flags & PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
                ptsz
            } else {
                legacy
            });
        }
        Hook::by_symbol(symbol).filter(|h| !h.is_nvml())
    }

    /// The other default-stream variant of a stream-ordered entry point
    /// (`cuLaunchKernel` ↔ `cuLaunchKernel_ptsz`), if it has one.
    pub fn stream_sibling(self) -> Option<Hook> {
        PER_THREAD_STREAM.iter().find_map(|&(_, legacy, ptsz)| {
            if self == legacy {
                Some(ptsz)
            } else if self == ptsz {
                Some(legacy)
            } else {
                None
            }
        })
    }

    /// Whether this is an NVML entry point (found in `libnvidia-ml.so.1`).
    pub const fn is_nvml(self) -> bool {
        matches!(self, Hook::NvmlMemoryInfo | Hook::NvmlMemoryInfoV2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_is_found_by_its_own_symbol() {
        for (i, &hook) in Hook::ALL.iter().enumerate() {
            assert_eq!(hook as usize, i);
            assert_eq!(Hook::by_symbol(hook.symbol().as_bytes()), Some(hook));
            assert_eq!(hook.symbol_nul().strip_suffix('\0'), Some(hook.symbol()));
        }
    }

    #[test]
    fn foreign_names_are_not_hooks() {
        for name in [
            "",
            "c",
            "cu",
            "malloc",
            "cuInit",
            "cuMemAlloc_v3",
            "nvmlInit_v2",
        ] {
            assert_eq!(Hook::by_symbol(name.as_bytes()), None, "{name}");
        }
    }

    /// Asserts that `cuGetProcAddress` with `flags` answers each `(symbol,
    /// CUDA version)` with its hook.
    fn assert_by_proc(flags: u64, cases: &[(&str, i32, Hook)]) {
        for &(symbol, version, hook) in cases {
            assert_eq!(
                Hook::by_proc(symbol.as_bytes(), version, flags),
                Some(hook),
                "{symbol} at {version}, flags {flags:#x}"
            );
        }
    }

    #[test]
    fn proc_address_picks_the_abi_version_by_cuda_version() {
        use Hook::*;
        assert_eq!(Hook::by_proc(b"cuCtxCreate", 3010, 0), None);
        assert_by_proc(
            0,
            &[
                ("cuMemAlloc", 12080, MemAllocV2),
                ("cuMemAlloc", 3020, MemAllocV2),
                ("cuMemAlloc", 2000, MemAlloc),
                ("cuMemGetInfo", 11000, MemGetInfoV2),
                ("cuArray3DCreate", 12000, Array3DCreateV2),
                ("cuGetProcAddress", 12000, GetProcAddressV2),
                ("cuGetProcAddress", 11030, GetProcAddress),
                ("cuMemCreate", 12000, MemCreate),
                // Contexts.
                ("cuCtxCreate", 11030, CtxCreateV2),
                ("cuCtxCreate", 12040, CtxCreateV3),
                ("cuCtxCreate", 12080, CtxCreateV4),
                ("cuDevicePrimaryCtxRelease", 10020, DevicePrimaryCtxRelease),
                ("cuDevicePrimaryCtxReset", 12000, DevicePrimaryCtxResetV2),
                ("cuCtxDestroy", 12000, CtxDestroyV2),
                (
                    "cuMemRetainAllocationHandle",
                    12000,
                    MemRetainAllocationHandle,
                ),
            ],
        );
    }

    #[test]
    fn proc_address_picks_the_default_stream_variant_by_flag() {
        use Hook::*;
        assert_by_proc(0, &[("cuLaunchKernel", 12000, LaunchKernel)]);
        assert_by_proc(1, &[("cuLaunchKernel", 12000, LaunchKernel)]);
        assert_by_proc(
            PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
            &[
                ("cuLaunchKernel", 12000, LaunchKernelPtsz),
                ("cuGraphLaunch", 12000, GraphLaunchPtsz),
                ("cuMemFreeAsync", 12000, MemFreeAsyncPtsz),
            ],
        );
        assert_eq!(LaunchKernel.stream_sibling(), Some(LaunchKernelPtsz));
        assert_eq!(LaunchKernelPtsz.stream_sibling(), Some(LaunchKernel));
        assert_eq!(MemAllocV2.stream_sibling(), None);
    }

    #[test]
    fn proc_address_answers_versioned_names_exactly_and_never_nvml() {
        assert_by_proc(
            0,
            &[
                ("cuMemAlloc_v2", 12000, Hook::MemAllocV2),
                ("cuLaunchKernel_ptsz", 12000, Hook::LaunchKernelPtsz),
            ],
        );
        assert_eq!(Hook::by_proc(b"nvmlDeviceGetMemoryInfo", 12000, 0), None);
        assert_eq!(Hook::by_proc(b"cuInit", 12000, 0), None);
    }
}
