//! Crash points for the crash tests: [`hit`] kills the plugin (SIGKILL, no
//! cleanup, no unwinding) when `TESSERA_PLUGIN_CRASH_AT` names the point, so a
//! test can stop it at every step of Allocate and reclaim and check that the
//! restarted plugin leaks nothing.

use std::sync::OnceLock;

/// The environment variable naming the point to crash at.
pub const ENV: &str = "TESSERA_PLUGIN_CRASH_AT";

/// Allocate: the intent (record + instance without ids) is in the checkpoint.
pub const ALLOCATE_AFTER_INTENT: &str = "allocate:after-intent";
/// Allocate: the GPU instance exists, its id not yet in the checkpoint.
pub const ALLOCATE_AFTER_GI: &str = "allocate:after-gi";
/// Allocate: the compute instance exists, its id not yet in the checkpoint.
pub const ALLOCATE_AFTER_CI: &str = "allocate:after-ci";
/// Allocate: the realized fields are in the pod's allocation annotation.
pub const ALLOCATE_AFTER_ANNOTATION: &str = "allocate:after-annotation";
/// Allocate: the files and the transient spec are written.
pub const ALLOCATE_AFTER_SPEC: &str = "allocate:after-spec";
/// Allocate: the record is ready, before `bind-phase: success` and the answer.
pub const ALLOCATE_BEFORE_SUCCESS: &str = "allocate:before-success";

/// Reclaim: the record is marked `Reclaiming`, nothing destroyed yet.
pub const RECLAIM_AFTER_MARK: &str = "reclaim:after-mark";
/// Reclaim: an instance's compute instances are destroyed, its GI not yet.
pub const RECLAIM_AFTER_CI: &str = "reclaim:after-ci";
/// Reclaim: an instance's GPU instance is destroyed.
pub const RECLAIM_AFTER_GI: &str = "reclaim:after-gi";
/// Reclaim: the transient spec is deleted, the allocation's directory not yet.
pub const RECLAIM_AFTER_SPEC: &str = "reclaim:after-spec";

/// Every crash point, in the order a run passes them.
pub const POINTS: &[&str] = &[
    ALLOCATE_AFTER_INTENT,
    ALLOCATE_AFTER_GI,
    ALLOCATE_AFTER_CI,
    ALLOCATE_AFTER_ANNOTATION,
    ALLOCATE_AFTER_SPEC,
    ALLOCATE_BEFORE_SUCCESS,
    RECLAIM_AFTER_MARK,
    RECLAIM_AFTER_CI,
    RECLAIM_AFTER_GI,
    RECLAIM_AFTER_SPEC,
];

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Kills the process with SIGKILL when `TESSERA_PLUGIN_CRASH_AT` equals
/// `name`; otherwise nothing (the variable is read once).
pub fn hit(name: &str) {
    if armed() == Some(name) {
        tracing::error!(point = name, "{ENV}={name}: killing the plugin here");
        eprintln!("tessera-device-plugin: crash point {name} reached ({ENV}); SIGKILL");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_unique_and_an_unarmed_hit_returns() {
        let mut seen = std::collections::BTreeSet::new();
        for p in POINTS {
            assert!(seen.insert(*p), "duplicate point {p}");
            assert!(p.contains(':'), "{p} names no phase");
        }
        // The test process does not set the variable to any point.
        if std::env::var(ENV).is_err() {
            for p in POINTS {
                hit(p);
            }
        }
    }
}
