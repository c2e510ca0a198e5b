//! Device claims: a device's counter is found by a 64-bit hash of its
//! UUID, claimed with one compare-and-swap, the same in every process.

use std::sync::atomic::Ordering;

use super::{AccountingError, MAX_DEVICES, SharedRegion};

impl SharedRegion {
    /// The region's index for the device with this UUID (`GPU-…`/`MIG-…`;
    /// prefix and case do not matter), recording it on first use with one
    /// compare-and-swap.
    ///
    /// Charge with this index rather than the CUDA ordinal when processes may
    /// see devices in different orders (`CUDA_VISIBLE_DEVICES`): the same GPU
    /// then shares one total in every process. Resolve once per device.
    pub fn device_index(&self, uuid: &str) -> Result<usize, AccountingError> {
        let hash = uuid_hash(uuid).ok_or_else(|| AccountingError::BadUuid {
            uuid: uuid.to_string(),
        })?;
        for (index, device) in self.layout().devices.iter().enumerate() {
            match device
                .uuid_hash
                .compare_exchange(0, hash, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(index),
                Err(seen) if seen == hash => return Ok(index),
                Err(_) => {}
            }
        }
        Err(AccountingError::TooManyDevices {
            path: self.path.clone(),
            requested: MAX_DEVICES + 1,
        })
    }
}

/// The 64-bit key a UUID is stored under (the model's, shared with the
/// node monitor).
fn uuid_hash(uuid: &str) -> Option<u64> {
    tessera_model::vgpu_region::uuid_hash(uuid)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::temp_path;
    use super::*;

    #[test]
    fn uuid_hashes_ignore_prefix_and_case() {
        assert_eq!(uuid_hash("GPU-ABCdef"), uuid_hash("mig-abcDEF"));
        assert_ne!(uuid_hash("GPU-abc"), uuid_hash("GPU-abd"));
        assert_eq!(uuid_hash("GPU-"), None);
        assert_eq!(uuid_hash(&"a".repeat(65)), None);
        assert!(uuid_hash("GPU-x").is_some_and(|h| h != 0));
    }

    #[test]
    fn device_index_is_stable_across_handles() {
        let (_dir, path) = temp_path("uuids");
        let a = SharedRegion::open(&path, 2).expect("open");
        let b = SharedRegion::open(&path, 2).expect("open");
        let x = a.device_index("GPU-aaaa").expect("index");
        let y = b.device_index("GPU-bbbb").expect("index");
        assert_ne!(x, y);
        assert_eq!(b.device_index("gpu-AAAA").expect("index"), x);
        assert_eq!(a.device_index("GPU-bbbb").expect("index"), y);
        assert!(a.device_index("").is_err());
        for i in 0..MAX_DEVICES - 2 {
            a.device_index(&format!("GPU-{i}")).expect("room");
        }
        assert!(matches!(
            a.device_index("GPU-one-too-many"),
            Err(AccountingError::TooManyDevices { .. })
        ));
    }
}
