//! The PodResources v1 server (`pod-resources/kubelet.sock`): which devices
//! each container holds, and which devices the node can hand out. As
//! kubelet reports them, each `ContainerDevices` holds exactly one device
//! id: one entry per device and NUMA node, without `topology` for devices
//! that have none. Pods the pod code named with `set_active_pods` are
//! listed with every container, holding devices or not; otherwise only
//! pods holding devices are known. `Get` is served only with
//! `Options::pod_resources_get` (kubelet's `KubeletPodResourcesGet` gate);
//! its errors are plain (gRPC `Unknown`), as kubelet's are. CPU, memory and
//! dynamic resources are not simulated (always empty).

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_kube_proto::podresources::v1 as api;
use tonic::{Request, Response, Status};

use super::Shared;
use super::checkpoint::{Assignment, NO_NUMA};

/// The PodResourcesLister service.
pub(crate) struct PodResourcesService {
    pub shared: Arc<Shared>,
}

fn topology(numa: i64) -> Option<api::TopologyInfo> {
    (numa != NO_NUMA).then(|| api::TopologyInfo {
        nodes: vec![api::NumaNode { id: numa }],
    })
}

/// One entry per device id and NUMA node, as kubelet lists them.
fn container_devices(resource: &str, assignment: &Assignment) -> Vec<api::ContainerDevices> {
    assignment
        .devices_by_numa
        .iter()
        .flat_map(|(numa, ids)| {
            ids.iter().map(|id| api::ContainerDevices {
                resource_name: resource.to_owned(),
                device_ids: vec![id.clone()],
                topology: topology(*numa),
            })
        })
        .collect()
}

impl Shared {
    /// Every known pod (active pods the pod code named, and every pod
    /// holding devices), in pod uid order.
    fn pod_resources(&self) -> Vec<api::PodResources> {
        let ledger = self.lock_ledger();
        let active = self.lock_active_pods();
        // uid -> (pod, container -> devices)
        type Containers<'a> = BTreeMap<&'a str, Vec<api::ContainerDevices>>;
        let mut pods: BTreeMap<&str, (api::PodResources, Vec<&str>, Containers<'_>)> =
            BTreeMap::new();
        for (uid, pod) in active.iter().flatten() {
            pods.insert(
                uid,
                (
                    api::PodResources {
                        name: pod.pod.name.clone(),
                        namespace: pod.pod.namespace.clone(),
                        containers: Vec::new(),
                    },
                    pod.containers.iter().map(String::as_str).collect(),
                    BTreeMap::new(),
                ),
            );
        }
        for ((uid, container, resource), assignment) in &ledger.assignments {
            let (_, order, containers) = pods.entry(uid).or_insert_with(|| {
                (
                    api::PodResources {
                        name: assignment.pod.name.clone(),
                        namespace: assignment.pod.namespace.clone(),
                        containers: Vec::new(),
                    },
                    Vec::new(),
                    BTreeMap::new(),
                )
            });
            if !order.contains(&container.as_str()) {
                order.push(container);
            }
            containers
                .entry(container)
                .or_default()
                .extend(container_devices(resource, assignment));
        }
        pods.into_values()
            .map(|(mut pod, order, mut containers)| {
                pod.containers = order
                    .into_iter()
                    .map(|name| api::ContainerResources {
                        name: name.to_owned(),
                        devices: containers.remove(name).unwrap_or_default(),
                        ..Default::default()
                    })
                    .collect();
                pod
            })
            .collect()
    }

    /// Every healthy device of every resource, one entry per device and
    /// NUMA node.
    fn allocatable_devices(&self) -> Vec<api::ContainerDevices> {
        let plugins = self.lock_plugins();
        let mut out = Vec::new();
        for (resource, plugin) in plugins.iter() {
            for (id, device) in plugin.devices.iter().filter(|(_, d)| d.healthy) {
                let nodes = if device.numa_nodes.is_empty() {
                    vec![NO_NUMA]
                } else {
                    device.numa_nodes.clone()
                };
                out.extend(nodes.into_iter().map(|numa| api::ContainerDevices {
                    resource_name: resource.clone(),
                    device_ids: vec![id.clone()],
                    topology: topology(numa),
                }));
            }
        }
        out
    }
}

#[tonic::async_trait]
impl api::pod_resources_lister_server::PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _request: Request<api::ListPodResourcesRequest>,
    ) -> Result<Response<api::ListPodResourcesResponse>, Status> {
        Ok(Response::new(api::ListPodResourcesResponse {
            pod_resources: self.shared.pod_resources(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<api::AllocatableResourcesRequest>,
    ) -> Result<Response<api::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(api::AllocatableResourcesResponse {
            devices: self.shared.allocatable_devices(),
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<api::GetPodResourcesRequest>,
    ) -> Result<Response<api::GetPodResourcesResponse>, Status> {
        // Kubelet answers with plain errors, which gRPC carries as Unknown.
        if !self.shared.pod_resources_get {
            return Err(Status::unknown("PodResources API Get method disabled"));
        }
        let request = request.into_inner();
        self.shared
            .pod_resources()
            .into_iter()
            .find(|p| p.name == request.pod_name && p.namespace == request.pod_namespace)
            .map(|pod| {
                Response::new(api::GetPodResourcesResponse {
                    pod_resources: Some(pod),
                })
            })
            .ok_or_else(|| {
                Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    request.pod_name, request.pod_namespace
                ))
            })
    }
}
