//! Admission's resource check, as kubelet's predicate admit handler: the
//! pod's requests (counted as the scheduler counts them) must fit the
//! node's allocatable less what the other active pods request. Extended
//! resources the node does not list are left out first (cluster-level
//! resources a scheduler extender handles), and device plugin resources are
//! the device manager's to check (its allocation ran before, and kubelet
//! raises allocatable to what is allocated).

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_kube_scheduler::resources::{self as res, Resources};

use super::is_extended_resource;

/// A pod that does not fit, as kubelet rejects it: reason
/// `OutOf<resource>`, message naming the amounts (cpu in millicores, the
/// rest in units).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
)]
pub struct OutOf {
    /// The resource.
    pub resource: String,
    /// What the pod requests.
    pub requested: i128,
    /// What the node's other active pods request.
    pub used: i128,
    /// The node's allocatable.
    pub capacity: i128,
}

impl OutOf {
    /// The pod status reason, `OutOf<resource>`.
    pub fn reason(&self) -> String {
        format!("OutOf{}", self.resource)
    }
}

/// The node's allocatable and the requests of the pods admitted on it.
pub struct NodeResources {
    /// Until the Node is read back from the API server: what this kubelet
    /// reports (cpu, memory, ephemeral-storage, pods).
    allocatable: Mutex<Resources>,
    /// Requests of the admitted, still active pods, by uid.
    admitted: Mutex<BTreeMap<String, Resources>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the fit check counts `resource`: kubelet's node info tracks cpu,
/// memory, ephemeral storage and scalar resources (extended ones and
/// hugepages); other names are not checked.
fn checked(resource: &str) -> bool {
    matches!(resource, res::CPU | res::MEMORY | res::EPHEMERAL_STORAGE)
        || resource.starts_with("hugepages-")
        || is_extended_resource(resource)
}

/// Milli-units as the message shows them: millicores for cpu, whole units
/// (rounded up) otherwise.
fn shown(resource: &str, milli: i128) -> i128 {
    if resource == res::CPU {
        milli
    } else {
        milli.div_euclid(1000) + i128::from(milli.rem_euclid(1000) != 0)
    }
}

impl NodeResources {
    /// With `allocatable` as the node reports it before the API server
    /// answers.
    pub fn new(allocatable: &BTreeMap<String, Quantity>) -> NodeResources {
        NodeResources {
            allocatable: Mutex::new(res::resource_list(Some(allocatable))),
            admitted: Mutex::default(),
        }
    }

    /// The Node's `status.allocatable` as the API server has it now.
    pub fn set_allocatable(&self, allocatable: &BTreeMap<String, Quantity>) {
        *lock(&self.allocatable) = res::resource_list(Some(allocatable));
    }

    /// Checks that `pod` fits beside the other admitted pods and, if so,
    /// counts it as admitted (one check at a time, as kubelet admits one pod
    /// at a time). `device_resource` says which resources the device
    /// manager checks.
    pub fn admit(
        &self,
        uid: &str,
        pod: &Pod,
        device_resource: impl Fn(&str) -> bool,
    ) -> Result<(), OutOf> {
        let allocatable = lock(&self.allocatable).clone();
        let mut all = res::pod_requests(pod);
        all.retain(|_, v| *v > 0);
        let mut requests = all.clone();
        requests.retain(|r, v| {
            // Extended resources the node does not list are left out.
            let listed = !is_extended_resource(r) || allocatable.contains_key(r);
            *v > 0 && checked(r) && !device_resource(r) && listed
        });
        let mut admitted = lock(&self.admitted);
        let others = admitted.iter().filter(|(other, _)| other.as_str() != uid);
        let pods = others.clone().count() as i128;
        let capacity = allocatable.get(res::PODS).copied().unwrap_or(0) / 1000;
        if pods + 1 > capacity {
            return Err(OutOf {
                resource: res::PODS.to_owned(),
                requested: 1,
                used: pods,
                capacity,
            });
        }
        let mut used = Resources::new();
        for (_, r) in others {
            for (name, v) in r {
                let e = used.entry(name.clone()).or_insert(0);
                *e = e.saturating_add(*v);
            }
        }
        // kubelet's order: cpu, memory, ephemeral storage, then the rest.
        let mut order: Vec<&String> = requests.keys().collect();
        order.sort_by_key(|r| match r.as_str() {
            res::CPU => 0,
            res::MEMORY => 1,
            res::EPHEMERAL_STORAGE => 2,
            _ => 3,
        });
        for resource in order {
            let want = requests[resource];
            let have = allocatable.get(resource).copied().unwrap_or(0);
            let taken = used.get(resource).copied().unwrap_or(0);
            if want > have.saturating_sub(taken) {
                return Err(OutOf {
                    resource: resource.clone(),
                    requested: shown(resource, want),
                    used: shown(resource, taken),
                    capacity: shown(resource, have),
                });
            }
        }
        // Others count its whole request, as kubelet's node info does.
        admitted.insert(uid.to_owned(), all);
        Ok(())
    }

    /// The pod no longer counts (finished, deleted).
    pub fn release(&self, uid: &str) {
        lock(&self.admitted).remove(uid);
    }
}
