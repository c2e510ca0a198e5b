//! The per-node bind lock: a coordination.k8s.io/v1 Lease
//! `tessera-bind.<node>` in Tessera's namespace, holder
//! `<namespace>/<pod>/<uid>`, 300 s, taken by resourceVersion
//! compare-and-swap (create when absent, else update carrying the version
//! read), so two replicas never both hold it.
//!
//! Time is judged on this replica's own monotonic clock, never on the
//! writer's `renewTime` (another replica's wall clock may be skewed): a
//! lease's age is how long this replica has seen it unchanged (same
//! resourceVersion), as client-go's leader election does. A replica that
//! just started therefore waits the full durations before it calls a lease
//! stale.
//!
//! The lease is free when it has no holder, when it expired (unchanged for
//! its `leaseDurationSeconds`), or when its holder pod is gone (404, or
//! another pod of that name) or is done with this bind (`bind-phase:
//! success` or `failed` written for this bind: its `bind-time` is no earlier
//! than the lease's `acquireTime`, both written by the lock's holder), or
//! shows no bind phase for this bind although the lease has been unchanged
//! for [`BIND_GRACE`] (the bind that took it rolled back or died before
//! writing its annotations). A phase left from an earlier bind (a pod
//! re-created from saved YAML) counts as no phase. A lock held under the
//! very holder string asking for it is held, not free: that is a second
//! bind of the same pod, still running.
//!
//! A bind renews the lease by compare-and-swap just before it writes its
//! annotations ([`BindLocks::renew`]) and checks it still holds it after
//! ([`BindLocks::confirm`]); a takeover in between makes it abort.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tessera_model::contract::cluster;
use thiserror::Error;

/// How long a lease whose holder pod shows no bind phase still holds,
/// counted from when this replica last saw the lease change: well over the
/// longest a bind may take from its renewal to its annotations landing.
pub const BIND_GRACE: Duration = Duration::from_secs(30);

/// How long one API request may take.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the lock could not be taken, kept or released.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LockError {
    /// Another bind held the node's lock for the whole wait.
    #[error("node {node}: bind lock held by {holder} for over {waited:?}")]
    Busy {
        /// The node.
        node: String,
        /// Who holds it.
        holder: String,
        /// How long this bind waited.
        waited: Duration,
    },
    /// The lock this bind took was changed by someone else (taken over).
    #[error("node {node}: bind lock lost: {problem}")]
    Lost {
        /// The node.
        node: String,
        /// What was seen.
        problem: String,
    },
    /// The API server refused or did not answer.
    #[error("node {node}: bind lock: {problem}")]
    Api {
        /// The node.
        node: String,
        /// What went wrong.
        problem: String,
    },
}

/// The holder string of a pod: `<namespace>/<pod>/<uid>`.
pub fn holder_of(namespace: &str, name: &str, uid: &str) -> String {
    format!("{namespace}/{name}/{uid}")
}

/// The lease name of a node's lock.
pub fn lease_name(node: &str) -> String {
    format!("{}{node}", cluster::BIND_LEASE_PREFIX)
}

/// A lock taken by one call of [`BindLocks::acquire`]: only its taker
/// renews or releases it, and only while the lease is still the version
/// it last wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldLock {
    /// The node.
    pub node: String,
    /// The holder string written.
    pub holder: String,
    /// The lease's resourceVersion after this taker's last write.
    version: String,
    /// The lease as last written (for renewals).
    spec: LeaseSpec,
}

impl HeldLock {
    /// The `acquireTime` written when the lock was taken.
    pub fn acquired(&self) -> Option<Timestamp> {
        self.spec.acquire_time.as_ref().map(|t| t.0)
    }
}

/// When this replica first saw a lease at a resourceVersion.
#[derive(Debug, Clone)]
struct Sighting {
    version: String,
    since: Instant,
}

/// The bind locks of one namespace.
#[derive(Clone)]
pub struct BindLocks {
    leases: Api<Lease>,
    pods_client: kube::Client,
    wait: Duration,
    /// Lease name → the version last seen and since when (monotonic).
    sightings: Arc<Mutex<HashMap<String, Sighting>>>,
}

impl std::fmt::Debug for BindLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BindLocks")
            .field("wait", &self.wait)
            .finish()
    }
}

/// The HTTP status of an API error, if it is one.
pub fn api_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Who holds a lease by the rules, and whether it is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Nobody holds it.
    Free,
    /// Held by this holder string.
    Held(String),
}

impl BindLocks {
    /// Locks kept as Leases in `namespace`; [`Self::acquire`] waits up to `wait`.
    pub fn new(client: kube::Client, namespace: &str, wait: Duration) -> BindLocks {
        BindLocks {
            leases: Api::namespaced(client.clone(), namespace),
            pods_client: client,
            wait,
            sightings: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Takes `node`'s lock for `holder`, waiting up to the configured wait.
    /// A lock held under `holder` itself counts as held (a second bind of
    /// the same pod), never as already ours.
    pub async fn acquire(&self, node: &str, holder: &str) -> Result<HeldLock, LockError> {
        let started = Instant::now();
        let name = lease_name(node);
        let api_error = |problem: String| LockError::Api {
            node: node.to_string(),
            problem,
        };
        let mut pause = Duration::from_millis(20);
        let mut last_holder = String::new();
        loop {
            let read = timed(self.leases.get_opt(&name))
                .await
                .map_err(|e| api_error(e.to_string()))?;
            let spec = held_spec(holder);
            let outcome = match read {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..Default::default()
                        },
                        spec: Some(spec.clone()),
                    };
                    Some(timed(self.leases.create(&PostParams::default(), &lease)).await)
                }
                Some(mut lease) => match self.judge(&name, &lease).await {
                    LeaseState::Held(other) => {
                        last_holder = other;
                        None
                    }
                    LeaseState::Free => {
                        lease.spec = Some(spec.clone());
                        Some(
                            timed(self.leases.replace(&name, &PostParams::default(), &lease)).await,
                        )
                    }
                },
            };
            match outcome {
                Some(Ok(written)) => {
                    let version = self.saw(&name, &written).ok_or_else(|| {
                        api_error(
                            "the API server returned a Lease without a resourceVersion".into(),
                        )
                    })?;
                    return Ok(HeldLock {
                        node: node.to_string(),
                        holder: holder.to_string(),
                        version,
                        spec,
                    });
                }
                // Lost a race (409 on update, 409 AlreadyExists on create): re-read.
                Some(Err(TimedError::Api(e))) if api_code(&e) == Some(409) => {
                    last_holder = "another bind (lost the compare-and-swap)".into();
                }
                Some(Err(e)) => return Err(api_error(e.to_string())),
                None => {}
            }
            if started.elapsed() >= self.wait {
                return Err(LockError::Busy {
                    node: node.to_string(),
                    holder: last_holder,
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Renews a held lock (a new `renewTime`, by compare-and-swap on the
    /// version this taker last wrote): fails with [`LockError::Lost`] when
    /// anyone changed the lease since, so a bind never writes after a
    /// takeover.
    pub async fn renew(&self, held: &mut HeldLock) -> Result<(), LockError> {
        let name = lease_name(&held.node);
        let mut spec = held.spec.clone();
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: Some(held.version.clone()),
                ..Default::default()
            },
            spec: Some(spec.clone()),
        };
        match timed(self.leases.replace(&name, &PostParams::default(), &lease)).await {
            Ok(written) => {
                held.version = self.saw(&name, &written).ok_or_else(|| LockError::Api {
                    node: held.node.clone(),
                    problem: "the API server returned a Lease without a resourceVersion".into(),
                })?;
                held.spec = spec;
                Ok(())
            }
            Err(TimedError::Api(e)) if matches!(api_code(&e), Some(404 | 409)) => {
                Err(LockError::Lost {
                    node: held.node.clone(),
                    problem: "changed by someone else since this bind took it".into(),
                })
            }
            Err(e) => Err(LockError::Api {
                node: held.node.clone(),
                problem: e.to_string(),
            }),
        }
    }

    /// Checks that the lease is still exactly as this taker last wrote it.
    pub async fn confirm(&self, held: &HeldLock) -> Result<(), LockError> {
        let name = lease_name(&held.node);
        let lease = timed(self.leases.get_opt(&name))
            .await
            .map_err(|e| LockError::Api {
                node: held.node.clone(),
                problem: e.to_string(),
            })?;
        match lease {
            Some(lease) if lease.metadata.resource_version.as_deref() == Some(&held.version) => {
                Ok(())
            }
            Some(lease) => Err(LockError::Lost {
                node: held.node.clone(),
                problem: format!(
                    "now held by {}",
                    holder_in(&lease).unwrap_or_else(|| "nobody".into())
                ),
            }),
            None => Err(LockError::Lost {
                node: held.node.clone(),
                problem: "the Lease was deleted".into(),
            }),
        }
    }

    /// Releases a lock this taker holds, by compare-and-swap on the version
    /// it last wrote: a lease changed since (taken over, released by the
    /// device plugin) is left alone.
    pub async fn release(&self, held: &HeldLock) -> Result<(), LockError> {
        let name = lease_name(&held.node);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: Some(held.version.clone()),
                ..Default::default()
            },
            spec: Some(free_spec()),
        };
        match timed(self.leases.replace(&name, &PostParams::default(), &lease)).await {
            Ok(written) => {
                self.saw(&name, &written);
                Ok(())
            }
            Err(TimedError::Api(e)) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(LockError::Api {
                node: held.node.clone(),
                problem: e.to_string(),
            }),
        }
    }

    /// Who holds `node`'s lock now, by the rules.
    pub async fn state_of(&self, node: &str) -> Result<LeaseState, LockError> {
        let name = lease_name(node);
        let lease = timed(self.leases.get_opt(&name))
            .await
            .map_err(|e| LockError::Api {
                node: node.to_string(),
                problem: e.to_string(),
            })?;
        Ok(match lease {
            None => LeaseState::Free,
            Some(lease) => self.judge(&name, &lease).await,
        })
    }

    /// Clears every bind lock of the namespace that is free by the rules
    /// (expired, holder pod gone or done): the extender's own release after
    /// the device plugin finished, or after a crash. Returns how many.
    /// Run often, it also keeps this replica's sightings of the leases
    /// current, so stale ones are recognized on time.
    pub async fn sweep(&self) -> Result<usize, LockError> {
        let api_error = |problem: String| LockError::Api {
            node: "*".into(),
            problem,
        };
        let list = timed(self.leases.list(&Default::default()))
            .await
            .map_err(|e| api_error(e.to_string()))?;
        {
            let names: std::collections::HashSet<&str> = list
                .items
                .iter()
                .filter_map(|l| l.metadata.name.as_deref())
                .collect();
            lock(&self.sightings).retain(|name, _| names.contains(name.as_str()));
        }
        let mut released = 0;
        for mut lease in list.items {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            if !name.starts_with(cluster::BIND_LEASE_PREFIX) || holder_in(&lease).is_none() {
                continue;
            }
            if self.judge(&name, &lease).await != LeaseState::Free {
                continue;
            }
            lease.spec = Some(free_spec());
            // A conflict means someone just took it: leave it to them.
            if let Ok(written) =
                timed(self.leases.replace(&name, &PostParams::default(), &lease)).await
            {
                self.saw(&name, &written);
                released += 1;
            }
        }
        Ok(released)
    }

    /// Records a sighting of `lease` at its resourceVersion; returns that version.
    fn saw(&self, name: &str, lease: &Lease) -> Option<String> {
        let version = lease.metadata.resource_version.clone()?;
        self.unchanged_for(name, &version);
        Some(version)
    }

    /// How long this replica has seen lease `name` at `version` (zero when
    /// this is the first sighting of that version).
    fn unchanged_for(&self, name: &str, version: &str) -> Duration {
        let mut sightings = lock(&self.sightings);
        match sightings.get(name) {
            Some(seen) if seen.version == version => seen.since.elapsed(),
            _ => {
                sightings.insert(
                    name.to_string(),
                    Sighting {
                        version: version.to_string(),
                        since: Instant::now(),
                    },
                );
                Duration::ZERO
            }
        }
    }

    /// Who holds the lease now, by the rules.
    async fn judge(&self, name: &str, lease: &Lease) -> LeaseState {
        let Some(holder) = holder_in(lease) else {
            return LeaseState::Free;
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let unchanged = self.unchanged_for(name, &version);
        let spec = lease.spec.clone().unwrap_or_default();
        let seconds = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
        if unchanged >= Duration::from_secs(seconds) {
            return LeaseState::Free;
        }
        let mut parts = holder.splitn(3, '/');
        let (Some(namespace), Some(pod), Some(uid)) = (parts.next(), parts.next(), parts.next())
        else {
            // Not a holder this protocol writes: respect it until it expires.
            return LeaseState::Held(holder);
        };
        let Some(acquired) = spec.acquire_time.as_ref().map(|t| t.0) else {
            // Not written by this protocol either.
            return LeaseState::Held(holder);
        };
        let pods: Api<Pod> = Api::namespaced(self.pods_client.clone(), namespace);
        let pod = match timed(pods.get_opt(pod)).await {
            Ok(pod) => pod,
            // Cannot tell: treat as held (never over-commit).
            Err(_) => return LeaseState::Held(holder),
        };
        let Some(pod) = pod.filter(|p| p.metadata.uid.as_deref() == Some(uid)) else {
            return LeaseState::Free;
        };
        match phase_of_bind(&pod, acquired) {
            Some(tessera_model::contract::annotations::bind_phase::ALLOCATING) => {
                LeaseState::Held(holder)
            }
            Some(_) => LeaseState::Free,
            None if unchanged < BIND_GRACE => LeaseState::Held(holder),
            None => LeaseState::Free,
        }
    }
}

/// The pod's `bind-phase` if it was written for the bind that took the lock
/// at `acquired`: the shared rule [`tessera_model::sched::bind::phase_of_bind`].
pub fn phase_of_bind(pod: &Pod, acquired: Timestamp) -> Option<&str> {
    tessera_model::sched::bind::phase_of_bind(pod.metadata.annotations.as_ref()?, &acquired)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn lease_seconds() -> i32 {
    i32::try_from(cluster::BIND_LEASE_SECONDS).unwrap_or(i32::MAX)
}

fn held_spec(holder: &str) -> LeaseSpec {
    let now = MicroTime(Timestamp::now());
    LeaseSpec {
        holder_identity: Some(holder.to_string()),
        lease_duration_seconds: Some(lease_seconds()),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        ..Default::default()
    }
}

fn free_spec() -> LeaseSpec {
    LeaseSpec {
        lease_duration_seconds: Some(lease_seconds()),
        ..Default::default()
    }
}

fn holder_in(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

/// An API call that failed or took longer than [`API_TIMEOUT`].
#[derive(Debug)]
pub enum TimedError {
    /// The API answered with an error.
    Api(kube::Error),
    /// No answer in time.
    Timeout,
}

impl std::fmt::Display for TimedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimedError::Api(e) => write!(f, "{e}"),
            TimedError::Timeout => write!(f, "no answer from the API server in {API_TIMEOUT:?}"),
        }
    }
}

impl From<TimedError> for String {
    fn from(e: TimedError) -> String {
        e.to_string()
    }
}

/// Runs an API call with [`API_TIMEOUT`].
pub async fn timed<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, TimedError> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(TimedError::Api(e)),
        Err(_) => Err(TimedError::Timeout),
    }
}
