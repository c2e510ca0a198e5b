//! Every other NVML entry point: exported so that no client ever misses a
//! symbol, answering `NVML_ERROR_NOT_SUPPORTED` (`UNINITIALIZED` before
//! `nvmlInit*`).
//!
//! Clients bind NVML symbols lazily: go-nvml (NVIDIA's device plugin, GPU
//! feature discovery, container toolkit, DCGM exporter) resolves each
//! function at its first call, and a function the library lacks is then a
//! crash ("symbol lookup error"), not an error code; `nvml-wrapper` returns
//! `FailedToLoadSymbol`. Real NVML answers `NOT_SUPPORTED` for what a board
//! or driver lacks, and clients handle that, so that is what the simulated
//! node answers for everything it does not model.
//!
//! The list is the `nvml.h` of NVML 13 (as go-nvml ships it) together with
//! the declarations of the `nvml-wrapper-sys` 0.10 bindings, less the
//! functions the other modules implement; `tests/nvml_wrapper.rs` checks that
//! every function the bindings declare resolves.
//!
//! Each stub is declared without parameters: on the platforms this builds
//! for (x86-64 SysV, AArch64 AAPCS64) arguments travel in registers or in
//! the caller's stack frame, which the caller also releases, so a function
//! that ignores its arguments may be called with any of them. Every NVML
//! function returns `nvmlReturn_t`, an `unsigned int`, as these do.

use crate::ffi::{ERROR_NOT_SUPPORTED, NvmlReturn};
use crate::node;

use super::entry;

/// `NOT_SUPPORTED` once the library is initialised, else `UNINITIALIZED`.
fn not_supported() -> NvmlReturn {
    entry(|| {
        node::read(|_| Ok(()))?;
        Err(ERROR_NOT_SUPPORTED)
    })
}

/// Declares each named function as an export that answers [`not_supported`].
macro_rules! not_supported {
    ($($name:ident,)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: not simulated; `NOT_SUPPORTED`.")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> NvmlReturn {
                not_supported()
            }
        )*
        /// The names of every function this module exports.
        #[cfg(test)]
        pub const NAMES: &[&str] = &[$(stringify!($name),)*];
    };
}

not_supported! {
    // nvmlDevice…
    nvmlDeviceClearAccountingPids,
    nvmlDeviceClearCpuAffinity,
    nvmlDeviceClearEccErrorCounts,
    nvmlDeviceClearFieldValues,
    nvmlDeviceDiscoverGpus,
    nvmlDeviceFreezeNvLinkUtilizationCounter,
    nvmlDeviceGetAPIRestriction,
    nvmlDeviceGetAccountingBufferSize,
    nvmlDeviceGetAccountingMode,
    nvmlDeviceGetAccountingPids,
    nvmlDeviceGetAccountingStats,
    nvmlDeviceGetAccountingStats_v2,
    nvmlDeviceGetActiveVgpus,
    nvmlDeviceGetAdaptiveClockInfoStatus,
    nvmlDeviceGetAddressingMode,
    nvmlDeviceGetApplicationsClock,
    nvmlDeviceGetAutoBoostedClocksEnabled,
    nvmlDeviceGetBBXTimeData_v1,
    nvmlDeviceGetBridgeChipInfo,
    nvmlDeviceGetBusType,
    nvmlDeviceGetC2cModeInfoV,
    nvmlDeviceGetCapabilities,
    nvmlDeviceGetClkMonStatus,
    nvmlDeviceGetClockOffsets,
    nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetConfComputeGpuAttestationReport,
    nvmlDeviceGetConfComputeGpuCertificate,
    nvmlDeviceGetConfComputeMemSizeInfo,
    nvmlDeviceGetConfComputeProtectedMemoryUsage,
    nvmlDeviceGetCoolerInfo,
    nvmlDeviceGetCreatableVgpus,
    nvmlDeviceGetCurrentClockFreqs,
    nvmlDeviceGetDefaultApplicationsClock,
    nvmlDeviceGetDefaultEccMode,
    nvmlDeviceGetDetailedEccErrors,
    nvmlDeviceGetDramEncryptionMode,
    nvmlDeviceGetDriverModel,
    nvmlDeviceGetDriverModel_v2,
    nvmlDeviceGetDynamicPstatesInfo,
    nvmlDeviceGetEncoderCapacity,
    nvmlDeviceGetFBCSessions,
    nvmlDeviceGetFBCStats,
    nvmlDeviceGetFanControlPolicy_v2,
    nvmlDeviceGetFanSpeed,
    nvmlDeviceGetFanSpeedRPM,
    nvmlDeviceGetFanSpeed_v2,
    nvmlDeviceGetGpcClkMinMaxVfOffset,
    nvmlDeviceGetGpcClkVfOffset,
    nvmlDeviceGetGpuFabricInfo,
    nvmlDeviceGetGpuFabricInfoV,
    nvmlDeviceGetGpuInstancePossiblePlacements,
    nvmlDeviceGetGpuInstanceProfileInfoByIdV,
    nvmlDeviceGetGpuOperationMode,
    nvmlDeviceGetGridLicensableFeatures,
    nvmlDeviceGetGridLicensableFeatures_v2,
    nvmlDeviceGetGridLicensableFeatures_v3,
    nvmlDeviceGetGridLicensableFeatures_v4,
    nvmlDeviceGetGspFirmwareMode,
    nvmlDeviceGetGspFirmwareVersion,
    nvmlDeviceGetHandleByUUIDV,
    nvmlDeviceGetHostVgpuMode,
    nvmlDeviceGetHostname_v1,
    nvmlDeviceGetInforomConfigurationChecksum,
    nvmlDeviceGetIrqNum,
    nvmlDeviceGetJpgUtilization,
    nvmlDeviceGetLastBBXFlushTime,
    nvmlDeviceGetMarginTemperature,
    nvmlDeviceGetMaxCustomerBoostClock,
    nvmlDeviceGetMemClkMinMaxVfOffset,
    nvmlDeviceGetMemClkVfOffset,
    nvmlDeviceGetMemoryBusWidth,
    nvmlDeviceGetMinMaxClockOfPState,
    nvmlDeviceGetMinMaxFanSpeed,
    nvmlDeviceGetModuleId,
    nvmlDeviceGetNumFans,
    nvmlDeviceGetNumGpuCores,
    nvmlDeviceGetNumaNodeId,
    nvmlDeviceGetNvLinkCapability,
    nvmlDeviceGetNvLinkErrorCounter,
    nvmlDeviceGetNvLinkInfo,
    nvmlDeviceGetNvLinkRemoteDeviceType,
    nvmlDeviceGetNvLinkRemotePciInfo,
    nvmlDeviceGetNvLinkRemotePciInfo_v2,
    nvmlDeviceGetNvLinkState,
    nvmlDeviceGetNvLinkUtilizationControl,
    nvmlDeviceGetNvLinkUtilizationCounter,
    nvmlDeviceGetNvLinkVersion,
    nvmlDeviceGetNvlinkBwMode,
    nvmlDeviceGetNvlinkSupportedBwModes,
    nvmlDeviceGetOfaUtilization,
    nvmlDeviceGetPcieLinkMaxSpeed,
    nvmlDeviceGetPcieSpeed,
    nvmlDeviceGetPdi,
    nvmlDeviceGetPerformanceModes,
    nvmlDeviceGetPgpuMetadataString,
    nvmlDeviceGetPlatformInfo,
    nvmlDeviceGetPowerMizerMode_v1,
    nvmlDeviceGetPowerSource,
    nvmlDeviceGetProcessesUtilizationInfo,
    nvmlDeviceGetRemappedRows_v2,
    nvmlDeviceGetRepairStatus,
    nvmlDeviceGetRetiredPages,
    nvmlDeviceGetRetiredPagesPendingStatus,
    nvmlDeviceGetRetiredPages_v2,
    nvmlDeviceGetRowRemapperHistogram,
    nvmlDeviceGetRunningProcessDetailList,
    nvmlDeviceGetSamples,
    nvmlDeviceGetSramEccErrorStatus,
    nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts,
    nvmlDeviceGetSupportedGraphicsClocks,
    nvmlDeviceGetSupportedMemoryClocks,
    nvmlDeviceGetSupportedPerformanceStates,
    nvmlDeviceGetSupportedVgpus,
    nvmlDeviceGetTargetFanSpeed,
    nvmlDeviceGetTemperatureV,
    nvmlDeviceGetThermalSettings,
    nvmlDeviceGetTopologyNearestGpus,
    nvmlDeviceGetUnrepairableMemoryFlag_v1,
    nvmlDeviceGetVgpuCapabilities,
    nvmlDeviceGetVgpuHeterogeneousMode,
    nvmlDeviceGetVgpuInstancesUtilizationInfo,
    nvmlDeviceGetVgpuMetadata,
    nvmlDeviceGetVgpuProcessUtilization,
    nvmlDeviceGetVgpuProcessesUtilizationInfo,
    nvmlDeviceGetVgpuSchedulerCapabilities,
    nvmlDeviceGetVgpuSchedulerLog,
    nvmlDeviceGetVgpuSchedulerLog_v2,
    nvmlDeviceGetVgpuSchedulerState,
    nvmlDeviceGetVgpuSchedulerState_v2,
    nvmlDeviceGetVgpuTypeCreatablePlacements,
    nvmlDeviceGetVgpuTypeSupportedPlacements,
    nvmlDeviceGetVgpuUtilization,
    nvmlDeviceModifyDrainState,
    nvmlDevicePowerSmoothingActivatePresetProfile,
    nvmlDevicePowerSmoothingSetState,
    nvmlDevicePowerSmoothingUpdatePresetProfileParam,
    nvmlDeviceQueryDrainState,
    nvmlDeviceReadPRMCounters_v1,
    nvmlDeviceReadWritePRM_v1,
    nvmlDeviceRemoveGpu,
    nvmlDeviceRemoveGpu_v2,
    nvmlDeviceResetApplicationsClocks,
    nvmlDeviceResetGpuLockedClocks,
    nvmlDeviceResetMemoryLockedClocks,
    nvmlDeviceResetNvLinkErrorCounters,
    nvmlDeviceResetNvLinkUtilizationCounter,
    nvmlDeviceSetAPIRestriction,
    nvmlDeviceSetAccountingMode,
    nvmlDeviceSetApplicationsClocks,
    nvmlDeviceSetAutoBoostedClocksEnabled,
    nvmlDeviceSetClockOffsets,
    nvmlDeviceSetComputeMode,
    nvmlDeviceSetConfComputeUnprotectedMemSize,
    nvmlDeviceSetCpuAffinity,
    nvmlDeviceSetDefaultAutoBoostedClocksEnabled,
    nvmlDeviceSetDefaultFanSpeed_v2,
    nvmlDeviceSetDramEncryptionMode,
    nvmlDeviceSetDriverModel,
    nvmlDeviceSetEccMode,
    nvmlDeviceSetFanControlPolicy,
    nvmlDeviceSetFanSpeed_v2,
    nvmlDeviceSetGpcClkVfOffset,
    nvmlDeviceSetGpuLockedClocks,
    nvmlDeviceSetGpuOperationMode,
    nvmlDeviceSetHostname_v1,
    nvmlDeviceSetMemClkVfOffset,
    nvmlDeviceSetMemoryLockedClocks,
    nvmlDeviceSetNvLinkDeviceLowPowerThreshold,
    nvmlDeviceSetNvLinkUtilizationControl,
    nvmlDeviceSetNvlinkBwMode,
    nvmlDeviceSetPersistenceMode,
    nvmlDeviceSetPowerManagementLimit,
    nvmlDeviceSetPowerManagementLimit_v2,
    nvmlDeviceSetPowerMizerMode_v1,
    nvmlDeviceSetRusdSettings_v1,
    nvmlDeviceSetTemperatureThreshold,
    nvmlDeviceSetVgpuCapabilities,
    nvmlDeviceSetVgpuHeterogeneousMode,
    nvmlDeviceSetVgpuSchedulerState,
    nvmlDeviceSetVgpuSchedulerState_v2,
    nvmlDeviceSetVirtualizationMode,
    nvmlDeviceValidateInforom,
    nvmlDeviceVgpuForceGspUnload,
    nvmlDeviceWorkloadPowerProfileClearRequestedProfiles,
    nvmlDeviceWorkloadPowerProfileGetCurrentProfiles,
    nvmlDeviceWorkloadPowerProfileGetProfilesInfo,
    nvmlDeviceWorkloadPowerProfileSetRequestedProfiles,
    nvmlDeviceWorkloadPowerProfileUpdateProfiles_v1,
    // nvmlGpuInstance…
    nvmlGpuInstanceGetActiveVgpus,
    nvmlGpuInstanceGetCreatableVgpus,
    nvmlGpuInstanceGetVgpuHeterogeneousMode,
    nvmlGpuInstanceGetVgpuSchedulerLog,
    nvmlGpuInstanceGetVgpuSchedulerLog_v2,
    nvmlGpuInstanceGetVgpuSchedulerState,
    nvmlGpuInstanceGetVgpuSchedulerState_v2,
    nvmlGpuInstanceGetVgpuTypeCreatablePlacements,
    nvmlGpuInstanceSetVgpuHeterogeneousMode,
    nvmlGpuInstanceSetVgpuSchedulerState,
    nvmlGpuInstanceSetVgpuSchedulerState_v2,
    // nvmlVgpu…
    nvmlVgpuInstanceClearAccountingPids,
    nvmlVgpuInstanceGetAccountingMode,
    nvmlVgpuInstanceGetAccountingPids,
    nvmlVgpuInstanceGetAccountingStats,
    nvmlVgpuInstanceGetEccMode,
    nvmlVgpuInstanceGetEncoderCapacity,
    nvmlVgpuInstanceGetEncoderSessions,
    nvmlVgpuInstanceGetEncoderStats,
    nvmlVgpuInstanceGetFBCSessions,
    nvmlVgpuInstanceGetFBCStats,
    nvmlVgpuInstanceGetFbUsage,
    nvmlVgpuInstanceGetFrameRateLimit,
    nvmlVgpuInstanceGetGpuInstanceId,
    nvmlVgpuInstanceGetGpuPciId,
    nvmlVgpuInstanceGetLicenseInfo,
    nvmlVgpuInstanceGetLicenseInfo_v2,
    nvmlVgpuInstanceGetLicenseStatus,
    nvmlVgpuInstanceGetMdevUUID,
    nvmlVgpuInstanceGetMetadata,
    nvmlVgpuInstanceGetPlacementId,
    nvmlVgpuInstanceGetRuntimeStateSize,
    nvmlVgpuInstanceGetType,
    nvmlVgpuInstanceGetUUID,
    nvmlVgpuInstanceGetVmDriverVersion,
    nvmlVgpuInstanceGetVmID,
    nvmlVgpuInstanceSetEncoderCapacity,
    nvmlVgpuTypeGetBAR1Info,
    nvmlVgpuTypeGetCapabilities,
    nvmlVgpuTypeGetClass,
    nvmlVgpuTypeGetDeviceID,
    nvmlVgpuTypeGetFbReservation,
    nvmlVgpuTypeGetFrameRateLimit,
    nvmlVgpuTypeGetFramebufferSize,
    nvmlVgpuTypeGetGpuInstanceProfileId,
    nvmlVgpuTypeGetGspHeapSize,
    nvmlVgpuTypeGetLicense,
    nvmlVgpuTypeGetMaxInstances,
    nvmlVgpuTypeGetMaxInstancesPerGpuInstance,
    nvmlVgpuTypeGetMaxInstancesPerVm,
    nvmlVgpuTypeGetName,
    nvmlVgpuTypeGetNumDisplayHeads,
    nvmlVgpuTypeGetResolution,
    // nvmlGpm…
    nvmlGpmMetricsGet,
    nvmlGpmMigSampleGet,
    nvmlGpmQueryDeviceSupport,
    nvmlGpmQueryIfStreamingEnabled,
    nvmlGpmSampleAlloc,
    nvmlGpmSampleFree,
    nvmlGpmSampleGet,
    nvmlGpmSetStreamingEnabled,
    // nvmlSystem…
    nvmlSystemEventSetCreate,
    nvmlSystemEventSetFree,
    nvmlSystemEventSetWait,
    nvmlSystemGetCPER_v1,
    nvmlSystemGetConfComputeCapabilities,
    nvmlSystemGetConfComputeGpusReadyState,
    nvmlSystemGetConfComputeKeyRotationThresholdInfo,
    nvmlSystemGetConfComputeSettings,
    nvmlSystemGetConfComputeState,
    nvmlSystemGetDriverBranch,
    nvmlSystemGetHicVersion,
    nvmlSystemGetNvlinkBwMode,
    nvmlSystemGetTopologyGpuSet,
    nvmlSystemRegisterEvents,
    nvmlSystemSetConfComputeGpusReadyState,
    nvmlSystemSetConfComputeKeyRotationThresholdInfo,
    nvmlSystemSetNvlinkBwMode,
    // nvmlUnit…
    nvmlUnitGetDevices,
    nvmlUnitGetFanSpeedInfo,
    nvmlUnitGetHandleByIndex,
    nvmlUnitGetLedState,
    nvmlUnitGetPsuInfo,
    nvmlUnitGetTemperature,
    nvmlUnitGetUnitInfo,
    nvmlUnitSetLedState,
    // nvml (other)…
    nvmlGetExcludedDeviceCount,
    nvmlGetExcludedDeviceInfoByIndex,
    nvmlGetVgpuCompatibility,
    nvmlGetVgpuDriverCapabilities,
    nvmlGetVgpuVersion,
    nvmlSetVgpuVersion,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_names_each_function_once() {
        let mut names = super::NAMES.to_vec();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len());
        assert!(names.iter().all(|n| n.starts_with("nvml")));
    }
}
