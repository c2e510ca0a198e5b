//! Choosing devices for a pod's containers and asking the plugins for
//! them, as kubelet's device manager does: a running container keeps its
//! checkpointed assignment unchecked; otherwise the resource must be
//! registered with healthy devices, and a checkpointed assignment is reused
//! only when its devices are healthy; else devices an init container of the
//! pod no longer needs are reused first, then healthy devices no active
//! pod holds are picked (the plugin's preferred allocation first when it
//! offers one), Allocate is called, and the answer is in the checkpoint
//! before the container may start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tessera_kube_proto::deviceplugin::v1beta1 as api;

use super::checkpoint::{Assignment, AssignmentKey, NO_NUMA};
use super::plugins::PluginClient;
use super::{
    AdmitError, ContainerAllocation, ContainerKind, ContainerRequest, DeviceSpec, Mount, PodRef,
    Shared,
};

/// How long a plugin may take to answer GetPreferredAllocation, Allocate or
/// PreStartContainer before the container fails admission (kubelet waits
/// without bound; a stand-in must not hang its pod loop on a stuck plugin).
const PLUGIN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Device ids by resource.
type DeviceSets = BTreeMap<String, BTreeSet<String>>;

impl Shared {
    /// Whether `resource` is the device manager's: registered, or held by
    /// a checkpointed assignment (kubelet's test, so that an assignment of
    /// a resource nobody registers fails admission instead of being
    /// ignored).
    fn is_device_resource(&self, resource: &str) -> bool {
        self.manages(resource)
            || self
                .lock_ledger()
                .assignments
                .keys()
                .any(|(_, _, r)| r == resource)
    }

    pub(crate) async fn admit_pod(
        self: &Arc<Self>,
        pod: &PodRef,
        containers: &[ContainerRequest],
    ) -> Result<BTreeMap<String, ContainerAllocation>, AdmitError> {
        // One admission at a time: choosing and recording must not
        // interleave, or two pods could get the same device.
        let _serial = self.allocation.lock().await;
        // Devices of this pod's init containers that later ones may take.
        let mut reusable = DeviceSets::new();
        let mut added: Vec<AssignmentKey> = Vec::new();
        let mut admitted = BTreeMap::new();
        for container in containers {
            match self
                .allocate_container(pod, container, &reusable, &mut added)
                .await
            {
                Ok(allocation) => {
                    admitted.insert(container.name.clone(), allocation);
                }
                Err(e) => {
                    // Admitted whole or not at all: what this call assigned
                    // is freed.
                    if !added.is_empty() {
                        let mut ledger = self.lock_ledger();
                        for key in &added {
                            ledger.assignments.remove(key);
                        }
                        self.save(&ledger);
                    }
                    return Err(e);
                }
            }
            let held = self.container_device_sets(&pod.uid, &container.name);
            match container.kind {
                ContainerKind::Init => {
                    for (resource, ids) in held {
                        reusable.entry(resource).or_default().extend(ids);
                    }
                }
                // It keeps running: what it holds is nobody else's.
                ContainerKind::SidecarInit | ContainerKind::App => {
                    for (resource, ids) in held {
                        if let Some(pool) = reusable.get_mut(&resource) {
                            pool.retain(|id| !ids.contains(id));
                        }
                    }
                }
            }
        }
        Ok(admitted)
    }

    /// Device ids one container holds, by resource.
    fn container_device_sets(&self, uid: &str, container: &str) -> DeviceSets {
        self.lock_ledger()
            .assignments
            .iter()
            .filter(|((u, c, _), _)| u == uid && c == container)
            .map(|((_, _, resource), a)| (resource.clone(), a.device_ids()))
            .collect()
    }

    pub(crate) fn reuse_running(&self, uid: &str, container: &str) -> ContainerAllocation {
        let ledger = self.lock_ledger();
        merge(
            ledger
                .assignments
                .iter()
                .filter(|((u, c, _), _)| u == uid && c == container)
                .map(|(_, a)| a.response.clone())
                .collect(),
        )
    }

    async fn allocate_container(
        &self,
        pod: &PodRef,
        container: &ContainerRequest,
        reusable: &DeviceSets,
        added: &mut Vec<AssignmentKey>,
    ) -> Result<ContainerAllocation, AdmitError> {
        let empty = BTreeSet::new();
        let mut responses = Vec::new();
        for (resource, &count) in &container.requests {
            if count == 0 || !self.is_device_resource(resource) {
                continue;
            }
            let wanted = Wanted {
                pod,
                container: &container.name,
                resource,
                count,
                running: container.running,
                reusable: reusable.get(resource).unwrap_or(&empty),
            };
            let (response, new) = self.allocate_resource(wanted).await?;
            if new {
                added.push((pod.uid.clone(), container.name.clone(), resource.clone()));
            }
            responses.extend(response);
        }
        Ok(merge(responses))
    }

    /// One resource of one container: its response (none for a running
    /// container without devices), and `true` with a fresh assignment.
    async fn allocate_resource(
        &self,
        wanted: Wanted<'_>,
    ) -> Result<(Option<api::ContainerAllocateResponse>, bool), AdmitError> {
        let Wanted {
            pod,
            container,
            resource,
            count,
            running,
            reusable,
        } = wanted;
        let key = (pod.uid.clone(), container.to_owned(), resource.to_owned());
        let plugin_error = |call: &'static str, message: String| AdmitError::Plugin {
            resource: resource.to_owned(),
            call,
            message,
        };
        // Choose under the locks, call the plugin outside them.
        let (client, options, reused, available, numa) = {
            let plugins = self.lock_plugins();
            let ledger = self.lock_ledger();
            let existing = ledger.assignments.get(&key);
            if let Some(existing) = existing {
                let held = existing.device_ids().len() as u64;
                if held != count {
                    return Err(AdmitError::RequestChanged {
                        resource: resource.to_owned(),
                        held,
                        requested: count,
                    });
                }
            }
            // A running container (kubelet restarted, the node did not)
            // has its devices: nothing to check, nothing to do.
            if running {
                tracing::debug!(pod = %pod.name, %container, %resource, "container running: keeping its checkpointed devices");
                return Ok((existing.map(|a| a.response.clone()), false));
            }
            let Some(plugin) = plugins.get(resource) else {
                return Err(AdmitError::Unregistered {
                    resource: resource.to_owned(),
                });
            };
            let healthy: BTreeSet<String> = plugin.healthy_ids().into_iter().collect();
            if healthy.is_empty() {
                return Err(AdmitError::NoHealthyDevices {
                    resource: resource.to_owned(),
                });
            }
            if let Some(existing) = existing {
                if !existing.device_ids().is_subset(&healthy) {
                    return Err(AdmitError::NoLongerHealthy {
                        resource: resource.to_owned(),
                    });
                }
                tracing::debug!(pod = %pod.name, %container, %resource, "reusing the checkpointed allocation");
                return Ok((Some(existing.response.clone()), false));
            }
            let reused: Vec<String> = reusable
                .iter()
                .take(usize::try_from(count).unwrap_or(usize::MAX))
                .cloned()
                .collect();
            let assigned = ledger.assigned(resource);
            let available: Vec<String> = healthy
                .into_iter()
                .filter(|id| !assigned.contains(id))
                .collect();
            let numa: BTreeMap<String, Vec<i64>> = plugin
                .devices
                .iter()
                .map(|(id, d)| (id.clone(), d.numa_nodes.clone()))
                .collect();
            (
                plugin.client.clone(),
                plugin.options.unwrap_or_default(),
                reused,
                available,
                numa,
            )
        };
        let wanted = usize::try_from(count).unwrap_or(usize::MAX);
        let needed = wanted - reused.len();
        if needed > 0 && available.len() < needed {
            return Err(AdmitError::Unavailable {
                resource: resource.to_owned(),
                requested: needed as u64,
                available: available.len() as u64,
            });
        }
        let Some(mut client) = client else {
            return Err(plugin_error(
                "Allocate",
                "the plugin is not registered".into(),
            ));
        };

        let mut chosen: Vec<String> = reused
            .iter()
            .chain(available.iter().take(needed))
            .cloned()
            .collect();
        if needed > 0 && options.get_preferred_allocation_available {
            let mut offered: Vec<String> = available.iter().chain(&reused).cloned().collect();
            offered.sort();
            let request = api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: offered.clone(),
                    must_include_device_i_ds: reused.clone(),
                    allocation_size: i32::try_from(count).unwrap_or(i32::MAX),
                }],
            };
            let response = call(client.get_preferred_allocation(request))
                .await
                .map_err(|m| plugin_error("GetPreferredAllocation", m))?;
            let preferred = response
                .container_responses
                .into_iter()
                .next()
                .map(|c| c.device_i_ds)
                .unwrap_or_default();
            match check_preferred(&preferred, &offered, &reused, wanted) {
                Ok(()) => chosen = preferred,
                Err(why) => tracing::warn!(
                    %resource,
                    ?preferred,
                    "ignoring the plugin's preferred allocation ({why}); taking the first {wanted} available devices"
                ),
            }
        }
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        };
        let mut response = call(client.allocate(request))
            .await
            .map_err(|m| plugin_error("Allocate", m))?;
        if response.container_responses.len() != 1 {
            return Err(plugin_error(
                "Allocate",
                format!(
                    "AllocateResponse has {} container responses, expected 1",
                    response.container_responses.len()
                ),
            ));
        }
        let container_response = response.container_responses.remove(0);

        let mut devices_by_numa: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for id in &chosen {
            match numa.get(id).map(Vec::as_slice) {
                None | Some([]) => devices_by_numa.entry(NO_NUMA).or_default().push(id.clone()),
                Some(nodes) => {
                    for node in nodes {
                        devices_by_numa.entry(*node).or_default().push(id.clone());
                    }
                }
            }
        }
        let written = {
            let mut ledger = self.lock_ledger();
            ledger.assignments.insert(
                key.clone(),
                Assignment {
                    pod: pod.clone(),
                    devices_by_numa,
                    response: container_response.clone(),
                },
            );
            self.writer.save_and_wait(&ledger)
        };
        // On disk before the container may start (a kubelet restart must
        // not lose it); written off the async workers.
        if let Err(message) = written.await {
            let mut ledger = self.lock_ledger();
            ledger.assignments.remove(&key);
            self.save(&ledger);
            return Err(AdmitError::Checkpoint { message });
        }
        tracing::info!(pod = %pod.name, %container, %resource, devices = ?chosen, "devices allocated");
        Ok((Some(container_response), true))
    }

    pub(crate) async fn pre_start(&self, pod: &PodRef, container: &str) -> Result<(), AdmitError> {
        let mut calls: Vec<(String, PluginClient, Vec<String>)> = Vec::new();
        {
            let plugins = self.lock_plugins();
            let ledger = self.lock_ledger();
            for ((uid, name, resource), assignment) in &ledger.assignments {
                if uid != &pod.uid || name != container {
                    continue;
                }
                let Some(plugin) = plugins.get(resource) else {
                    continue;
                };
                let required = plugin
                    .options
                    .as_ref()
                    .is_some_and(|o| o.pre_start_required);
                if let (true, Some(client)) = (required, plugin.client.clone()) {
                    calls.push((
                        resource.clone(),
                        client,
                        assignment.device_ids().into_iter().collect(),
                    ));
                }
            }
        }
        for (resource, mut client, devices_ids) in calls {
            call(client.pre_start_container(api::PreStartContainerRequest { devices_ids }))
                .await
                .map_err(|message| AdmitError::Plugin {
                    resource,
                    call: "PreStartContainer",
                    message,
                })?;
        }
        Ok(())
    }
}

/// A plugin call with [`PLUGIN_CALL_TIMEOUT`]; the error as one line.
async fn call<T>(
    future: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(PLUGIN_CALL_TIMEOUT, future).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {PLUGIN_CALL_TIMEOUT:?}")),
    }
}

/// What one container wants of one resource.
struct Wanted<'a> {
    pod: &'a PodRef,
    container: &'a str,
    resource: &'a str,
    count: u64,
    running: bool,
    /// Devices of the pod's init containers it may take first.
    reusable: &'a BTreeSet<String>,
}

/// A preferred allocation is used only when it is exactly `wanted`
/// distinct devices, all of them offered, including every one in
/// `must_include`.
fn check_preferred(
    preferred: &[String],
    available: &[String],
    must_include: &[String],
    wanted: usize,
) -> Result<(), String> {
    let distinct: BTreeSet<&String> = preferred.iter().collect();
    if preferred.len() != wanted || distinct.len() != wanted {
        return Err(format!(
            "{} devices ({} distinct), {wanted} requested",
            preferred.len(),
            distinct.len()
        ));
    }
    let available: BTreeSet<&String> = available.iter().collect();
    if let Some(id) = preferred.iter().find(|id| !available.contains(id)) {
        return Err(format!("device {id:?} is not available"));
    }
    if let Some(id) = must_include.iter().find(|id| !distinct.contains(id)) {
        return Err(format!("device {id:?} must be included"));
    }
    Ok(())
}

/// The responses of every resource of a container, merged in resource
/// name order (a later resource's env or annotation wins on a clash).
fn merge(responses: Vec<api::ContainerAllocateResponse>) -> ContainerAllocation {
    let mut merged = ContainerAllocation::default();
    for r in responses {
        merged.envs.extend(r.envs);
        merged.annotations.extend(r.annotations);
        merged.mounts.extend(r.mounts.into_iter().map(|m| Mount {
            container_path: m.container_path,
            host_path: m.host_path,
            read_only: m.read_only,
        }));
        merged
            .devices
            .extend(r.devices.into_iter().map(|d| DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            }));
        merged
            .cdi_devices
            .extend(r.cdi_devices.into_iter().map(|c| c.name));
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn preferred_allocation_must_fit_exactly() {
        let available = ids(&["a", "b", "c"]);
        assert_eq!(
            check_preferred(&ids(&["c", "a"]), &available, &[], 2),
            Ok(())
        );
        assert!(check_preferred(&ids(&["c"]), &available, &[], 2).is_err());
        assert!(check_preferred(&ids(&["a", "b", "c"]), &available, &[], 2).is_err());
        assert!(check_preferred(&ids(&["a", "a"]), &available, &[], 2).is_err());
        assert!(check_preferred(&ids(&["a", "z"]), &available, &[], 2).is_err());
        // Devices reused from an init container must be in it.
        let reused = ids(&["b"]);
        assert_eq!(
            check_preferred(&ids(&["b", "c"]), &available, &reused, 2),
            Ok(())
        );
        assert!(check_preferred(&ids(&["a", "c"]), &available, &reused, 2).is_err());
    }

    #[test]
    fn merge_keeps_every_part_of_every_response() {
        let one = api::ContainerAllocateResponse {
            envs: [
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), "1".to_owned()),
            ]
            .into(),
            mounts: vec![api::Mount {
                container_path: "/c".into(),
                host_path: "/h".into(),
                read_only: true,
            }],
            cdi_devices: vec![api::CdiDevice {
                name: "v.com/c=0".into(),
            }],
            ..Default::default()
        };
        let two = api::ContainerAllocateResponse {
            envs: [("B".to_owned(), "2".to_owned())].into(),
            devices: vec![api::DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/y".into(),
                permissions: "rw".into(),
            }],
            annotations: [("k".to_owned(), "v".to_owned())].into(),
            cdi_devices: vec![api::CdiDevice {
                name: "v.com/c=1".into(),
            }],
            ..Default::default()
        };
        let merged = merge(vec![one, two]);
        assert_eq!(merged.envs.get("A").map(String::as_str), Some("1"));
        assert_eq!(merged.envs.get("B").map(String::as_str), Some("2"));
        assert_eq!(merged.mounts.len(), 1);
        assert!(merged.mounts[0].read_only);
        assert_eq!(merged.devices[0].permissions, "rw");
        assert_eq!(merged.annotations.get("k").map(String::as_str), Some("v"));
        assert_eq!(merged.cdi_devices, vec!["v.com/c=0", "v.com/c=1"]);
    }
}
