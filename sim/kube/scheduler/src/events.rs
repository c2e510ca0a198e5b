//! core/v1 Events about pods, as kube-scheduler's event recorder writes
//! them: a repeat of the same event (same pod, type, reason and message)
//! raises the first one's `count` and `lastTimestamp` instead of adding
//! another.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// kube-scheduler's limit on an event message.
pub const MAX_MESSAGE_LEN: usize = 1024;

/// How many distinct events are remembered for aggregation.
const CACHE_LIMIT: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    uid: String,
    type_: String,
    reason: String,
    message: String,
}

#[derive(Clone, Debug)]
struct Seen {
    name: String,
    count: i32,
}

/// Writes Events for one scheduler profile.
pub struct Recorder {
    client: kube::Client,
    component: String,
    instance: String,
    seen: HashMap<Key, Seen>,
}

/// Cuts a message to kube-scheduler's event limit.
pub fn truncate_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_LEN {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_LEN - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

impl Recorder {
    /// A recorder whose events name `component` (the profile's scheduler
    /// name) as source and reporting component.
    pub fn new(client: kube::Client, component: &str) -> Recorder {
        Recorder {
            client,
            component: component.to_owned(),
            instance: format!("{component}-{}", hostname()),
            seen: HashMap::new(),
        }
    }

    /// Records an event about `pod` (`type_` Normal or Warning); failures
    /// are logged, never fatal.
    pub async fn record(
        &mut self,
        pod: &Pod,
        type_: &str,
        reason: &str,
        action: &str,
        message: &str,
    ) {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let message = truncate_message(message);
        let key = Key {
            namespace: namespace.clone(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            type_: type_.to_owned(),
            reason: reason.to_owned(),
            message: message.clone(),
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let now = Time(Timestamp::now());
        if let Some(seen) = self.seen.get(&key).cloned() {
            let count = seen.count.saturating_add(1);
            let patch = serde_json::json!({"count": count, "lastTimestamp": now});
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.seen.insert(key, Seen { count, ..seen });
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    // Deleted meanwhile (events expire): start a new one.
                }
                Err(e) => {
                    tracing::warn!(event = %seen.name, "updating event: {e}");
                    return;
                }
            }
        }
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let nanos = now.0.as_nanosecond();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{pod_name}.{nanos:x}")),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod_name),
                namespace: Some(namespace),
                uid: pod.metadata.uid.clone(),
                resource_version: pod.metadata.resource_version.clone(),
                ..Default::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message),
            type_: Some(type_.to_owned()),
            action: Some(action.to_owned()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.instance.clone()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => {
                if self.seen.len() >= CACHE_LIMIT {
                    self.seen.clear();
                }
                let name = created
                    .metadata
                    .name
                    .or(event.metadata.name)
                    .unwrap_or_default();
                self.seen.insert(key, Seen { name, count: 1 });
            }
            Err(e) => tracing::warn!(reason, "creating event: {e}"),
        }
    }

    /// Forgets the events of a pod that is gone.
    pub fn forget(&mut self, uid: &str) {
        self.seen.retain(|k, _| k.uid != uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut() {
        assert_eq!(truncate_message("short"), "short");
        let long = "é".repeat(1000);
        let cut = truncate_message(&long);
        assert!(cut.len() <= MAX_MESSAGE_LEN, "{}", cut.len());
        assert!(cut.ends_with("..."));
    }
}
