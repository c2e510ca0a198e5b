//! The Kubernetes side of Allocate: the node's bind lock Lease, the pod it
//! names, and the pod's annotations.
//!
//! Kubelet's Allocate carries only device ids, so the pod is found through
//! the bind lock: the Lease `tessera-bind.<node>` names its holder
//! `<namespace>/<pod>/<uid>`, and that pod serves when it is on this node,
//! has that uid, and shows `bind-phase: allocating` written for the bind that
//! took the lock (`bind-time` ≥ the Lease's `acquireTime`, the rule in
//! [`tessera_model::sched::bind`]). Without such a holder the pods of this
//! node in `allocating` are listed: exactly one serves; none or several is an
//! error, never a guess (two pods in flight on one node must never get each
//! other's reservations).
//!
//! Every call has a timeout ([`API_TIMEOUT`]). Pod writes are merge patches
//! that carry the uid and the resourceVersion read (a conflict re-reads and
//! retries), so a write never lands on a re-created pod of the same name.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use tessera_model::contract::annotations::{self, bind_phase};
use tessera_model::contract::cluster::BIND_LEASE_PREFIX;
use tessera_model::sched::bind::phase_of_bind;

/// How long one API request may take.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a write that lost a conflict is retried.
const CONFLICT_RETRIES: usize = 5;

/// Why the Kubernetes side of Allocate failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The API server refused the call or did not answer in time.
    #[error("{what}: {problem}")]
    Api {
        /// The call (`get pod default/p`).
        what: String,
        /// What went wrong.
        problem: String,
        /// The HTTP status, when the API server answered with an error.
        code: Option<u16>,
    },
    /// No pod of this node is being allocated.
    #[error("node {node}: no pod is waiting for its devices ({detail})")]
    NoPod {
        /// The node.
        node: String,
        /// What was looked at.
        detail: String,
    },
    /// Several pods of this node are in `allocating` and the bind lock names none.
    #[error(
        "node {node}: pods {} are all in bind-phase allocating and the bind lock names none of them; refusing to guess which one kubelet is admitting",
        pods.join(", ")
    )]
    Ambiguous {
        /// The node.
        node: String,
        /// The pods, `namespace/name`.
        pods: Vec<String>,
    },
    /// The pod changed under the call (deleted, re-created, annotation refused).
    #[error("pod {pod}: {problem}")]
    Pod {
        /// `namespace/name`.
        pod: String,
        /// What happened.
        problem: String,
    },
}

/// A pod by namespace, name and uid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Uid.
    pub uid: String,
}

impl PodRef {
    /// The bind lock's holder string, `<namespace>/<pod>/<uid>`.
    pub fn holder(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.name, self.uid)
    }

    /// The pod's `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Parses a holder string.
    pub fn from_holder(holder: &str) -> Option<PodRef> {
        let mut parts = holder.splitn(3, '/');
        let (namespace, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
        if namespace.is_empty() || name.is_empty() || uid.is_empty() {
            return None;
        }
        Some(PodRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
        })
    }

    /// The reference of a pod object (`None` without namespace, name or uid).
    pub fn of(pod: &Pod) -> Option<PodRef> {
        Some(PodRef {
            namespace: pod.metadata.namespace.clone()?,
            name: pod.metadata.name.clone()?,
            uid: pod.metadata.uid.clone()?,
        })
    }
}

/// The lease name of a node's bind lock, `tessera-bind.<node>`.
pub fn lease_name(node: &str) -> String {
    format!("{BIND_LEASE_PREFIX}{node}")
}

/// The pod Allocate serves, and how it was found.
#[derive(Debug, Clone)]
pub struct Found {
    /// The pod as read.
    pub pod: Pod,
    /// Its reference.
    pub pod_ref: PodRef,
    /// True when the bind lock named it; false when the node's pods were listed.
    pub via_lease: bool,
}

/// The pod's annotation `key`.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The API calls of one node's Allocate.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    namespace: String,
    node: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

async fn timed<T>(
    what: impl Fn() -> String,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(ClusterError::Api {
            what: what(),
            code: match &e {
                kube::Error::Api(status) => Some(status.code),
                _ => None,
            },
            problem: e.to_string(),
        }),
        Err(_) => Err(ClusterError::Api {
            what: what(),
            problem: format!("no answer from the API server in {API_TIMEOUT:?}"),
            code: None,
        }),
    }
}

/// A call's HTTP status when the API server answered with an error.
fn status_of(error: &ClusterError) -> Option<u16> {
    match error {
        ClusterError::Api { code, .. } => *code,
        _ => None,
    }
}

impl Cluster {
    /// The calls for `node`, with the bind locks in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, node: &str) -> Cluster {
        Cluster {
            client,
            namespace: namespace.to_owned(),
            node: node.to_owned(),
        }
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The node's bind lock, if it exists.
    pub async fn lease(&self) -> Result<Option<Lease>, ClusterError> {
        let name = lease_name(&self.node);
        timed(
            || format!("get lease {}/{name}", self.namespace),
            self.leases().get_opt(&name),
        )
        .await
    }

    /// The pod, if it still exists with this uid.
    pub async fn pod(&self, pod: &PodRef) -> Result<Option<Pod>, ClusterError> {
        let read = timed(
            || format!("get pod {}", pod.key()),
            self.pods(&pod.namespace).get_opt(&pod.name),
        )
        .await?;
        Ok(read.filter(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str())))
    }

    /// The pod Allocate serves now: the bind lock's holder when it is this
    /// node's and allocating for that bind; else the one pod of this node in
    /// `allocating`.
    pub async fn find_allocating(&self) -> Result<Found, ClusterError> {
        let mut why_not_lease = "the bind lock is free".to_owned();
        if let Some(lease) = self.lease().await? {
            let spec = lease.spec.unwrap_or_default();
            match spec
                .holder_identity
                .as_deref()
                .filter(|h| !h.is_empty())
                .map(|h| (h, PodRef::from_holder(h)))
            {
                None => {}
                Some((holder, None)) => {
                    why_not_lease = format!("the bind lock's holder {holder:?} is not a pod");
                }
                Some((_, Some(holder))) => match self.pod(&holder).await? {
                    None => {
                        why_not_lease =
                            format!("the bind lock names {}, which is gone", holder.holder());
                    }
                    Some(pod) => {
                        let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
                            == Some(self.node.as_str());
                        let acquired = spec.acquire_time.map(|t| t.0);
                        let phase = match (&pod.metadata.annotations, acquired) {
                            (Some(a), Some(t)) => phase_of_bind(a, &t),
                            _ => None,
                        };
                        if on_node && phase == Some(bind_phase::ALLOCATING) {
                            return Ok(Found {
                                pod,
                                pod_ref: holder,
                                via_lease: true,
                            });
                        }
                        why_not_lease = format!(
                            "the bind lock names {} (on node {}, bind-phase {})",
                            holder.key(),
                            if on_node { "this" } else { "another" },
                            phase.unwrap_or("not written for this bind")
                        );
                    }
                },
            }
        }
        let list = timed(
            || format!("list pods on node {}", self.node),
            Api::<Pod>::all(self.client.clone())
                .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node))),
        )
        .await?;
        let mut allocating: Vec<(Pod, PodRef)> = list
            .items
            .into_iter()
            .filter(|p| annotation(p, annotations::BIND_PHASE) == Some(bind_phase::ALLOCATING))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str())
            })
            .filter_map(|p| PodRef::of(&p).map(|r| (p, r)))
            .collect();
        match allocating.len() {
            0 => Err(ClusterError::NoPod {
                node: self.node.clone(),
                detail: format!(
                    "{why_not_lease}, and no pod on the node is in bind-phase allocating"
                ),
            }),
            1 => {
                let (pod, pod_ref) = allocating.remove(0);
                Ok(Found {
                    pod,
                    pod_ref,
                    via_lease: false,
                })
            }
            _ => {
                let mut pods: Vec<String> = allocating.iter().map(|(_, r)| r.key()).collect();
                pods.sort();
                Err(ClusterError::Ambiguous {
                    node: self.node.clone(),
                    pods,
                })
            }
        }
    }

    /// Patches the pod's annotations with what `change` returns for the pod
    /// as read (`None`: nothing to write), by merge patch carrying the uid and
    /// the resourceVersion read; a conflict re-reads and retries.
    pub async fn patch_annotations(
        &self,
        pod: &PodRef,
        mut change: impl FnMut(&Pod) -> Result<Option<BTreeMap<String, String>>, String>,
    ) -> Result<(), ClusterError> {
        let api = self.pods(&pod.namespace);
        let mut last = String::new();
        for _ in 0..CONFLICT_RETRIES {
            let Some(current) = self.pod(pod).await? else {
                return Err(ClusterError::Pod {
                    pod: pod.key(),
                    problem: format!("gone (no pod with uid {})", pod.uid),
                });
            };
            let wanted = change(&current).map_err(|problem| ClusterError::Pod {
                pod: pod.key(),
                problem,
            })?;
            let Some(wanted) = wanted else {
                return Ok(());
            };
            let body = serde_json::json!({
                "metadata": {
                    "uid": pod.uid,
                    "resourceVersion": current.metadata.resource_version,
                    "annotations": wanted,
                }
            });
            let result = timed(
                || format!("patch pod {}", pod.key()),
                api.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&body)),
            )
            .await;
            match result {
                Ok(_) => return Ok(()),
                Err(e) if status_of(&e) == Some(409) => last = e.to_string(),
                Err(e) => return Err(e),
            }
        }
        Err(ClusterError::Pod {
            pod: pod.key(),
            problem: format!("still conflicting after {CONFLICT_RETRIES} writes: {last}"),
        })
    }

    /// Sets `bind-phase` (keeping `bind-time`).
    pub async fn set_bind_phase(&self, pod: &PodRef, phase: &str) -> Result<(), ClusterError> {
        self.patch_annotations(pod, |current| {
            if annotation(current, annotations::BIND_PHASE) == Some(phase) {
                return Ok(None);
            }
            Ok(Some(BTreeMap::from([(
                annotations::BIND_PHASE.to_owned(),
                phase.to_owned(),
            )])))
        })
        .await
    }

    /// Releases the bind lock if it still names `pod` (clearing its holder by
    /// resourceVersion compare-and-swap). `Ok(false)`: it names someone else
    /// or changed in between (a conflict: someone else took it), or is gone.
    pub async fn release_lease(&self, pod: &PodRef) -> Result<bool, ClusterError> {
        let Some(mut lease) = self.lease().await? else {
            return Ok(false);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(pod.holder().as_str()) {
            return Ok(false);
        }
        lease.spec = Some(LeaseSpec {
            lease_duration_seconds: spec.lease_duration_seconds,
            ..Default::default()
        });
        let name = lease_name(&self.node);
        match timed(
            || format!("release lease {}/{name}", self.namespace),
            self.leases().replace(&name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(_) => Ok(true),
            Err(e) if matches!(status_of(&e), Some(404 | 409)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// When the bind lock was taken (its `acquireTime`), if it names `pod`.
pub fn acquired_for(lease: &Lease, pod: &PodRef) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    (spec.holder_identity.as_deref() == Some(pod.holder().as_str()))
        .then(|| spec.acquire_time.as_ref().map(|t| t.0))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_round_trip_and_bad_ones_are_refused() {
        let r = PodRef::from_holder("ns/p/1234-abcd").expect("holder");
        assert_eq!(r.namespace, "ns");
        assert_eq!(r.name, "p");
        assert_eq!(r.uid, "1234-abcd");
        assert_eq!(r.holder(), "ns/p/1234-abcd");
        for bad in ["", "ns/p", "ns//u", "/p/u", "ns/p/"] {
            assert_eq!(PodRef::from_holder(bad), None, "{bad:?}");
        }
        assert_eq!(lease_name("n1"), "tessera-bind.n1");
    }

    #[test]
    fn conflict_codes_are_kept() {
        let e = ClusterError::Api {
            what: "patch".into(),
            problem: "conflict".into(),
            code: Some(409),
        };
        assert_eq!(status_of(&e), Some(409));
        let other = ClusterError::NoPod {
            node: "n".into(),
            detail: "d".into(),
        };
        assert_eq!(status_of(&other), None);
    }
}
