//! The state file shared between processes: concurrent updates, MIG rules through the store.

use std::sync::Arc;
use std::thread;

use tessera_sim::SimError;
use tessera_sim::mig;
use tessera_sim::profile::NodeProfile;
use tessera_sim::state::StateStore;

fn store_with(profile: &str) -> (tempfile::TempDir, StateStore) {
    let tmp = tempfile::tempdir().expect("make a temporary directory");
    let state = NodeProfile::load(profile)
        .and_then(|p| p.node_state(profile))
        .expect("shipped profile lays out");
    let store = StateStore::write_new(tmp.path(), &state).expect("write the state");
    (tmp, store)
}

#[test]
fn concurrent_thread_updates_are_not_lost() {
    let (tmp, _) = store_with("bench-8xh100");
    // Free one GPU instance per GPU so each thread has a slot to fill.
    let store = StateStore::open(tmp.path()).unwrap();
    store
        .update(|s| {
            for gpu in &mut s.gpus {
                mig::destroy_compute_instance(gpu, 13, 0)?;
                mig::destroy_gpu_instance(gpu, 13)?;
            }
            Ok(())
        })
        .unwrap();
    let root = Arc::new(tmp.path().to_path_buf());
    let handles: Vec<_> = (0..8u32)
        .map(|g| {
            let root = Arc::clone(&root);
            thread::spawn(move || {
                // Each thread opens its own store: its own lock file descriptor.
                let store = StateStore::open(&root).unwrap();
                store
                    .update(|s| {
                        let gi = mig::create_gpu_instance(s.gpu_mut(g).unwrap(), 19, 6)?;
                        mig::create_compute_instance(s, g, gi)
                    })
                    .unwrap();
                for _ in 0..10 {
                    store
                        .update(|s| {
                            s.serial += 1;
                            Ok(())
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = store.read().unwrap();
    for gpu in &s.gpus {
        assert_eq!(
            gpu.gpu_instances.len(),
            7,
            "GPU {} lost its new instance",
            gpu.index
        );
        assert_eq!(mig::mig_devices(gpu).len(), 7);
    }
    // 56 MIG devices at build + 8 new ones, + 80 plain increments.
    assert_eq!(s.serial, 56 + 8 + 80);
}

const CHILD_ENV: &str = "TESSERA_SIM_TEST_CHILD_ROOT";

/// Not a test of its own: the body the process test below runs in children
/// (with `--ignored`).
#[test]
#[ignore = "run as a child process by concurrent_process_updates_are_not_lost"]
fn child_process_increments() {
    let root = std::env::var_os(CHILD_ENV).expect("started by the test below, with a root");
    let store = StateStore::open(std::path::Path::new(&root)).unwrap();
    for _ in 0..25 {
        store
            .update(|s| {
                s.serial += 1;
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn concurrent_process_updates_are_not_lost() {
    let (tmp, store) = store_with("h100-80gb");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "child_process_increments",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, tmp.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child process failed");
    }
    assert_eq!(store.read().unwrap().serial, 100);
}

#[test]
fn mig_rules_apply_through_the_store() {
    let (_tmp, store) = store_with("a100-40gb");
    // 3g.20gb@4 (GI 1) and 2g.10gb@0 (GI 3) exist; slices 2-3 are free.
    let err = store
        .update(|s| mig::create_gpu_instance(s.gpu_mut(0).unwrap(), 9, 0))
        .unwrap_err();
    assert!(matches!(err, SimError::InsufficientResources(_)), "{err}");
    let err = store
        .update(|s| mig::create_gpu_instance(s.gpu_mut(0).unwrap(), 14, 3))
        .unwrap_err();
    assert!(matches!(err, SimError::InvalidArgument(_)), "{err}");
    let gi = store
        .update(|s| mig::create_gpu_instance(s.gpu_mut(0).unwrap(), 14, 2))
        .unwrap();
    assert_eq!(gi, 4);
    let err = store
        .update(|s| mig::destroy_gpu_instance(s.gpu_mut(0).unwrap(), 1))
        .unwrap_err();
    assert!(matches!(err, SimError::InUse(_)), "{err}");
    let s = store.read().unwrap();
    let ids: Vec<u32> = s.gpus[0].gpu_instances.iter().map(|gi| gi.id).collect();
    assert_eq!(ids, [1, 3, 4]);
}
