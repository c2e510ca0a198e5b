//! TEMPORARY: the agreed API of `config`, `accounting` and `alloc_table`,
//! stubbed until their real modules land. Replaced by `pub mod` lines.
#![allow(dead_code, missing_docs)]

pub mod config {
    use std::path::PathBuf;

    #[derive(Debug, Clone, Default)]
    pub struct DeviceLimit {
        pub uuid: Option<String>,
        pub memory_limit_bytes: Option<u64>,
        pub sm_limit_percent: Option<u32>,
    }

    #[derive(Debug, Clone, Default)]
    pub struct ResolvedLimits {
        pub devices: Vec<DeviceLimit>,
        pub accounting_path: Option<PathBuf>,
        pub oversubscribe: bool,
        pub memory_scaling: f64,
        pub log_level: u8,
    }

    impl ResolvedLimits {
        pub fn limit_for(&self, ordinal: usize, uuid: Option<&str>) -> DeviceLimit {
            if let Some(u) = uuid
                && let Some(d) = self.devices.iter().find(|d| d.uuid.as_deref() == Some(u))
            {
                return d.clone();
            }
            self.devices.get(ordinal).cloned().unwrap_or_default()
        }
    }

    #[derive(Debug)]
    pub enum ConfigError {
        Malformed(String),
        Io(String),
    }

    impl std::fmt::Display for ConfigError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }

    pub fn load() -> Result<ResolvedLimits, ConfigError> {
        Ok(ResolvedLimits::default())
    }
}

pub mod accounting {
    use std::path::Path;
    use std::sync::atomic::{AtomicU64, Ordering};

    pub struct SharedRegion {
        used: Vec<AtomicU64>,
    }

    impl SharedRegion {
        pub fn open(_path: &Path, device_count: usize) -> std::io::Result<SharedRegion> {
            Ok(SharedRegion {
                used: (0..device_count).map(|_| AtomicU64::new(0)).collect(),
            })
        }
        pub fn try_charge(&self, device: usize, bytes: u64, limit: u64) -> bool {
            self.used[device]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    u.checked_add(bytes).filter(|n| *n <= limit)
                })
                .is_ok()
        }
        pub fn uncharge(&self, device: usize, bytes: u64) {
            let _ = self.used[device].fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
        }
        pub fn used(&self, device: usize) -> u64 {
            self.used[device].load(Ordering::Acquire)
        }
        pub fn reclaim_dead(&self) -> u64 {
            0
        }
    }
}

pub mod alloc_table {
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        Device,
        Managed,
        Vmm,
        Async,
        Array,
        Mipmap,
        HostFallback,
    }

    #[derive(Debug, Clone, Copy)]
    pub struct Entry {
        pub device: usize,
        pub bytes: u64,
        pub kind: Kind,
    }

    static TABLE: Mutex<Option<HashMap<u64, Entry>>> = Mutex::new(None);

    pub fn insert(ptr: u64, device: usize, bytes: u64, kind: Kind) {
        if let Ok(mut t) = TABLE.lock() {
            t.get_or_insert_with(HashMap::new).insert(
                ptr,
                Entry {
                    device,
                    bytes,
                    kind,
                },
            );
        }
    }

    pub fn remove(ptr: u64) -> Option<Entry> {
        TABLE.lock().ok()?.as_mut()?.remove(&ptr)
    }
}
