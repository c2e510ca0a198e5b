//! Property tests: the vGPU limits parsers never panic on arbitrary input,
//! errors stay one line, and a valid limits file re-serializes and re-parses
//! to the same value.

use std::path::PathBuf;

use proptest::prelude::*;
use tessera_model::contract::vgpu::MAX_DEVICES;
use tessera_model::vgpu::{
    CONFIG_VERSION, DeviceConfig, EnvLimits, LogLevel, VgpuConfig, parse_memory_size, parse_percent,
};

/// Text that is sometimes close to a limits file.
fn jsonish() -> impl Strategy<Value = String> {
    let fragments = prop_oneof![
        Just("{".to_string()),
        Just("}".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just(",".to_string()),
        Just(":".to_string()),
        Just("\"version\"".to_string()),
        Just("\"devices\"".to_string()),
        Just("\"uuid\"".to_string()),
        Just("\"memoryLimitMiB\"".to_string()),
        Just("\"smLimitPercent\"".to_string()),
        Just("\"memoryScaling\"".to_string()),
        Just("\"logLevel\"".to_string()),
        Just("\"GPU-1234\"".to_string()),
        Just("1".to_string()),
        Just("140".to_string()),
        Just("-1".to_string()),
        Just("1.5".to_string()),
        Just("true".to_string()),
        Just("null".to_string()),
        "[ -~]{0,6}",
    ];
    prop_oneof![
        3 => prop::collection::vec(fragments, 0..24).prop_map(|parts| parts.concat()),
        1 => any::<String>(),
    ]
}

/// Environment names the parser reads, plus noise.
fn env_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("CUDA_DEVICE_MEMORY_LIMIT".to_string()),
        (0usize..20).prop_map(|i| format!("CUDA_DEVICE_MEMORY_LIMIT_{i}")),
        Just("CUDA_DEVICE_SM_LIMIT".to_string()),
        (0usize..20).prop_map(|i| format!("CUDA_DEVICE_SM_LIMIT_{i}")),
        "CUDA_DEVICE_(MEMORY|SM)_LIMIT_[ -~]{0,4}",
        Just("CUDA_DEVICE_MEMORY_SHARED_CACHE".to_string()),
        Just("CUDA_OVERSUBSCRIBE".to_string()),
        Just("LIBCUDA_LOG_LEVEL".to_string()),
        any::<String>(),
    ]
}

fn env_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,22}[kKmMgG]?",
        "[ 0-9a-zA-Z/._-]{0,12}",
        any::<String>(),
    ]
}

fn valid_config() -> impl Strategy<Value = VgpuConfig> {
    let device = ("[0-9a-f]{8}", 0u64..=(1 << 24), 0u32..=100, any::<bool>()).prop_map(
        |(body, memory_limit_mib, sm_limit_percent, mig)| DeviceConfig {
            uuid: format!("{}-{body}", if mig { "MIG" } else { "GPU" }),
            memory_limit_mib,
            sm_limit_percent,
        },
    );
    (
        prop::collection::vec(device, 0..=MAX_DEVICES),
        "(/[a-z]{1,6}){1,3}",
        any::<bool>(),
        1u32..=640,
        prop_oneof![
            Just(LogLevel::Error),
            Just(LogLevel::Warn),
            Just(LogLevel::Info),
            Just(LogLevel::Debug),
        ],
    )
        .prop_map(|(mut devices, dir, oversubscribe, tenths, log_level)| {
            // UUIDs must be unique.
            let mut seen = std::collections::HashSet::new();
            devices.retain(|d| seen.insert(d.uuid[4..].to_string()));
            VgpuConfig {
                version: CONFIG_VERSION,
                devices,
                accounting_dir: PathBuf::from(dir),
                oversubscribe,
                memory_scaling: f64::from(tenths) / 10.0,
                log_level,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn limits_file_parser_never_panics(text in jsonish()) {
        if let Err(e) = VgpuConfig::parse(&text) {
            let line = e.to_string();
            prop_assert!(!line.contains('\n'), "error is one line: {line:?}");
        }
    }

    #[test]
    fn env_parser_never_panics(vars in prop::collection::vec((env_name(), env_value()), 0..8)) {
        match EnvLimits::from_vars(vars) {
            Ok(limits) => {
                let resolved = limits.resolve();
                for ordinal in 0..MAX_DEVICES + 2 {
                    let limit = resolved.limit_for(ordinal, "GPU-1234");
                    if let Some(p) = limit.sm_limit_percent {
                        prop_assert!((1..100).contains(&p), "SM share {p} out of 1..100");
                    }
                }
            }
            Err(e) => prop_assert!(!e.to_string().contains('\n'), "error is one line: {e}"),
        }
    }

    #[test]
    fn value_parsers_never_panic(value in env_value()) {
        let _ = parse_memory_size(&value);
        if let Ok(p) = parse_percent(&value) {
            prop_assert!(p <= 100);
        }
    }

    #[test]
    fn valid_files_round_trip(config in valid_config()) {
        let text = serde_json::to_string_pretty(&config).expect("serializes");
        let parsed = VgpuConfig::parse(&text);
        prop_assert_eq!(parsed.as_ref(), Ok(&config), "{}", text);
        let resolved = config.resolve();
        for (i, device) in config.devices.iter().enumerate() {
            // Any ordinal: the UUID decides.
            let limit = resolved.limit_for(MAX_DEVICES - i, &device.uuid);
            let expected = (device.memory_limit_mib > 0).then_some(device.memory_limit_mib << 20);
            prop_assert_eq!(limit.memory_limit_bytes, expected);
        }
    }
}
