//! The bind-phase rule shared by the extender (judging its bind lock) and the
//! device plugin (finding the pod it serves): a pod's
//! `tessera.io/bind-phase` counts for a bind only when its
//! `tessera.io/bind-time` is no earlier than the bind lock's `acquireTime`
//! (both written on the lock holder's clock). A phase without such a time is
//! left from something else (an earlier bind, a pod re-created from saved
//! YAML) and counts as none.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::contract::annotations::{BIND_PHASE, BIND_TIME};

/// The pod's bind phase if it was written for the bind that took the lock at
/// `acquired`. Generic over the timestamp type (anything that parses from the
/// RFC 3339 `bind-time` and orders), so the model stays free of a time crate.
pub fn phase_of_bind<'a, T: FromStr + PartialOrd>(
    annotations: &'a BTreeMap<String, String>,
    acquired: &T,
) -> Option<&'a str> {
    let phase = annotations.get(BIND_PHASE)?;
    let time: T = annotations.get(BIND_TIME)?.parse().ok()?;
    (time >= *acquired).then_some(phase.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::annotations::bind_phase;

    // Integers stand in for timestamps: the rule only parses and orders.
    fn annotations(phase: Option<&str>, time: Option<&str>) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        if let Some(phase) = phase {
            map.insert(BIND_PHASE.to_owned(), phase.to_owned());
        }
        if let Some(time) = time {
            map.insert(BIND_TIME.to_owned(), time.to_owned());
        }
        map
    }

    #[test]
    fn a_phase_counts_only_with_a_bind_time_no_earlier_than_the_lock() {
        let a = annotations(Some(bind_phase::ALLOCATING), Some("10"));
        assert_eq!(phase_of_bind(&a, &10u64), Some(bind_phase::ALLOCATING));
        assert_eq!(phase_of_bind(&a, &9u64), Some(bind_phase::ALLOCATING));
        assert_eq!(phase_of_bind(&a, &11u64), None, "left from an earlier bind");
        let untimed = annotations(Some(bind_phase::SUCCESS), None);
        assert_eq!(phase_of_bind(&untimed, &0u64), None);
        let garbled = annotations(Some(bind_phase::FAILED), Some("yesterday"));
        assert_eq!(phase_of_bind(&garbled, &0u64), None);
        let none = annotations(None, Some("10"));
        assert_eq!(phase_of_bind(&none, &0u64), None);
    }
}
