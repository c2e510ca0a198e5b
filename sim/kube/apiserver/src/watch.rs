//! Watch streams: newline-delimited JSON events, one task per watch reading
//! the store's change log from its own position. Writers never wait for a
//! watcher: one that falls behind the kept window gets a 410 ERROR event
//! and its stream ends, as the real server does (clients relist); one that
//! stops reading altogether is dropped after [`STALL_TIMEOUT`].

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::resources::Resource;
use crate::selectors::Selectors;
use crate::status::ApiError;
use crate::store::{Change, ChangeKind, Object, Store, index_of};
use crate::table;

/// What one watch request asked for.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// The resource watched.
    pub resource: &'static Resource,
    /// Only this namespace (`None`: all, or a cluster-scoped resource).
    pub namespace: Option<String>,
    /// `labelSelector` and `fieldSelector`.
    pub selectors: Selectors,
    /// Changes after this resourceVersion (`None`: from now).
    pub resource_version: Option<u64>,
    /// Synthetic ADDED events for the current objects first.
    pub initial_events: bool,
    /// A BOOKMARK marked `k8s.io/initial-events-end` after the initial events.
    pub initial_events_end: bool,
    /// Periodic BOOKMARK events (`allowWatchBookmarks`).
    pub bookmarks: bool,
    /// Seconds between bookmarks.
    pub bookmark_interval: Duration,
    /// End the stream after this long (`timeoutSeconds`).
    pub timeout: Option<Duration>,
    /// End the stream when the client has not taken an event for this long
    /// (it stopped reading: its buffers are full).
    pub stall_timeout: Duration,
    /// Send each object as a one-row `meta.k8s.io/v1` Table (the request's
    /// Accept asked for one), its rows carrying what `includeObject` names
    /// (`None`, `Metadata`, `Object`); `None` here: plain objects.
    pub table: Option<String>,
}

/// One `{"type": ..., "object": ...}` line from already-encoded object bytes.
pub fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut line = BytesMut::with_capacity(object.len() + 32);
    line.put_slice(b"{\"type\":\"");
    line.put_slice(kind.as_bytes());
    line.put_slice(b"\",\"object\":");
    line.put_slice(object);
    line.put_slice(b"}\n");
    line.freeze()
}

/// The event line for `object` as this watch sends objects: as stored, or
/// as a one-row Table (BOOKMARK and ERROR objects are never Tables).
fn object_line(request: &WatchRequest, kind: &str, object: &Object) -> Bytes {
    match &request.table {
        None => event_line(kind, &object.bytes),
        Some(include) => {
            let t = table::to_table(
                request.resource,
                std::slice::from_ref(&object.value),
                include,
                json!({"resourceVersion": object.rv.to_string()}),
            );
            event_line(kind, t.to_string().as_bytes())
        }
    }
}

fn bookmark_line(resource: &Resource, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object =
        json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata});
    event_line("BOOKMARK", object.to_string().as_bytes())
}

/// The 410 ERROR event a watch gets when it starts (or falls) before the window.
pub fn error_line(error: &ApiError) -> Bytes {
    event_line("ERROR", error.to_status().to_string().as_bytes())
}

/// The event a watcher with these filters sees for a change, if any: a change
/// that makes an object leave the selection is DELETED, one that makes it
/// enter is ADDED.
pub fn filter_change(
    change: &Change,
    resource: usize,
    namespace: Option<&str>,
    selectors: &Selectors,
) -> Option<&'static str> {
    if change.resource != resource {
        return None;
    }
    if let Some(ns) = namespace
        && change
            .object
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            != Some(ns)
    {
        return None;
    }
    let now = selectors.matches(&change.object.value);
    match change.kind {
        ChangeKind::Added => now.then_some("ADDED"),
        ChangeKind::Deleted => now.then_some("DELETED"),
        ChangeKind::Modified => {
            let before = change
                .previous
                .as_ref()
                .is_some_and(|p| selectors.matches(&p.value));
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }
}

/// How long a watch waits for a client that stopped reading before it
/// ends the watch.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where one watch's lines go, and what ends it while it waits to send.
struct Sink {
    tx: mpsc::Sender<Bytes>,
    shutdown: watch::Receiver<bool>,
    deadline: Option<tokio::time::Instant>,
    stall_timeout: Duration,
}

/// Sleeps until `deadline`, forever when there is none.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Sink {
    /// Sends one line unless the server stops, the watch times out or the
    /// client stays blocked for the stall timeout first (a client that does
    /// not read must not hold a watch task forever); `false` when the watch
    /// should end.
    async fn deliver(&mut self, line: Bytes) -> bool {
        if *self.shutdown.borrow() {
            return false;
        }
        tokio::select! {
            sent = self.tx.send(line) => sent.is_ok(),
            _ = self.shutdown.changed() => false,
            () = until(self.deadline) => false,
            () = tokio::time::sleep(self.stall_timeout) => {
                tracing::info!("watch: the client took no event for {:?}; closing the watch", self.stall_timeout);
                false
            }
        }
    }
}

/// Starts the task behind one watch; its events arrive on the receiver,
/// which ends when the watch does (timeout, 410, shutdown, client gone).
pub fn start(
    store: Arc<Store>,
    request: WatchRequest,
    shutdown: watch::Receiver<bool>,
) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    // A timeout too large to represent is no timeout; 0 never gets here
    // (the REST layer reads it as "the server's default": none).
    let deadline = request
        .timeout
        .and_then(|t| tokio::time::Instant::now().checked_add(t));
    let mut sink = Sink {
        tx,
        shutdown,
        deadline,
        stall_timeout: request.stall_timeout,
    };
    tokio::spawn(async move {
        let resource = index_of(request.resource);
        let namespace = request.namespace.as_deref();
        let mut changes = store.subscribe();
        changes.borrow_and_update();
        let mut position = match request.resource_version {
            Some(rv) => rv,
            None => store.current_rv(),
        };
        if request.initial_events {
            let (rv, objects) =
                store.snapshot_matching(request.resource, namespace, &request.selectors);
            for object in objects {
                if !sink.deliver(object_line(&request, "ADDED", &object)).await {
                    return;
                }
            }
            // Changes between `position` and `rv` are already in the snapshot.
            position = position.max(rv);
            if request.initial_events_end
                && !sink
                    .deliver(bookmark_line(request.resource, position, true))
                    .await
            {
                return;
            }
        }
        let mut ticker =
            tokio::time::interval(request.bookmark_interval.max(Duration::from_millis(10)));
        ticker.tick().await;
        loop {
            changes.borrow_and_update();
            match store.changes_since(position) {
                Err(e) => {
                    tracing::info!(
                        resource = request.resource.plural,
                        "watch from resourceVersion {position}: {}",
                        e.message
                    );
                    let _ = sink.deliver(error_line(&e)).await;
                    return;
                }
                Ok(list) => {
                    for change in list {
                        position = change.rv;
                        if let Some(kind) =
                            filter_change(&change, resource, namespace, &request.selectors)
                            && !sink
                                .deliver(object_line(&request, kind, &change.object))
                                .await
                        {
                            return;
                        }
                    }
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = ticker.tick(), if request.bookmarks => {
                    if !sink.deliver(bookmark_line(request.resource, position, false)).await {
                        return;
                    }
                }
                () = until(deadline) => return,
                _ = sink.shutdown.changed() => return,
                () = sink.tx.closed() => return,
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::RESOURCES;
    use crate::selectors::LabelSelector;
    use crate::store::DeleteOpts;
    use crate::types;

    fn configmaps() -> &'static Resource {
        RESOURCES
            .iter()
            .find(|r| r.plural == "configmaps")
            .expect("configmaps")
    }

    fn cm(name: &str, app: &str) -> Value {
        types::normalize(
            configmaps(),
            json!({"metadata": {"name": name, "labels": {"app": app}}}),
        )
        .expect("cm")
    }

    fn request(rv: Option<u64>, labels: &str) -> WatchRequest {
        WatchRequest {
            resource: configmaps(),
            namespace: Some("default".into()),
            selectors: Selectors {
                labels: LabelSelector::parse(labels).expect("parses"),
                ..Selectors::default()
            },
            resource_version: rv,
            initial_events: rv.is_none(),
            initial_events_end: false,
            bookmarks: false,
            bookmark_interval: Duration::from_secs(60),
            timeout: Some(Duration::from_millis(300)),
            stall_timeout: STALL_TIMEOUT,
            table: None,
        }
    }

    async fn collect(mut rx: mpsc::Receiver<Bytes>) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        while let Some(line) = rx.recv().await {
            let v: Value = serde_json::from_slice(&line).expect("event is JSON");
            out.push((
                v["type"].as_str().unwrap_or("").to_owned(),
                v["object"].clone(),
            ));
        }
        out
    }

    #[tokio::test]
    async fn selector_transitions_become_added_and_deleted() {
        let store = Arc::new(Store::with_default_namespaces(100));
        let (_stop, shutdown) = watch::channel(false);
        let start = store.current_rv();
        let rx = start_watch(&store, request(Some(start), "app=web"), shutdown);
        add_cm(&store, "a", "web");
        add_cm(&store, "b", "db");
        let relabel = |name: &str, app: &str| {
            store
                .patch(
                    configmaps(),
                    Some("default"),
                    name,
                    crate::patch::PatchType::Merge,
                    format!(r#"{{"metadata":{{"labels":{{"app":"{app}"}}}}}}"#).as_bytes(),
                    false,
                )
                .expect("patched");
        };
        relabel("a", "db");
        relabel("b", "web");
        store
            .delete(configmaps(), Some("default"), "b", &DeleteOpts::default())
            .expect("deleted");
        let events = collect(rx).await;
        let seen: Vec<(&str, &str)> = events
            .iter()
            .map(|(t, o)| (t.as_str(), o["metadata"]["name"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(
            seen,
            [
                ("ADDED", "a"),
                ("DELETED", "a"),
                ("ADDED", "b"),
                ("DELETED", "b")
            ]
        );
    }

    fn start_watch(
        store: &Arc<Store>,
        request: WatchRequest,
        shutdown: watch::Receiver<bool>,
    ) -> mpsc::Receiver<Bytes> {
        start(store.clone(), request, shutdown)
    }

    #[tokio::test]
    async fn initial_events_then_changes_and_end_bookmark() {
        let store = Arc::new(Store::with_default_namespaces(100));
        add_cm(&store, "old", "x");
        let (_stop, shutdown) = watch::channel(false);
        let mut req = request(None, "");
        req.initial_events_end = true;
        let rx = start_watch(&store, req, shutdown);
        tokio::time::sleep(Duration::from_millis(50)).await;
        add_cm(&store, "new", "x");
        let events = collect(rx).await;
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0].0, "ADDED");
        assert_eq!(events[0].1["metadata"]["name"], "old");
        assert_eq!(events[1].0, "BOOKMARK");
        assert_eq!(
            events[1].1["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        assert_eq!(events[2].1["metadata"]["name"], "new");
    }

    #[tokio::test]
    async fn a_table_watch_sends_one_row_tables_but_plain_bookmarks() {
        let store = Arc::new(Store::with_default_namespaces(100));
        add_cm(&store, "old", "x");
        let (_stop, shutdown) = watch::channel(false);
        let mut req = request(None, "");
        req.table = Some("Object".into());
        req.bookmarks = true;
        req.bookmark_interval = Duration::from_millis(100);
        let rx = start_watch(&store, req, shutdown);
        tokio::time::sleep(Duration::from_millis(30)).await;
        store
            .delete(configmaps(), Some("default"), "old", &DeleteOpts::default())
            .expect("deleted");
        let events = collect(rx).await;
        let kinds: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(kinds[..2], ["ADDED", "DELETED"], "{kinds:?}");
        for (kind, object) in &events {
            if kind == "BOOKMARK" {
                assert_eq!(object["kind"], "ConfigMap");
                continue;
            }
            assert_eq!(object["kind"], "Table", "{object}");
            assert_eq!(object["apiVersion"], "meta.k8s.io/v1");
            let rows = object["rows"].as_array().expect("rows");
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0]["object"]["metadata"]["name"], "old");
            assert_eq!(rows[0]["cells"][0], "old", "the NAME cell");
            assert_eq!(
                object["metadata"]["resourceVersion"],
                rows[0]["object"]["metadata"]["resourceVersion"]
            );
        }
        assert!(kinds.contains(&"BOOKMARK"), "{kinds:?}");
    }

    #[tokio::test]
    async fn too_old_version_gets_one_410_error_event() {
        let store = Arc::new(Store::with_default_namespaces(2));
        for i in 0..4 {
            add_cm(&store, &format!("c{i}"), "x");
        }
        let (_stop, shutdown) = watch::channel(false);
        let events = collect(start_watch(&store, request(Some(1), ""), shutdown)).await;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].0, "ERROR");
        assert_eq!(events[0].1["code"], 410);
        assert_eq!(events[0].1["reason"], "Expired");
    }

    #[tokio::test]
    async fn bookmarks_carry_the_current_version() {
        let store = Arc::new(Store::with_default_namespaces(100));
        let (_stop, shutdown) = watch::channel(false);
        let mut req = request(Some(store.current_rv()), "");
        req.bookmarks = true;
        req.bookmark_interval = Duration::from_millis(50);
        add_cm(&store, "a", "x");
        let rv = store.current_rv().to_string();
        let events = collect(start_watch(&store, req, shutdown)).await;
        let bookmark = events
            .iter()
            .find(|(t, _)| t == "BOOKMARK")
            .expect("a bookmark");
        assert_eq!(bookmark.1["metadata"]["resourceVersion"], rv.as_str());
        assert_eq!(bookmark.1["kind"], "ConfigMap");
    }

    #[tokio::test]
    async fn a_watcher_left_behind_gets_410_and_writers_never_wait() {
        let store = Arc::new(Store::with_default_namespaces(5));
        let (_stop, shutdown) = watch::channel(false);
        let rx = start_watch(&store, request(Some(store.current_rv()), ""), shutdown);
        // The watch task cannot run until this test yields: these writes
        // complete without it and push its position out of the window.
        for i in 0..20 {
            add_cm(&store, &format!("c{i}"), "x");
        }
        let events = collect(rx).await;
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, "ERROR");
        assert_eq!(events[0].1["code"], 410);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_watchers_each_see_every_change_in_order() {
        let store = Arc::new(Store::with_default_namespaces(10_000));
        let (_stop, shutdown) = watch::channel(false);
        let start_rv = store.current_rv();
        let mut req = request(Some(start_rv), "");
        req.timeout = Some(Duration::from_secs(3));
        let watchers: Vec<_> = (0..100)
            .map(|_| tokio::spawn(collect(start_watch(&store, req.clone(), shutdown.clone()))))
            .collect();
        let writer = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                for i in 0..200 {
                    add_cm(&store, &format!("c{i}"), "x");
                }
            })
        };
        writer.await.expect("writer");
        for w in watchers {
            let events = w.await.expect("watcher");
            let rvs: Vec<u64> = events
                .iter()
                .map(|(t, o)| {
                    assert_eq!(t, "ADDED");
                    o["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|r| r.parse().ok())
                        .unwrap_or(0)
                })
                .collect();
            let want: Vec<u64> = (start_rv + 1..=start_rv + 200).collect();
            assert_eq!(rvs, want);
        }
    }
    /// Creates ConfigMap `name` (label `app`) in `default`.
    fn add_cm(store: &Store, name: &str, app: &str) {
        store
            .create(configmaps(), Some("default"), cm(name, app))
            .expect("created");
    }

    /// Creates `n` config maps, more than the watch channel holds.
    fn flood(store: &Store, n: usize) {
        for i in 0..n {
            add_cm(store, &format!("c{i}"), "x");
        }
    }

    /// Starts a watch (`tune`d) from now, makes 400 changes and does not
    /// read for 800 ms: the channel fills up and the task waits to send.
    /// The events delivered, once the watch has ended by itself.
    async fn events_to_a_client_not_reading(tune: impl FnOnce(&mut WatchRequest)) -> usize {
        let store = Arc::new(Store::with_default_namespaces(10_000));
        let (_stop, shutdown) = watch::channel(false);
        let mut req = request(Some(store.current_rv()), "");
        tune(&mut req);
        let rx = start_watch(&store, req, shutdown);
        flood(&store, 400);
        tokio::time::sleep(Duration::from_millis(800)).await;
        tokio::time::timeout(Duration::from_secs(5), collect(rx))
            .await
            .expect("the watch ended by itself")
            .len()
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_dropped_after_the_stall_timeout() {
        let events = events_to_a_client_not_reading(|req| {
            req.timeout = None;
            req.stall_timeout = Duration::from_millis(200);
        })
        .await;
        assert!(events < 400, "{events} events");
    }

    #[tokio::test]
    async fn the_timeout_ends_a_watch_blocked_on_a_slow_client() {
        let events = events_to_a_client_not_reading(|req| {
            req.timeout = Some(Duration::from_millis(200));
        })
        .await;
        assert!(events < 400, "{events} events");
    }

    #[tokio::test]
    async fn a_huge_timeout_is_no_timeout_rather_than_a_panic() {
        let store = Arc::new(Store::with_default_namespaces(100));
        let (stop, shutdown) = watch::channel(false);
        let mut req = request(Some(store.current_rv()), "");
        req.timeout = Some(Duration::from_secs(u64::MAX));
        let mut rx = start_watch(&store, req, shutdown);
        add_cm(&store, "a", "x");
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an event in time");
        assert!(first.is_some(), "the watch task is alive");
        stop.send_replace(true);
    }
}
