//! The device list kubelet sees: every offered GPU's devices under one
//! resource (`nvidia.com/gpu`).
//!
//! - A **share** GPU (MIG off, or not MIG-capable) offers `split_count`
//!   replicas `<uuid>::<n>`; each is one vGPU slice.
//! - A **MIG** GPU offers one device per MIG capacity unit, `<uuid>::mig<n>`:
//!   as many as NVML says the GPU holds of its smallest allowed profile (7 on
//!   an A100). A pod asks for `nvidia.com/gpu: 1` whatever profile it gets,
//!   so a unit is an upper bound, and the extender does the real fit.
//!
//! GPUs named by `filterdevices`, and GPUs of the mode the node's
//! `operatingmode` excludes, offer nothing. Health is the GPU's, for every
//! device of it ([`crate::health`]). Everything here is pure except
//! [`discover`], which asks the driver.

use std::fmt;

use tessera_driver::{DriverError, GpuDriver};
use tessera_model::contract::kubelet;
use tessera_model::gpu::{GpuInfo, GpuInstanceProfileInfo};
use tessera_model::sched::config::OperatingMode;

use crate::api::deviceplugin::v1beta1 as dp;
use crate::config::DeviceSettings;
use crate::health::HealthMap;

/// Separates the GPU uuid from the rest of a device id.
pub const ID_SEPARATOR: &str = "::";
/// Prefix of a MIG capacity unit's number in a device id.
pub const MIG_UNIT_PREFIX: &str = "mig";

/// What one GPU offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// vGPU slices: this many replicas.
    Share {
        /// Replicas (`split_count`).
        replicas: u32,
    },
    /// MIG instances: this many capacity units.
    Mig {
        /// Most instances of the smallest allowed profile.
        units: u32,
        /// That profile's name (e.g. `1g.5gb`).
        unit_profile: String,
    },
}

/// One offered GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuOffer {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` uuid.
    pub uuid: String,
    /// Product name.
    pub model: String,
    /// What it offers.
    pub offer: Offer,
}

impl GpuOffer {
    /// The device ids of this GPU, in order.
    pub fn device_ids(&self) -> Vec<String> {
        match &self.offer {
            Offer::Share { replicas } => (0..*replicas)
                .map(|n| {
                    DeviceId::Replica {
                        uuid: self.uuid.clone(),
                        n,
                    }
                    .to_string()
                })
                .collect(),
            Offer::Mig { units, .. } => (0..*units)
                .map(|n| {
                    DeviceId::MigUnit {
                        uuid: self.uuid.clone(),
                        n,
                    }
                    .to_string()
                })
                .collect(),
        }
    }
}

/// A device id as kubelet knows it, parsed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceId {
    /// `<uuid>::<n>`: replica `n` of a share GPU.
    Replica {
        /// The GPU's uuid.
        uuid: String,
        /// Replica number.
        n: u32,
    },
    /// `<uuid>::mig<n>`: capacity unit `n` of a MIG GPU.
    MigUnit {
        /// The GPU's uuid.
        uuid: String,
        /// Unit number.
        n: u32,
    },
}

impl DeviceId {
    /// Parses `<uuid>::<n>` or `<uuid>::mig<n>`; `None` for anything else.
    pub fn parse(id: &str) -> Option<DeviceId> {
        let (uuid, rest) = id.rsplit_once(ID_SEPARATOR)?;
        if uuid.is_empty() || uuid.contains(ID_SEPARATOR) {
            return None;
        }
        let number = |s: &str| -> Option<u32> {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let uuid = uuid.to_owned();
        match rest.strip_prefix(MIG_UNIT_PREFIX) {
            Some(n) => Some(DeviceId::MigUnit {
                uuid,
                n: number(n)?,
            }),
            None => Some(DeviceId::Replica {
                uuid,
                n: number(rest)?,
            }),
        }
    }

    /// The GPU's uuid.
    pub fn uuid(&self) -> &str {
        match self {
            DeviceId::Replica { uuid, .. } | DeviceId::MigUnit { uuid, .. } => uuid,
        }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Replica { uuid, n } => write!(f, "{uuid}{ID_SEPARATOR}{n}"),
            DeviceId::MigUnit { uuid, n } => {
                write!(f, "{uuid}{ID_SEPARATOR}{MIG_UNIT_PREFIX}{n}")
            }
        }
    }
}

/// The smallest profile of `profiles` whose name `allowed` lists (fewest
/// compute slices, then least memory), or `None`.
pub fn smallest_allowed<'a>(
    profiles: &'a [GpuInstanceProfileInfo],
    allowed: &[String],
) -> Option<&'a GpuInstanceProfileInfo> {
    profiles
        .iter()
        .filter(|p| p.instance_count > 0 && allowed.iter().any(|a| a == &p.name))
        .min_by_key(|p| (p.slice_count, p.memory_mib, p.id))
}

/// What each GPU offers, from the GPUs and (for MIG GPUs) their profiles as
/// NVML reports them. `profiles(index)` is asked only for MIG-enabled GPUs
/// that are offered.
pub fn plan<E>(
    gpus: &[GpuInfo],
    settings: &DeviceSettings,
    mut profiles: impl FnMut(u32) -> Result<Vec<GpuInstanceProfileInfo>, E>,
) -> Result<Vec<GpuOffer>, E> {
    let mut offers = Vec::new();
    for gpu in gpus {
        if settings.filtered(gpu.index, &gpu.uuid) {
            tracing::info!(gpu = gpu.index, uuid = %gpu.uuid, "filtered out (filterdevices)");
            continue;
        }
        let mig = gpu.mig_enabled();
        match (settings.operating_mode, mig) {
            (Some(OperatingMode::Share), true) | (Some(OperatingMode::Mig), false) => {
                tracing::info!(
                    gpu = gpu.index,
                    uuid = %gpu.uuid,
                    mig,
                    "not offered: the node's operatingmode excludes it"
                );
                continue;
            }
            _ => {}
        }
        let offer = if mig {
            let allowed = settings.allowed_profiles(&gpu.name).unwrap_or_default();
            let infos = profiles(gpu.index)?;
            match smallest_allowed(&infos, allowed) {
                Some(p) => Offer::Mig {
                    units: p.instance_count,
                    unit_profile: p.name.clone(),
                },
                None => {
                    tracing::warn!(
                        gpu = gpu.index,
                        model = %gpu.name,
                        "MIG GPU without an allowed profile (migProfileAllowlist): not offered"
                    );
                    continue;
                }
            }
        } else {
            Offer::Share {
                replicas: settings.split_count,
            }
        };
        offers.push(GpuOffer {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            model: gpu.name.clone(),
            offer,
        });
    }
    Ok(offers)
}

/// [`plan`] with the GPUs and profiles asked of the driver.
pub fn discover(
    driver: &(dyn GpuDriver + Send + Sync),
    settings: &DeviceSettings,
) -> Result<Vec<GpuOffer>, DriverError> {
    let gpus = driver.gpus()?;
    plan(&gpus, settings, |index| driver.gpu_instance_profiles(index))
}

/// The ListAndWatch list: every device of every offer, with its GPU's
/// health (a GPU missing from `health` counts as healthy).
pub fn device_list(offers: &[GpuOffer], health: &HealthMap) -> Vec<dp::Device> {
    offers
        .iter()
        .flat_map(|offer| {
            let healthy = health.get(&offer.uuid).is_none_or(|h| h.healthy);
            let state = if healthy {
                kubelet::HEALTHY
            } else {
                kubelet::UNHEALTHY
            };
            offer.device_ids().into_iter().map(move |id| dp::Device {
                id,
                health: state.to_owned(),
                topology: None,
            })
        })
        .collect()
}

/// Devices per offer kind: `(share replicas, MIG units)`.
pub fn totals(offers: &[GpuOffer]) -> (u32, u32) {
    offers.iter().fold((0, 0), |(s, m), o| match &o.offer {
        Offer::Share { replicas } => (s + replicas, m),
        Offer::Mig { units, .. } => (s, m + units),
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tessera_model::sched::config::{FilterDevices, MigAllowlistEntry};

    use super::*;
    use crate::health::GpuHealth;

    fn share_gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            minor: index,
            uuid: format!("GPU-share-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81559,
            mig: None,
        }
    }

    fn a100(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            minor: index,
            uuid: format!("GPU-a100-{index}"),
            name: "NVIDIA A100-SXM4-40GB".into(),
            memory_mib: 40960,
            mig: Some(tessera_model::gpu::MigModeState {
                current: true,
                pending: true,
            }),
        }
    }

    fn a100_profiles() -> Vec<GpuInstanceProfileInfo> {
        let p = |id, name: &str, slices, mem, count| GpuInstanceProfileInfo {
            id,
            enum_index: id,
            name: name.into(),
            slice_count: slices,
            memory_mib: mem,
            multiprocessor_count: 14 * slices,
            instance_count: count,
        };
        vec![
            p(19, "1g.5gb", 1, 4864, 7),
            p(20, "1g.5gb+me", 1, 4864, 1),
            p(15, "1g.10gb", 1, 9856, 4),
            p(14, "2g.10gb", 2, 9856, 3),
            p(9, "3g.20gb", 3, 19968, 2),
            p(5, "4g.20gb", 4, 19968, 1),
            p(0, "7g.40gb", 7, 40192, 1),
        ]
    }

    fn plan_of(gpus: &[GpuInfo], settings: &DeviceSettings) -> Vec<GpuOffer> {
        plan::<Infallible>(gpus, settings, |_| Ok(a100_profiles())).expect("infallible")
    }

    #[test]
    fn share_gpus_offer_split_count_replicas() {
        let settings = DeviceSettings {
            split_count: 4,
            ..DeviceSettings::default()
        };
        let offers = plan_of(&[share_gpu(0), share_gpu(1)], &settings);
        let ids: Vec<String> = offers.iter().flat_map(GpuOffer::device_ids).collect();
        assert_eq!(ids.len(), 8, "{ids:?}");
        assert_eq!(ids[0], "GPU-share-0::0");
        assert_eq!(ids[7], "GPU-share-1::3");
        assert_eq!(totals(&offers), (8, 0));
    }

    #[test]
    fn an_a100_offers_seven_mig_units_by_default() {
        let offers = plan_of(&[a100(0)], &DeviceSettings::default());
        assert_eq!(
            offers[0].offer,
            Offer::Mig {
                units: 7,
                unit_profile: "1g.5gb".into()
            }
        );
        assert_eq!(offers[0].device_ids()[6], "GPU-a100-0::mig6");
    }

    #[test]
    fn mig_units_follow_the_smallest_allowed_profile() {
        let settings = DeviceSettings {
            mig_profile_allowlist: vec![MigAllowlistEntry {
                models: vec!["A100-SXM4-40GB".into()],
                profiles: vec!["3g.20gb".into(), "2g.10gb".into(), "7g.40gb".into()],
            }],
            ..DeviceSettings::default()
        };
        let offers = plan_of(&[a100(0)], &settings);
        assert_eq!(
            offers[0].offer,
            Offer::Mig {
                units: 3,
                unit_profile: "2g.10gb".into()
            }
        );
    }

    #[test]
    fn a_mig_gpu_no_allowlist_entry_matches_offers_nothing() {
        let settings = DeviceSettings {
            mig_profile_allowlist: vec![MigAllowlistEntry {
                models: vec!["H100".into()],
                profiles: vec!["1g.10gb".into()],
            }],
            ..DeviceSettings::default()
        };
        assert!(plan_of(&[a100(0)], &settings).is_empty());
    }

    #[test]
    fn filterdevices_and_operating_mode_exclude_gpus() {
        let gpus = [share_gpu(0), a100(1), share_gpu(2)];
        let settings = DeviceSettings {
            filter: FilterDevices {
                index: vec![2],
                ..FilterDevices::default()
            },
            ..DeviceSettings::default()
        };
        let uuids: Vec<String> = plan_of(&gpus, &settings)
            .into_iter()
            .map(|o| o.uuid)
            .collect();
        assert_eq!(uuids, ["GPU-share-0", "GPU-a100-1"]);

        let settings = DeviceSettings {
            filter: FilterDevices {
                uuid: vec!["GPU-share-0".into()],
                ..FilterDevices::default()
            },
            operating_mode: Some(OperatingMode::Share),
            ..DeviceSettings::default()
        };
        let uuids: Vec<String> = plan_of(&gpus, &settings)
            .into_iter()
            .map(|o| o.uuid)
            .collect();
        assert_eq!(uuids, ["GPU-share-2"]);

        let settings = DeviceSettings {
            operating_mode: Some(OperatingMode::Mig),
            ..DeviceSettings::default()
        };
        let uuids: Vec<String> = plan_of(&gpus, &settings)
            .into_iter()
            .map(|o| o.uuid)
            .collect();
        assert_eq!(uuids, ["GPU-a100-1"]);
    }

    #[test]
    fn profiles_are_asked_only_of_offered_mig_gpus() {
        let mut asked = Vec::new();
        let settings = DeviceSettings {
            filter: FilterDevices {
                index: vec![2],
                ..FilterDevices::default()
            },
            ..DeviceSettings::default()
        };
        plan::<Infallible>(&[share_gpu(0), a100(1), a100(2)], &settings, |i| {
            asked.push(i);
            Ok(a100_profiles())
        })
        .expect("infallible");
        assert_eq!(asked, [1]);
    }

    #[test]
    fn a_gpus_health_applies_to_all_its_devices() {
        let settings = DeviceSettings {
            split_count: 2,
            ..DeviceSettings::default()
        };
        let offers = plan_of(&[share_gpu(0), a100(1)], &settings);
        let mut health = HealthMap::new();
        health.insert(
            "GPU-a100-1".into(),
            GpuHealth {
                healthy: false,
                reason: Some("XID 79".into()),
            },
        );
        let list = device_list(&offers, &health);
        assert_eq!(list.len(), 9);
        for d in &list {
            let want = if d.id.starts_with("GPU-a100-1") {
                "Unhealthy"
            } else {
                "Healthy"
            };
            assert_eq!(d.health, want, "{}", d.id);
            assert!(d.id.len() <= 63, "{} is too long for kubelet", d.id);
        }
    }

    #[test]
    fn device_ids_round_trip() {
        for id in ["GPU-1234::0", "GPU-1234::17", "GPU-1234::mig6"] {
            let parsed = DeviceId::parse(id).expect(id);
            assert_eq!(parsed.to_string(), id);
            assert_eq!(parsed.uuid(), "GPU-1234");
        }
        assert_eq!(
            DeviceId::parse("GPU-1::mig3"),
            Some(DeviceId::MigUnit {
                uuid: "GPU-1".into(),
                n: 3
            })
        );
        for bad in [
            "GPU-1",
            "::3",
            "GPU-1::",
            "GPU-1::mig",
            "GPU-1::x3",
            "GPU-1::-3",
            "a::b::3",
        ] {
            assert_eq!(DeviceId::parse(bad), None, "{bad}");
        }
    }
}
