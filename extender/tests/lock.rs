//! The per-node bind lock against the stand-in API server: compare-and-swap,
//! waiting, expiry and the stale-holder rules, all judged on this process's
//! clock, never on the writer's timestamps.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{bind_lease, holder, lease_holder};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_extender::lock::{BIND_GRACE, BindLocks, LockError};

const NS: &str = "kube-system";

async fn pod_with_phase(client: &kube::Client, name: &str, phase: Option<&str>) -> Pod {
    let mut pod = common::plain_pod(name);
    if let Some(phase) = phase {
        pod.metadata.annotations = Some(BTreeMap::from([(
            "tessera.io/bind-phase".to_string(),
            phase.to_string(),
        )]));
    }
    common::put_pod(client, &pod).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_lock_makes_others_wait_then_fail_and_release_frees_it() {
    let Some((_server, client)) = common::api().await else {
        return;
    };
    let a = pod_with_phase(&client, "a", Some("allocating")).await;
    let b = pod_with_phase(&client, "b", None).await;
    let locks = BindLocks::new(client.clone(), NS, Duration::from_millis(600));
    let held_a = locks
        .acquire("n1", &holder(&a))
        .await
        .expect("free lock taken");
    assert_eq!(lease_holder(&client, "n1").await, Some(holder(&a)));
    let started = std::time::Instant::now();
    match locks.acquire("n1", &holder(&b)).await {
        Err(LockError::Busy { holder: busy, .. }) => assert_eq!(busy, holder(&a)),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "it waited the lock-wait"
    );
    // A second taker under the very same holder string (a second bind of
    // the same pod) waits too: the lock is not "already its own".
    assert!(matches!(
        locks.acquire("n1", &holder(&a)).await,
        Err(LockError::Busy { .. })
    ));
    // Another node is independent.
    locks
        .acquire("n2", &holder(&b))
        .await
        .expect("other node free");
    locks.release(&held_a).await.expect("released");
    assert_eq!(lease_holder(&client, "n1").await, None);
    let held_b = locks
        .acquire("n1", &holder(&b))
        .await
        .expect("taken after release");
    assert_eq!(lease_holder(&client, "n1").await, Some(holder(&b)));
    // A release by a taker who no longer holds it changes nothing.
    locks.release(&held_a).await.expect("no-op release");
    assert_eq!(lease_holder(&client, "n1").await, Some(holder(&b)));
    locks.release(&held_b).await.expect("released");
    assert_eq!(lease_holder(&client, "n1").await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_whose_pod_is_gone_or_done_is_free() {
    let Some((_server, client)) = common::api().await else {
        return;
    };
    let locks = BindLocks::new(client.clone(), NS, Duration::from_millis(300));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let next = pod_with_phase(&client, "next", None).await;

    // Holder pod deleted.
    let gone = pod_with_phase(&client, "gone", Some("allocating")).await;
    locks.acquire("n1", &holder(&gone)).await.expect("taken");
    pods.delete("gone", &Default::default())
        .await
        .expect("deleted");
    locks
        .acquire("n1", &holder(&next))
        .await
        .expect("a gone holder frees the lock");

    // Holder pod finished allocating (the device plugin set success / failed).
    for (node, phase) in [("n2", "success"), ("n3", "failed")] {
        let done = pod_with_phase(&client, &format!("done-{node}"), Some("allocating")).await;
        locks.acquire(node, &holder(&done)).await.expect("taken");
        let patch = json!({"metadata": {"annotations": {
            "tessera.io/bind-phase": phase,
            "tessera.io/bind-time": Timestamp::now().to_string(),
        }}});
        pods.patch(
            done.metadata.name.as_deref().unwrap_or(""),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("patched");
        locks
            .acquire(node, &holder(&next))
            .await
            .unwrap_or_else(|e| panic!("{phase}: {e}"));
    }

    // A fresh lock whose pod shows no phase yet is a bind in progress: held.
    let starting = pod_with_phase(&client, "starting", None).await;
    locks
        .acquire("n4", &holder(&starting))
        .await
        .expect("taken");
    assert!(matches!(
        locks.acquire("n4", &holder(&next)).await,
        Err(LockError::Busy { .. })
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_lock_is_free_and_a_sweep_clears_finished_ones() {
    let Some((_server, client)) = common::api().await else {
        return;
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let holding = pod_with_phase(&client, "holding", Some("allocating")).await;
    let next = pod_with_phase(&client, "next", None).await;
    // Written (by another replica's clock) 301 s ago with a 300 s duration:
    // that clock may be skewed, so this process does not call it expired
    // before it has seen it unchanged for 300 s itself.
    let old = MicroTime(Timestamp::now() - SignedDuration::from_secs(301));
    leases
        .create(
            &PostParams::default(),
            &bind_lease("n1", &holder(&holding), 300, old),
        )
        .await
        .expect("lease");
    let locks = BindLocks::new(client.clone(), NS, Duration::from_millis(300));
    assert!(matches!(
        locks.acquire("n1", &holder(&next)).await,
        Err(LockError::Busy { .. })
    ));
    // A lease of 1 s, stamped now: expired once this process has seen it
    // unchanged for 1 s, although its pod still allocates.
    leases
        .create(
            &PostParams::default(),
            &bind_lease("n0", &holder(&holding), 1, MicroTime(Timestamp::now())),
        )
        .await
        .expect("lease");
    let patient = BindLocks::new(client.clone(), NS, Duration::from_secs(5));
    let started = std::time::Instant::now();
    patient
        .acquire("n0", &holder(&next))
        .await
        .expect("an expired lock is free");
    assert!(started.elapsed() >= Duration::from_secs(1));

    // The sweep clears a lock whose pod left allocating, and leaves a live one.
    let done = pod_with_phase(&client, "done", Some("allocating")).await;
    locks.acquire("n2", &holder(&done)).await.expect("taken");
    let live = pod_with_phase(&client, "live", Some("allocating")).await;
    locks.acquire("n3", &holder(&live)).await.expect("taken");
    let patch = json!({"metadata": {"annotations": {
        "tessera.io/bind-phase": "success",
        "tessera.io/bind-time": Timestamp::now().to_string(),
    }}});
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch("done", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patched");
    assert_eq!(locks.sweep().await.expect("sweep"), 1);
    assert_eq!(lease_holder(&client, "n2").await, None);
    assert_eq!(lease_holder(&client, "n3").await, Some(holder(&live)));
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_takers_never_both_hold_the_lock() {
    let Some((_server, client)) = common::api().await else {
        return;
    };
    let mut holders = Vec::new();
    for i in 0..8 {
        holders.push(holder(
            &pod_with_phase(&client, &format!("p{i}"), None).await,
        ));
    }
    let locks = BindLocks::new(client.clone(), NS, Duration::from_millis(500));
    let tasks: Vec<_> = holders
        .iter()
        .cloned()
        .map(|h| {
            let locks = locks.clone();
            tokio::spawn(async move { (h.clone(), locks.acquire("n1", &h).await) })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (h, outcome) = task.await.expect("task");
        match outcome {
            Ok(_) => winners.push(h),
            Err(LockError::Busy { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one taker holds it: {winners:?}");
    assert_eq!(lease_holder(&client, "n1").await, Some(winners[0].clone()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_phase_from_an_earlier_bind_does_not_free_the_lock() {
    let Some((_server, client)) = common::api().await else {
        return;
    };
    let locks = BindLocks::new(client.clone(), NS, Duration::from_millis(500));
    let next = pod_with_phase(&client, "next", None).await;
    // A pod re-created from saved YAML: success and failed from a bind long
    // ago, before this lock was taken.
    for (node, phase) in [("n1", "success"), ("n2", "failed"), ("n3", "allocating")] {
        let mut pod = common::plain_pod(&format!("copied-{node}"));
        pod.metadata.annotations = Some(BTreeMap::from([
            ("tessera.io/bind-phase".to_string(), phase.to_string()),
            (
                "tessera.io/bind-time".to_string(),
                "2026-01-01T00:00:00Z".to_string(),
            ),
        ]));
        let copied = common::put_pod(&client, &pod).await;
        locks.acquire(node, &holder(&copied)).await.expect("taken");
        match locks.acquire(node, &holder(&next)).await {
            Err(LockError::Busy { holder: busy, .. }) => assert_eq!(busy, holder(&copied)),
            other => panic!("{phase}: expected Busy, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_after_a_takeover_fails_and_the_taker_cannot_release_it() {
    let Some((_server, client)) = common::api().await else {
        return;
    };
    let a = pod_with_phase(&client, "a", None).await;
    let b = pod_with_phase(&client, "b", None).await;
    let locks = BindLocks::new(client.clone(), NS, Duration::from_millis(300));
    let mut held_a = locks.acquire("n1", &holder(&a)).await.expect("taken");
    locks.renew(&mut held_a).await.expect("renewed while held");
    locks.confirm(&held_a).await.expect("still held");
    // Someone else writes the lease (a takeover by another replica).
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let mut current = leases.get("tessera-bind.n1").await.expect("lease");
    if let Some(spec) = current.spec.as_mut() {
        spec.holder_identity = Some(holder(&b));
    }
    leases
        .replace("tessera-bind.n1", &PostParams::default(), &current)
        .await
        .expect("taken over");
    assert!(matches!(
        locks.confirm(&held_a).await,
        Err(LockError::Lost { .. })
    ));
    assert!(matches!(
        locks.renew(&mut held_a).await,
        Err(LockError::Lost { .. })
    ));
    locks.release(&held_a).await.expect("no-op release");
    assert_eq!(lease_holder(&client, "n1").await, Some(holder(&b)));
}

#[tokio::test(flavor = "multi_thread")]
async fn no_phase_is_a_bind_in_progress_until_the_lease_sat_unchanged_for_the_grace() {
    let Some((_server, client)) = common::api().await else {
        return;
    };
    let starting = pod_with_phase(&client, "starting", None).await;
    let next = pod_with_phase(&client, "next", None).await;
    // Stamped an hour ago by the taker's clock: no matter, the grace counts
    // from when this process saw the lease.
    let long_ago = MicroTime(Timestamp::now() - SignedDuration::from_secs(3600));
    Api::<Lease>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &bind_lease("n1", &holder(&starting), 300, long_ago),
        )
        .await
        .expect("lease");
    let locks = BindLocks::new(client.clone(), NS, BIND_GRACE + Duration::from_secs(5));
    let started = std::time::Instant::now();
    locks
        .acquire("n1", &holder(&next))
        .await
        .expect("free once unchanged for the grace with no phase");
    let waited = started.elapsed();
    assert!(
        waited >= BIND_GRACE && waited < BIND_GRACE + Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(lease_holder(&client, "n1").await, Some(holder(&next)));
}
