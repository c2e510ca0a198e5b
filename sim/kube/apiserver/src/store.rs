//! The object store: every object of every resource, one global
//! resourceVersion counter, and the bounded log of changes watches resume
//! from. Pure (no HTTP): the REST layer calls it with decoded values and
//! turns its [`ApiError`]s into Status responses.
//!
//! Objects are kept as `Arc<Stored>`: the JSON value plus its serialized
//! bytes, so lists and watch events are assembled from bytes without
//! re-encoding, and readers never copy objects. Writers take the lock for
//! the mutation only; watchers are woken through a `tokio::sync::watch`
//! channel carrying the newest resourceVersion and read the log themselves,
//! so a slow watcher never blocks a writer (it falls out of the window and
//! gets 410 instead).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use k8s_openapi::api::core::v1::Binding;
use serde_json::{Value, json};

use crate::admission;
use crate::patch::{self, PatchType};
use crate::resources::{RESOURCES, Resource};
use crate::selectors::Selectors;
use crate::status::ApiError;
use crate::types;

/// One stored object: its value and that value serialized.
#[derive(Debug)]
pub struct Stored {
    /// The object.
    pub value: Value,
    /// `value` as JSON bytes.
    pub bytes: Bytes,
    /// Its resourceVersion.
    pub rv: u64,
}

impl Stored {
    fn new(value: Value, rv: u64) -> Stored {
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Stored { value, bytes, rv }
    }
}

/// A shared stored object.
pub type Object = Arc<Stored>;

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Updated (including a deletion that is still pending).
    Modified,
    /// Removed.
    Deleted,
}

impl ChangeKind {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One entry of the change log.
#[derive(Debug)]
pub struct Change {
    /// The resourceVersion this change made.
    pub rv: u64,
    /// Index of the resource in [`RESOURCES`].
    pub resource: usize,
    /// What happened.
    pub kind: ChangeKind,
    /// The object after the change (for a deletion: its last state).
    pub object: Object,
    /// The object before the change (selectors need it to turn a change that
    /// leaves a watch's selection into DELETED).
    pub previous: Option<Object>,
}

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    /// The objects, in namespace/name order.
    pub items: Vec<Object>,
    /// The list's resourceVersion.
    pub rv: u64,
    /// Token for the next page, when there is one.
    pub continue_token: Option<String>,
}

/// `DeleteOptions` that matter here, merged from the body and the query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteOpts {
    /// Grace period in seconds (`None`: the object's default).
    pub grace: Option<i64>,
    /// Precondition on `metadata.uid`.
    pub uid: Option<String>,
    /// Precondition on `metadata.resourceVersion`.
    pub resource_version: Option<String>,
}

type Key = (String, String);

struct Inner {
    rv: u64,
    objects: Vec<BTreeMap<Key, Object>>,
    /// The keys of the pods on each node (`spec.nodeName`, `""` for
    /// unscheduled pods): what a kubelet's `fieldSelector=spec.nodeName=X`
    /// list or watch reads instead of every pod.
    pods_by_node: HashMap<String, BTreeSet<Key>>,
    log: VecDeque<Arc<Change>>,
    /// The oldest resourceVersion a watch may start from.
    oldest: u64,
    window: usize,
    seed: u64,
}

/// The default `--max-body-bytes`.
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The store shared by every request.
pub struct Store {
    inner: RwLock<Inner>,
    changes: tokio::sync::watch::Sender<u64>,
    /// Most bytes one JSON patch may copy or move (see [`patch::Patch::apply`]).
    patch_copy_budget: usize,
}

/// The Status of a patch that cannot be applied: malformed → 400, a JSON
/// patch operation that fails → 422 (as the real server), too big → 413.
fn patch_error(e: patch::PatchError) -> ApiError {
    match e {
        patch::PatchError::JsonPatch(_) => ApiError::unprocessable(e.to_string()),
        patch::PatchError::TooManyOperations(_) | patch::PatchError::TooLarge(_) => ApiError {
            code: 413,
            reason: "RequestEntityTooLarge",
            message: e.to_string(),
            details: None,
        },
        patch::PatchError::Malformed(_) | patch::PatchError::Strategic(_) => {
            ApiError::bad_request(e.to_string())
        }
    }
}

/// Index of a resource in [`RESOURCES`].
pub fn index_of(resource: &Resource) -> usize {
    RESOURCES.iter().position(|r| r == resource).unwrap_or(0)
}

fn pod_index() -> usize {
    RESOURCES.iter().position(|r| r.kind == "Pod").unwrap_or(0)
}

fn namespace_index() -> usize {
    RESOURCES
        .iter()
        .position(|r| r.kind == "Namespace")
        .unwrap_or(0)
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn key_of(v: &Value) -> Key {
    (
        str_at(v, "/metadata/namespace").to_owned(),
        str_at(v, "/metadata/name").to_owned(),
    )
}

fn metadata_mut(v: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    match v.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// Now, as RFC 3339 seconds (what `metav1.Time` carries).
pub fn now_rfc3339(offset_seconds: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    match k8s_openapi::jiff::Timestamp::from_second(now.saturating_add(offset_seconds)) {
        Ok(ts) => ts.to_string(),
        Err(_) => "1970-01-01T00:00:00Z".to_owned(),
    }
}

fn splitmix(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn encode_continue(rv: u64, key: &Key) -> String {
    let text = format!("{rv}\n{}\n{}", key.0, key.1);
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Option<(u64, Key)> {
    if !token.len().is_multiple_of(2) || !token.is_ascii() {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '\n');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, (parts.next()?.to_owned(), parts.next()?.to_owned())))
}

/// The objects of one resource a list or watch visits, in key order.
type Candidates<'a> = Box<dyn Iterator<Item = (&'a Key, &'a Object)> + 'a>;

/// The first `limit` items of `matching`, the key of the last one taken, and
/// whether more follow.
fn take_page<'k>(
    mut matching: impl Iterator<Item = (Cow<'k, Key>, Object)>,
    limit: usize,
) -> (Vec<Object>, Option<Key>, bool) {
    let mut items = Vec::new();
    let mut last = None;
    for (key, o) in matching.by_ref() {
        items.push(o);
        last = Some(key.into_owned());
        if items.len() == limit {
            break;
        }
    }
    let more = items.len() == limit && matching.next().is_some();
    (items, last, more)
}

impl Inner {
    /// What the objects of resource `idx` changed since `rv` were at `rv`
    /// (`None`: absent), from the change log.
    fn states_at(&self, idx: usize, rv: u64) -> BTreeMap<Key, Option<Object>> {
        let from = self.log.partition_point(|c| c.rv <= rv);
        let mut then = BTreeMap::new();
        // Newest first, so the oldest change's "before" is what stays.
        for change in self.log.range(from..).rev().filter(|c| c.resource == idx) {
            then.insert(key_of(&change.object.value), change.previous.clone());
        }
        then
    }

    /// The objects of resource `idx` from `start` on in `namespace`, as they
    /// were when `then` (see [`Inner::states_at`]) was current.
    fn candidates_then<'a>(
        &'a self,
        idx: usize,
        then: &'a BTreeMap<Key, Option<Object>>,
        namespace: Option<&'a str>,
        start: Bound<Key>,
    ) -> impl Iterator<Item = (Cow<'a, Key>, Object)> + 'a {
        let in_namespace = move |key: &Key| namespace.is_none_or(|n| n == key.0);
        let start = match (&start, namespace) {
            (Bound::Unbounded, Some(ns)) => Bound::Included((ns.to_owned(), String::new())),
            _ => start,
        };
        let mut now = self.objects[idx]
            .range((start.clone(), Bound::Unbounded))
            .take_while(move |(k, _)| in_namespace(k))
            .peekable();
        let mut changed = then
            .range((start, Bound::Unbounded))
            .take_while(move |(k, _)| in_namespace(k))
            .peekable();
        std::iter::from_fn(move || {
            loop {
                let take_changed = match (now.peek(), changed.peek()) {
                    (None, None) => return None,
                    (Some(_), None) => false,
                    (None, Some(_)) => true,
                    (Some((a, _)), Some((b, _))) => b <= a,
                };
                if take_changed {
                    let (key, state) = changed.next()?;
                    if now.peek().is_some_and(|(k, _)| *k == key) {
                        now.next();
                    }
                    if let Some(o) = state {
                        return Some((Cow::Borrowed(key), o.clone()));
                    }
                } else {
                    let (key, o) = now.next()?;
                    return Some((Cow::Borrowed(key), o.clone()));
                }
            }
        })
    }

    /// Records `object` (a pod) in the node index, or removes it.
    fn index_pod(&mut self, key: &Key, object: &Value, present: bool) {
        let node = str_at(object, "/spec/nodeName");
        if present {
            self.pods_by_node
                .entry(node.to_owned())
                .or_default()
                .insert(key.clone());
        } else if let Some(keys) = self.pods_by_node.get_mut(node) {
            keys.remove(key);
            if keys.is_empty() {
                self.pods_by_node.remove(node);
            }
        }
    }

    /// The objects of resource `idx` from `start` on, limited to
    /// `namespace`, that may match `selectors`: a pod selector pinning
    /// `spec.nodeName` reads the node index, everything else scans.
    fn candidates<'a>(
        &'a self,
        idx: usize,
        namespace: Option<&'a str>,
        start: Bound<Key>,
        selectors: &'a Selectors,
    ) -> Candidates<'a> {
        let map = &self.objects[idx];
        let in_namespace = move |key: &Key| namespace.is_none_or(|n| n == key.0);
        let start = match (&start, namespace) {
            (Bound::Unbounded, Some(ns)) => Bound::Included((ns.to_owned(), String::new())),
            _ => start,
        };
        let node = selectors.fields.equal_to("spec.nodeName");
        let matching = move |(_, o): &(&Key, &Object)| selectors.matches(&o.value);
        match node {
            Some(node) if idx == pod_index() => {
                let Some(keys) = self.pods_by_node.get(node) else {
                    return Box::new(std::iter::empty());
                };
                Box::new(
                    keys.range((start, Bound::Unbounded))
                        .take_while(move |k| in_namespace(k))
                        .filter_map(move |k| map.get_key_value(k))
                        .filter(matching),
                )
            }
            _ => Box::new(
                map.range((start, Bound::Unbounded))
                    .take_while(move |(k, _)| in_namespace(k))
                    .filter(matching),
            ),
        }
    }

    fn put(
        &mut self,
        resource: usize,
        mut value: Value,
        kind: ChangeKind,
        previous: Option<Object>,
    ) -> Object {
        self.rv += 1;
        metadata_mut(&mut value).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let object = Arc::new(Stored::new(value, self.rv));
        let key = key_of(&object.value);
        let replaced = if kind == ChangeKind::Deleted {
            self.objects[resource].remove(&key)
        } else {
            self.objects[resource].insert(key.clone(), object.clone())
        };
        if resource == pod_index() {
            if let Some(old) = replaced {
                self.index_pod(&key, &old.value, false);
            }
            if kind != ChangeKind::Deleted {
                self.index_pod(&key, &object.value, true);
            }
        }
        self.log.push_back(Arc::new(Change {
            rv: self.rv,
            resource,
            kind,
            object: object.clone(),
            previous,
        }));
        while self.log.len() > self.window {
            if let Some(dropped) = self.log.pop_front() {
                self.oldest = dropped.rv;
            }
        }
        if kind == ChangeKind::Deleted && RESOURCES[resource].namespaced {
            self.finish_namespace(&key.0);
        }
        object
    }

    /// Whether any namespaced object lives in namespace `ns`.
    fn has_children(&self, ns: &str) -> bool {
        RESOURCES
            .iter()
            .enumerate()
            .filter(|(_, r)| r.namespaced)
            .any(|(i, _)| {
                self.objects[i]
                    .range((ns.to_owned(), String::new())..)
                    .next()
                    .is_some_and(|((n, _), _)| n == ns)
            })
    }

    /// Removes namespace `ns` when it is terminating and nothing holds it
    /// any more (no objects in it, no finalizers).
    fn finish_namespace(&mut self, ns: &str) {
        let idx = namespace_index();
        let Some(namespace) = self.objects[idx]
            .get(&(String::new(), ns.to_owned()))
            .cloned()
        else {
            return;
        };
        let meta = &namespace.value["metadata"];
        let terminating = meta.get("deletionTimestamp").is_some_and(|v| !v.is_null());
        let finalized = meta
            .get("finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        if terminating && finalized && !self.has_children(ns) {
            self.put(
                idx,
                namespace.value.clone(),
                ChangeKind::Deleted,
                Some(namespace),
            );
        }
    }

    fn get(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Object, ApiError> {
        let key = (namespace.unwrap_or("").to_owned(), name.to_owned());
        self.objects[index_of(resource)]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))
    }

    /// The namespace of a create exists and is not terminating.
    fn require_namespace(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(), ApiError> {
        if !resource.namespaced {
            return Ok(());
        }
        let ns = namespace.unwrap_or("");
        match self.objects[namespace_index()].get(&(String::new(), ns.to_owned())) {
            Some(o)
                if o.value
                    .pointer("/metadata/deletionTimestamp")
                    .is_some_and(|v| !v.is_null()) =>
            {
                Err(ApiError::forbidden(format!(
                    "{} {} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    crate::status::qualified(resource),
                    Value::String(name.to_owned())
                )))
            }
            Some(_) => Ok(()),
            None => Err(ApiError::namespace_not_found(ns)),
        }
    }

    fn uid(&mut self) -> String {
        let a = splitmix(&mut self.seed);
        let b = splitmix(&mut self.seed);
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = splitmix(&mut self.seed);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
                r /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// Stores `new` as the next state of `old` (update, patch, status):
    /// a no-op when nothing changed, the removal when a pending deletion has
    /// nothing left to wait for.
    fn replace(
        &mut self,
        resource: &Resource,
        old: Object,
        mut new: Value,
    ) -> Result<Object, ApiError> {
        let idx = index_of(resource);
        let name = str_at(&old.value, "/metadata/name").to_owned();
        let errors = admission::object_errors(resource.kind, &new);
        if !errors.is_empty() {
            return Err(ApiError::invalid(resource, &name, &errors));
        }
        metadata_mut(&mut new).insert("resourceVersion".into(), json!(old.rv.to_string()));
        if new == old.value {
            return Ok(old);
        }
        let meta = &new["metadata"];
        let deleting = meta.get("deletionTimestamp").is_some_and(|v| !v.is_null());
        let no_finalizers = meta
            .get("finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        let grace_over = resource.kind != "Pod"
            || meta
                .get("deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                == 0;
        let held_by_content =
            resource.kind == "Namespace" && self.has_children(&key_of(&old.value).1);
        let kind = if deleting && no_finalizers && grace_over && !held_by_content {
            ChangeKind::Deleted
        } else {
            ChangeKind::Modified
        };
        Ok(self.put(idx, new, kind, Some(old)))
    }

    /// An update's candidate checked against the stored object and merged
    /// with what an update of this kind may not change.
    fn prepare_update(
        &self,
        resource: &Resource,
        old: &Object,
        mut candidate: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let name = str_at(&old.value, "/metadata/name").to_owned();
        let ns = str_at(&old.value, "/metadata/namespace").to_owned();
        let given_name = str_at(&candidate, "/metadata/name").to_owned();
        if !given_name.is_empty() && given_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({given_name}) does not match the name on the URL ({name})"
            )));
        }
        let given_ns = str_at(&candidate, "/metadata/namespace").to_owned();
        if resource.namespaced && !given_ns.is_empty() && given_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let given_rv = str_at(&candidate, "/metadata/resourceVersion");
        if !given_rv.is_empty() && given_rv != old.rv.to_string() {
            return Err(ApiError::stale(resource, &name));
        }
        let has_status = resource.subresources.contains(&"status");
        if status_only {
            let mut new = old.value.clone();
            match candidate.get("status") {
                Some(s) if !s.is_null() => new["status"] = s.clone(),
                _ => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            return Ok(new);
        }
        {
            let old_meta = old.value.get("metadata").cloned().unwrap_or(json!({}));
            let meta = metadata_mut(&mut candidate);
            meta.insert("name".into(), json!(name));
            if resource.namespaced {
                meta.insert("namespace".into(), json!(ns));
            } else {
                meta.remove("namespace");
            }
            for kept in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generateName",
            ] {
                match old_meta.get(kept) {
                    Some(v) => meta.insert(kept.into(), v.clone()),
                    None => meta.remove(kept),
                };
            }
        }
        if has_status {
            match old.value.get("status") {
                Some(s) => candidate["status"] = s.clone(),
                None => {
                    if let Some(m) = candidate.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        if resource.kind == "Namespace" {
            candidate["spec"] = old.value.get("spec").cloned().unwrap_or(json!({}));
        }
        if resource.kind == "Pod" {
            // Compared (and stored) as the create stored it: defaulted, so a
            // PUT of the manifest the pod was made from changes nothing.
            admission::default_pod_spec(&mut candidate);
            let errors = admission::pod_spec_update_errors(&old.value, &candidate);
            if !errors.is_empty() {
                return Err(ApiError::invalid(resource, &name, &errors));
            }
        }
        Ok(candidate)
    }

    fn delete_one(
        &mut self,
        resource: &Resource,
        old: Object,
        opts: &DeleteOpts,
    ) -> Result<Object, ApiError> {
        let idx = index_of(resource);
        let name = str_at(&old.value, "/metadata/name").to_owned();
        if let Some(uid) = &opts.uid {
            let actual = str_at(&old.value, "/metadata/uid");
            if uid != actual {
                return Err(ApiError::conflict(
                    resource,
                    &name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(rv) = &opts.resource_version
            && *rv != old.rv.to_string()
        {
            return Err(ApiError::conflict(
                resource,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    old.rv
                ),
            ));
        }
        if resource.kind == "Namespace" {
            return self.delete_namespace(old);
        }
        let meta = old.value.get("metadata").cloned().unwrap_or(json!({}));
        let has_finalizers = meta
            .get("finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let already_deleting = meta.get("deletionTimestamp").is_some_and(|v| !v.is_null());
        let current_grace = meta
            .get("deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        let mut grace = 0;
        if resource.kind == "Pod" {
            let bound = !str_at(&old.value, "/spec/nodeName").is_empty();
            let terminal = matches!(str_at(&old.value, "/status/phase"), "Succeeded" | "Failed");
            let default = old
                .value
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30);
            grace = opts.grace.unwrap_or(default).max(0);
            if !bound || terminal {
                grace = 0;
            }
        }
        if grace > 0 || has_finalizers {
            if already_deleting && current_grace.is_some_and(|g| g <= grace) {
                return Ok(old);
            }
            let mut new = old.value.clone();
            let m = metadata_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(now_rfc3339(grace)));
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            return Ok(self.put(idx, new, ChangeKind::Modified, Some(old)));
        }
        Ok(self.put(idx, old.value.clone(), ChangeKind::Deleted, Some(old)))
    }
}

impl Inner {
    /// DELETE of a namespace: it becomes Terminating, each object in it is
    /// deleted as a DELETE of it would be (bound pods gracefully, finalizers
    /// honoured), and the namespace goes once nothing is left in it.
    fn delete_namespace(&mut self, old: Object) -> Result<Object, ApiError> {
        let name = str_at(&old.value, "/metadata/name").to_owned();
        if DEFAULT_NAMESPACES.contains(&name.as_str()) {
            return Err(ApiError::forbidden(format!(
                "namespaces {} is forbidden: this namespace may not be deleted",
                Value::String(name)
            )));
        }
        if old
            .value
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null())
        {
            return Ok(old);
        }
        let idx = namespace_index();
        let mut terminating = old.value.clone();
        let m = metadata_mut(&mut terminating);
        m.insert("deletionTimestamp".into(), json!(now_rfc3339(0)));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        terminating["status"] = json!({"phase": "Terminating"});
        let mut last = self.put(idx, terminating, ChangeKind::Modified, Some(old));
        for (i, resource) in RESOURCES.iter().enumerate().filter(|(_, r)| r.namespaced) {
            let children: Vec<Object> = self.objects[i]
                .range((name.clone(), String::new())..)
                .take_while(|((ns, _), _)| *ns == name)
                .map(|(_, o)| o.clone())
                .collect();
            for child in children {
                self.delete_one(resource, child, &DeleteOpts::default())?;
            }
        }
        self.finish_namespace(&name);
        if let Some(now) = self.objects[idx].get(&(String::new(), name.clone())) {
            last = now.clone();
        }
        Ok(last)
    }
}

/// The namespaces a fresh server has; they cannot be deleted.
pub const DEFAULT_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

impl Store {
    /// An empty store (no namespaces) keeping `window` changes for watches.
    pub fn empty(window: usize) -> Store {
        Store::from_objects(0, Vec::new(), window)
    }

    /// A store as a fresh server has it: the four default namespaces.
    pub fn with_default_namespaces(window: usize) -> Store {
        let store = Store::empty(window);
        let ns = &RESOURCES[namespace_index()];
        for name in DEFAULT_NAMESPACES {
            let created = store.create(
                ns,
                None,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            );
            if let Err(e) = created {
                tracing::error!(%e, name, "creating a default namespace");
            }
        }
        store
    }

    /// A store holding `objects` (resource index, value) at resourceVersion `rv`.
    pub fn from_objects(rv: u64, objects: Vec<(usize, Value)>, window: usize) -> Store {
        let mut maps: Vec<BTreeMap<Key, Object>> =
            RESOURCES.iter().map(|_| BTreeMap::new()).collect();
        for (idx, value) in objects {
            let object_rv = str_at(&value, "/metadata/resourceVersion")
                .parse()
                .unwrap_or(rv);
            let key = key_of(&value);
            maps[idx].insert(key, Arc::new(Stored::new(value, object_rv)));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seed = nanos ^ u64::from(std::process::id()).rotate_left(32);
        let mut inner = Inner {
            rv,
            objects: maps,
            pods_by_node: HashMap::new(),
            log: VecDeque::new(),
            oldest: rv,
            window: window.max(1),
            seed,
        };
        let pods: Vec<(Key, Object)> = inner.objects[pod_index()]
            .iter()
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (key, pod) in pods {
            inner.index_pod(&key, &pod.value, true);
        }
        Store {
            inner: RwLock::new(inner),
            changes: tokio::sync::watch::Sender::new(rv),
            patch_copy_budget: 2 * DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// Sets the request body limit the server runs with: one JSON patch may
    /// copy or move twice that many bytes.
    pub fn set_max_body_bytes(&mut self, max_body_bytes: usize) {
        self.patch_copy_budget = max_body_bytes.saturating_mul(2);
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn announce(&self, inner: &Inner) {
        self.changes.send_replace(inner.rv);
    }

    /// A receiver that sees the newest resourceVersion after every write.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The current global resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.read().rv
    }

    /// One object.
    pub fn get(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Object, ApiError> {
        self.read().get(resource, namespace, name)
    }

    /// A page of the objects of `resource` (in `namespace`, or all) matching `selectors`.
    pub fn list(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<ListPage, ApiError> {
        let inner = self.read();
        // A field selector on metadata.namespace narrows the scan like a namespaced path.
        let namespace = namespace.or(selectors.fields.namespace());
        let (rv, start) = match continue_token.filter(|t| !t.is_empty()) {
            Some(token) => {
                let (rv, key) = decode_continue(token)
                    .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
                if rv < inner.oldest {
                    return Err(ApiError::expired(format!(
                        "the continue token names resourceVersion {rv}, older than the oldest kept ({}); start a new list",
                        inner.oldest
                    )));
                }
                if rv > inner.rv {
                    return Err(ApiError::expired(format!(
                        "the continue token names resourceVersion {rv}, newer than the current one ({}); start a new list",
                        inner.rv
                    )));
                }
                (rv, Bound::Excluded(key))
            }
            None => (inner.rv, Bound::Unbounded),
        };
        let idx = index_of(resource);
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        // Later pages show the objects as they were at the first page's
        // version: the changes since are undone from the change log.
        let then = inner.states_at(idx, rv);
        let (items, last, more) = if then.is_empty() {
            take_page(
                inner
                    .candidates(idx, namespace, start, selectors)
                    .map(|(k, o)| (Cow::Borrowed(k), o.clone())),
                limit,
            )
        } else {
            take_page(
                inner
                    .candidates_then(idx, &then, namespace, start)
                    .filter(|(_, o)| selectors.matches(&o.value)),
                limit,
            )
        };
        let continue_token = match (more, last) {
            (true, Some(key)) => Some(encode_continue(rv, &key)),
            _ => None,
        };
        Ok(ListPage {
            items,
            rv,
            continue_token,
        })
    }

    /// The objects matching and the resourceVersion they are current at,
    /// read together (the start of a watch with initial events).
    pub fn snapshot_matching(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> (u64, Vec<Object>) {
        let inner = self.read();
        let items = inner
            .candidates(index_of(resource), namespace, Bound::Unbounded, selectors)
            .map(|(_, o)| o.clone())
            .collect();
        (inner.rv, items)
    }

    /// Every change after `rv`, or 410 when some of them are no longer kept
    /// or `rv` was never handed out by this store (a client that saw
    /// versions a crashed server lost). The real server answers the latter
    /// with 504 ResourceVersionTooLarge on lists, but watch clients such as
    /// kube-rs's relist only on 410.
    pub fn changes_since(&self, rv: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        let inner = self.read();
        if rv < inner.oldest {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                inner.oldest
            )));
        }
        if rv > inner.rv {
            return Err(ApiError::expired(format!(
                "too large resource version: {rv} ({})",
                inner.rv
            )));
        }
        let start = inner.log.partition_point(|c| c.rv <= rv);
        Ok(inner.log.range(start..).cloned().collect())
    }

    /// Every object and the current resourceVersion (for the state file).
    pub fn dump(&self) -> (u64, Vec<Object>) {
        let inner = self.read();
        let objects = inner
            .objects
            .iter()
            .flat_map(|m| m.values().cloned())
            .collect();
        (inner.rv, objects)
    }

    /// Creates an object (already decoded and normalized) in `namespace`.
    pub fn create(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        mut object: Value,
    ) -> Result<Object, ApiError> {
        let idx = index_of(resource);
        let mut inner = self.write();
        let meta = metadata_mut(&mut object);
        let given_ns = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if resource.namespaced {
            let ns = namespace.unwrap_or("");
            if !given_ns.is_empty() && given_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let generate = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|rv| !rv.is_empty())
        {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        inner.require_namespace(resource, namespace, &name)?;
        if name.is_empty() && !generate.is_empty() {
            loop {
                name = format!("{generate}{}", inner.suffix());
                if inner.get(resource, namespace, &name).is_err() {
                    break;
                }
            }
        }
        let mut errors = admission::name_errors(resource.kind, &name);
        errors.extend(admission::object_errors(resource.kind, &object));
        if !errors.is_empty() {
            return Err(ApiError::invalid(resource, &name, &errors));
        }
        if inner.get(resource, namespace, &name).is_ok() {
            return Err(ApiError::already_exists(resource, &name));
        }
        let uid = inner.uid();
        let meta = metadata_mut(&mut object);
        meta.insert("name".into(), json!(name));
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339(0)));
        for cleared in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
        ] {
            meta.remove(cleared);
        }
        match resource.kind {
            "Pod" => admission::default_pod(&mut object),
            "Namespace" => admission::default_namespace(&mut object),
            _ => {}
        }
        let stored = inner.put(idx, object, ChangeKind::Added, None);
        self.announce(&inner);
        Ok(stored)
    }

    /// PUT of the object (`status_only`: PUT of its `/status`).
    pub fn update(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        candidate: Value,
        status_only: bool,
    ) -> Result<Object, ApiError> {
        let mut inner = self.write();
        let old = inner.get(resource, namespace, name)?;
        let new = inner.prepare_update(resource, &old, candidate, status_only)?;
        let stored = inner.replace(resource, old, new)?;
        self.announce(&inner);
        Ok(stored)
    }

    /// PATCH of the object (`status_only`: of its `/status`), applied to the
    /// stored object under the write lock; unknown fields dropped silently.
    pub fn patch(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        kind: PatchType,
        body: &[u8],
        status_only: bool,
    ) -> Result<Object, ApiError> {
        self.patch_validated(
            resource,
            namespace,
            name,
            kind,
            body,
            status_only,
            types::FieldValidation::Ignore,
        )
        .map(|(stored, _)| stored)
    }

    /// [`Store::patch`] under a `fieldValidation` mode: also the warnings
    /// about unknown fields the patch brought (`Warn`), or 400 (`Strict`).
    #[allow(clippy::too_many_arguments)]
    pub fn patch_validated(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        kind: PatchType,
        body: &[u8],
        status_only: bool,
        validation: types::FieldValidation,
    ) -> Result<(Object, Vec<String>), ApiError> {
        // Parsed before the lock; a missing object is still reported first.
        let parsed = patch::parse(kind, body);
        let mut inner = self.write();
        let old = inner.get(resource, namespace, name)?;
        let parsed = parsed.map_err(patch_error)?;
        let patched = parsed
            .apply(&old.value, self.patch_copy_budget)
            .map_err(patch_error)?;
        let (patched, warnings) = types::normalize_checked(resource, patched, validation, false)?;
        let new = inner.prepare_update(resource, &old, patched, status_only)?;
        let stored = inner.replace(resource, old, new)?;
        self.announce(&inner);
        Ok((stored, warnings))
    }

    /// DELETE of one object: gone at once, or pending (graceful pod
    /// deletion, finalizers) with `deletionTimestamp` set.
    pub fn delete(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Object, ApiError> {
        self.delete_reporting(resource, namespace, name, opts)
            .map(|(object, _)| object)
    }

    /// [`Store::delete`], also saying whether the object is gone (`false`:
    /// its deletion waits for a grace period, finalizers or its contents).
    pub fn delete_reporting(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<(Object, bool), ApiError> {
        let mut inner = self.write();
        let old = inner.get(resource, namespace, name)?;
        let result = inner.delete_one(resource, old, opts);
        self.announce(&inner);
        let result = result?;
        let gone = inner.get(resource, namespace, name).is_err();
        Ok((result, gone))
    }

    /// DELETE of a collection: each object matching, as [`Store::delete`] would.
    pub fn delete_collection(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
        opts: &DeleteOpts,
    ) -> Result<Vec<Object>, ApiError> {
        let mut inner = self.write();
        let targets: Vec<Object> = inner
            .candidates(index_of(resource), namespace, Bound::Unbounded, selectors)
            .map(|(_, o)| o.clone())
            .collect();
        let mut done = Vec::new();
        let mut failed = None;
        for o in targets {
            let opts = DeleteOpts {
                grace: opts.grace,
                ..DeleteOpts::default()
            };
            match inner.delete_one(resource, o, &opts) {
                Ok(deleted) => done.push(deleted),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Watchers learn of what was deleted before a failure too.
        self.announce(&inner);
        match failed {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// POST of a Binding to `pods/<name>/binding`: assigns the pod to a node.
    pub fn bind(
        &self,
        pods: &Resource,
        namespace: &str,
        name: &str,
        binding: &Binding,
    ) -> Result<Object, ApiError> {
        let mut inner = self.write();
        let pod = inner.get(pods, Some(namespace), name)?;
        let binding_name = binding.metadata.name.as_deref().unwrap_or("");
        if !binding_name.is_empty() && binding_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the Binding ({binding_name}) does not match the pod on the URL ({name})"
            )));
        }
        let node = binding.target.name.as_deref().unwrap_or("");
        if node.is_empty() {
            return Err(ApiError::invalid(
                pods,
                name,
                &[crate::status::FieldError::required("target.name", "")],
            ));
        }
        if pod
            .value
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null())
        {
            return Err(ApiError::conflict_on(
                "pods/binding",
                name,
                &format!("pod {name} is being deleted, cannot be assigned to a host"),
            ));
        }
        let current = str_at(&pod.value, "/spec/nodeName");
        if !current.is_empty() {
            return Err(ApiError::conflict_on(
                "pods/binding",
                name,
                &format!(
                    "pod {name} is already assigned to node {}",
                    Value::String(current.to_owned())
                ),
            ));
        }
        let mut new = pod.value.clone();
        new["spec"]["nodeName"] = json!(node);
        if let Some(annotations) = &binding.metadata.annotations {
            let meta = metadata_mut(&mut new);
            let existing = meta.entry("annotations").or_insert_with(|| json!({}));
            for (k, v) in annotations {
                existing[k] = json!(v);
            }
        }
        if !new.get("status").is_some_and(Value::is_object) {
            new["status"] = json!({});
        }
        let condition = json!({"type": "PodScheduled", "status": "True",
                               "lastTransitionTime": now_rfc3339(0)});
        let conditions = new["status"]
            .as_object_mut()
            .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
        if let Some(Value::Array(list)) = conditions {
            list.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
            list.push(condition);
        }
        // Stored as every other write stores it: through the typed Pod, so a
        // later no-op write finds nothing to change.
        let new = types::normalize(pods, new)?;
        let stored = inner.put(index_of(pods), new, ChangeKind::Modified, Some(pod));
        self.announce(&inner);
        Ok(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;
    use crate::selectors::{FieldSelector, LabelSelector};

    fn res(plural: &str) -> &'static Resource {
        resources::RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .expect("resource")
    }

    fn pod(name: &str) -> Value {
        types::normalize(
            res("pods"),
            json!({"metadata": {"name": name, "labels": {"app": "a"}},
                   "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}),
        )
        .expect("pod decodes")
    }

    #[test]
    fn create_sets_metadata_and_bumps_rv() {
        let store = Store::with_default_namespaces(100);
        let rv0 = store.current_rv();
        assert_eq!(rv0, 4, "four default namespaces");
        let p = store
            .create(res("pods"), Some("default"), pod("p"))
            .expect("created");
        assert_eq!(p.rv, 5);
        assert_eq!(p.value["metadata"]["resourceVersion"], "5");
        assert_eq!(p.value["metadata"]["namespace"], "default");
        assert_eq!(p.value["status"]["phase"], "Pending");
        assert_eq!(str_at(&p.value, "/metadata/uid").len(), 36);
        let again = store
            .create(res("pods"), Some("default"), pod("p"))
            .expect_err("exists");
        assert_eq!(again.code, 409);
        let missing_ns = store
            .create(res("pods"), Some("nope"), pod("p"))
            .expect_err("no ns");
        assert_eq!(missing_ns.message, "namespaces \"nope\" not found");
        let bad = store
            .create(res("pods"), Some("default"), pod("Bad_Name"))
            .expect_err("invalid");
        assert_eq!(bad.code, 422);
    }

    #[test]
    fn stale_update_conflicts_and_status_is_separate() {
        let store = Store::with_default_namespaces(100);
        let p = store
            .create(res("pods"), Some("default"), pod("p"))
            .expect("created");
        let mut stale = p.value.clone();
        stale["metadata"]["resourceVersion"] = json!("1");
        let e = store
            .update(res("pods"), Some("default"), "p", stale, false)
            .expect_err("stale");
        assert_eq!(e.code, 409);
        assert!(
            e.message.contains("the object has been modified"),
            "{}",
            e.message
        );

        let mut with_status = p.value.clone();
        with_status["status"]["phase"] = json!("Running");
        with_status["metadata"]["labels"]["x"] = json!("y");
        let u = store
            .update(
                res("pods"),
                Some("default"),
                "p",
                with_status.clone(),
                false,
            )
            .expect("updated");
        assert_eq!(
            u.value["status"]["phase"], "Pending",
            "main resource ignores status"
        );
        assert_eq!(u.value["metadata"]["labels"]["x"], "y");
        with_status["metadata"]["resourceVersion"] = json!(u.rv.to_string());
        with_status["metadata"]["labels"]["z"] = json!("w");
        let s = store
            .update(res("pods"), Some("default"), "p", with_status, true)
            .expect("status");
        assert_eq!(s.value["status"]["phase"], "Running");
        assert!(
            s.value["metadata"]["labels"].get("z").is_none(),
            "status ignores the rest"
        );
    }

    #[test]
    fn binding_and_graceful_delete() {
        let store = Store::with_default_namespaces(100);
        store
            .create(res("pods"), Some("default"), pod("p"))
            .expect("created");
        let binding: Binding = serde_json::from_value(
            json!({"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}),
        )
        .expect("binding");
        let bound = store
            .bind(res("pods"), "default", "p", &binding)
            .expect("bound");
        assert_eq!(bound.value["spec"]["nodeName"], "n1");
        assert_eq!(
            bound.value["status"]["conditions"][0]["type"],
            "PodScheduled"
        );
        let twice = store
            .bind(res("pods"), "default", "p", &binding)
            .expect_err("bound twice");
        assert_eq!(twice.code, 409);
        assert!(
            twice
                .message
                .ends_with("pod p is already assigned to node \"n1\""),
            "{}",
            twice.message
        );

        let pending = store
            .delete(res("pods"), Some("default"), "p", &DeleteOpts::default())
            .expect("deleting");
        assert_eq!(pending.value["metadata"]["deletionGracePeriodSeconds"], 30);
        assert!(
            store.get(res("pods"), Some("default"), "p").is_ok(),
            "still there"
        );
        let gone = DeleteOpts {
            grace: Some(0),
            ..DeleteOpts::default()
        };
        store
            .delete(res("pods"), Some("default"), "p", &gone)
            .expect("deleted");
        assert_eq!(
            store
                .get(res("pods"), Some("default"), "p")
                .expect_err("gone")
                .code,
            404
        );
        let kinds: Vec<ChangeKind> = store
            .changes_since(4)
            .expect("kept")
            .iter()
            .map(|c| c.kind)
            .collect();
        assert_eq!(
            kinds,
            [
                ChangeKind::Added,
                ChangeKind::Modified,
                ChangeKind::Modified,
                ChangeKind::Deleted
            ]
        );
    }

    #[test]
    fn finalizers_hold_deletion_until_emptied() {
        let store = Store::with_default_namespaces(100);
        create_finalized_cm(&store, "default", "c", "a/b");
        let held = store
            .delete(
                res("configmaps"),
                Some("default"),
                "c",
                &DeleteOpts::default(),
            )
            .expect("held");
        assert!(held.value["metadata"]["deletionTimestamp"].is_string());
        clear_finalizers(&store, "default", "c");
        assert_eq!(
            store
                .get(res("configmaps"), Some("default"), "c")
                .expect_err("gone")
                .code,
            404
        );
    }

    #[test]
    fn pagination_and_selectors() {
        let store = store_with_pods(5);
        let all = Selectors::default();
        let first = store
            .list(res("pods"), Some("default"), &all, Some(2), None)
            .expect("page");
        assert_eq!(first.items.len(), 2);
        let token = first.continue_token.expect("more");
        let second = store
            .list(res("pods"), Some("default"), &all, Some(10), Some(&token))
            .expect("page");
        assert_eq!(second.items.len(), 3);
        assert!(second.continue_token.is_none());
        assert_eq!(second.rv, first.rv);
        let sel = Selectors {
            labels: LabelSelector::parse("app=a").expect("parses"),
            fields: FieldSelector::parse("metadata.name=p3", res("pods")).expect("parses"),
        };
        let other = types::normalize(
            res("pods"),
            json!({"metadata": {"name": "z", "namespace": "kube-system"},
                   "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        )
        .expect("pod");
        store
            .create(res("pods"), Some("kube-system"), other)
            .expect("created");
        let in_kube_system = Selectors {
            fields: FieldSelector::parse("metadata.namespace=kube-system", res("pods"))
                .expect("parses"),
            ..Selectors::default()
        };
        let page = store
            .list(res("pods"), None, &in_kube_system, None, None)
            .expect("list");
        assert_eq!(
            page.items.len(),
            1,
            "a namespace field selector on an all-namespaces list"
        );
        assert_eq!(
            store
                .list(res("pods"), None, &sel, None, None)
                .expect("list")
                .items
                .len(),
            1
        );
    }

    #[test]
    fn window_compacts_watch_history_and_tokens() {
        let store = Store::with_default_namespaces(3);
        let all = Selectors::default();
        store
            .create(res("pods"), Some("default"), pod("a"))
            .expect("created");
        store
            .create(res("pods"), Some("default"), pod("b"))
            .expect("created");
        let page = store
            .list(res("pods"), None, &all, Some(1), None)
            .expect("page");
        for i in 0..5 {
            store
                .create(res("pods"), Some("default"), pod(&format!("x{i}")))
                .expect("created");
        }
        let e = store.changes_since(2).expect_err("compacted");
        assert_eq!(e.code, 410);
        assert_eq!(e.message, "too old resource version: 2 (8)");
        assert_eq!(store.changes_since(8).expect("kept").len(), 3);
        let token = page.continue_token.expect("more");
        assert_eq!(
            store
                .list(res("pods"), None, &all, Some(1), Some(&token))
                .expect_err("expired")
                .code,
            410
        );
    }

    #[test]
    fn namespace_delete_removes_its_objects() {
        let store = store_with_namespace("t");
        store
            .create(res("pods"), Some("t"), pod("p"))
            .expect("created");
        store
            .delete(res("namespaces"), None, "t", &DeleteOpts::default())
            .expect("deleted");
        assert_eq!(
            store
                .get(res("pods"), Some("t"), "p")
                .expect_err("gone")
                .code,
            404
        );
        assert_eq!(
            store
                .get(res("namespaces"), None, "t")
                .expect_err("gone")
                .code,
            404
        );
    }

    /// A store with the default namespaces and pods `p0`… in `default`.
    fn store_with_pods(n: usize) -> Store {
        let store = Store::with_default_namespaces(100);
        for i in 0..n {
            store
                .create(res("pods"), Some("default"), pod(&format!("p{i}")))
                .expect("created");
        }
        store
    }

    /// Creates ConfigMap `name` in `ns` with one finalizer.
    fn create_finalized_cm(store: &Store, ns: &str, name: &str, finalizer: &str) {
        let cm = types::normalize(
            res("configmaps"),
            json!({"metadata": {"name": name, "finalizers": [finalizer]}}),
        )
        .expect("cm");
        store
            .create(res("configmaps"), Some(ns), cm)
            .expect("created");
    }

    /// Removes every finalizer of ConfigMap `name` in `ns`.
    fn clear_finalizers(store: &Store, ns: &str, name: &str) {
        store
            .patch(
                res("configmaps"),
                Some(ns),
                name,
                PatchType::Merge,
                br#"{"metadata":{"finalizers":null}}"#,
                false,
            )
            .expect("patched");
    }

    /// A store with the default namespaces and namespace `name`.
    fn store_with_namespace(name: &str) -> Store {
        let store = Store::with_default_namespaces(100);
        let ns =
            types::normalize(res("namespaces"), json!({"metadata": {"name": name}})).expect("ns");
        store.create(res("namespaces"), None, ns).expect("created");
        store
    }

    /// Merge-patches the `app` label of pod `name` in `default` to `changed`.
    fn relabel(store: &Store, name: &str) {
        store
            .patch(
                res("pods"),
                Some("default"),
                name,
                PatchType::Merge,
                br#"{"metadata":{"labels":{"app":"changed"}}}"#,
                false,
            )
            .expect("patched");
    }

    fn bound_pod(store: &Store, ns: &str, name: &str) {
        let mut value = pod(name);
        value["metadata"]["namespace"] = json!(ns);
        store.create(res("pods"), Some(ns), value).expect("created");
        let binding: Binding =
            serde_json::from_value(json!({"metadata": {"name": name}, "target": {"name": "n1"}}))
                .expect("binding");
        store.bind(res("pods"), ns, name, &binding).expect("bound");
    }

    #[test]
    fn later_pages_show_the_first_page_s_version() {
        let store = store_with_pods(6);
        let all = Selectors::default();
        let first = store
            .list(res("pods"), Some("default"), &all, Some(2), None)
            .expect("page");
        let token = first.continue_token.expect("more");
        // Between pages: one not yet listed is deleted, one changed, one
        // added, one already listed changed.
        store
            .delete(res("pods"), Some("default"), "p3", &DeleteOpts::default())
            .expect("deleted");
        relabel(&store, "p4");
        store
            .create(res("pods"), Some("default"), pod("p9"))
            .expect("created");
        store
            .create(res("pods"), Some("default"), pod("p25"))
            .expect("created");
        let rest = store
            .list(res("pods"), Some("default"), &all, None, Some(&token))
            .expect("page");
        assert_eq!(rest.rv, first.rv);
        assert_eq!(
            names(&rest.items),
            [
                ("default".to_owned(), "p2".to_owned()),
                ("default".into(), "p3".into()),
                ("default".into(), "p4".into()),
                ("default".into(), "p5".into())
            ]
        );
        assert_eq!(
            rest.items[2].value["metadata"]["labels"]["app"], "a",
            "as it was"
        );
        // Selectors apply to the objects as they were.
        let app_a = Selectors {
            labels: LabelSelector::parse("app=a").expect("parses"),
            ..Selectors::default()
        };
        let first = store
            .list(res("pods"), Some("default"), &app_a, Some(1), None)
            .expect("page");
        relabel(&store, "p5");
        let mut seen = names(&first.items);
        let mut token = first.continue_token;
        while let Some(t) = token {
            let page = store
                .list(res("pods"), Some("default"), &app_a, Some(1), Some(&t))
                .expect("page");
            seen.extend(names(&page.items));
            token = page.continue_token;
        }
        let seen: Vec<&str> = seen.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(seen, ["p0", "p1", "p2", "p25", "p5", "p9"]);
    }

    #[test]
    fn versions_never_handed_out_are_410_too() {
        let store = store_with_pods(3);
        let current = store.current_rv();
        let e = store.changes_since(current + 5).expect_err("too large");
        assert_eq!(e.code, 410);
        assert_eq!(
            e.message,
            format!("too large resource version: {} ({current})", current + 5)
        );
        assert!(store.changes_since(current).expect("now").is_empty());
        let all = Selectors::default();
        let token = encode_continue(current + 5, &("default".into(), "p0".into()));
        assert_eq!(
            store
                .list(res("pods"), None, &all, Some(1), Some(&token))
                .expect_err("from the future")
                .code,
            410
        );
    }

    #[test]
    fn namespace_deletion_is_graceful_and_refuses_new_content() {
        let store = store_with_namespace("t");
        bound_pod(&store, "t", "running");
        store
            .create(res("pods"), Some("t"), {
                let mut p = pod("pending");
                p["metadata"]["namespace"] = json!("t");
                p
            })
            .expect("created");
        create_finalized_cm(&store, "t", "held", "x/y");

        let (terminating, gone) = store
            .delete_reporting(res("namespaces"), None, "t", &DeleteOpts::default())
            .expect("deleting");
        assert!(!gone);
        assert_eq!(terminating.value["status"]["phase"], "Terminating");
        assert_eq!(
            store
                .get(res("pods"), Some("t"), "pending")
                .expect_err("unbound: gone at once")
                .code,
            404
        );
        let running = store
            .get(res("pods"), Some("t"), "running")
            .expect("graceful");
        assert_eq!(running.value["metadata"]["deletionGracePeriodSeconds"], 30);
        let held = store
            .get(res("configmaps"), Some("t"), "held")
            .expect("held by its finalizer");
        assert!(held.value["metadata"]["deletionTimestamp"].is_string());
        let refused = store
            .create(res("pods"), Some("t"), pod("late"))
            .expect_err("terminating");
        assert_eq!(refused.code, 403);
        assert_eq!(
            refused.message,
            "pods \"late\" is forbidden: unable to create new content in namespace t because it is being terminated"
        );

        let kubelet = DeleteOpts {
            grace: Some(0),
            ..DeleteOpts::default()
        };
        store
            .delete(res("pods"), Some("t"), "running", &kubelet)
            .expect("deleted");
        assert!(store.get(res("namespaces"), None, "t").is_ok(), "held");
        clear_finalizers(&store, "t", "held");
        assert_eq!(
            store
                .get(res("namespaces"), None, "t")
                .expect_err("empty: gone")
                .code,
            404
        );
        for name in DEFAULT_NAMESPACES {
            let e = store
                .delete(res("namespaces"), None, name, &DeleteOpts::default())
                .expect_err("protected");
            assert_eq!(e.code, 403);
            assert_eq!(
                e.message,
                format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted")
            );
        }
    }

    #[test]
    fn a_pod_put_of_its_manifest_is_defaulted_before_the_comparison() {
        let store = Store::with_default_namespaces(100);
        store
            .create(res("pods"), Some("default"), pod("p"))
            .expect("created");
        // What `kubectl replace -f pod.yaml` sends: the manifest, not the
        // defaulted object.
        let mut manifest = pod("p");
        manifest["metadata"]["labels"]["extra"] = json!("yes");
        let updated = store
            .update(res("pods"), Some("default"), "p", manifest, false)
            .expect("only labels changed");
        assert_eq!(updated.value["metadata"]["labels"]["extra"], "yes");
        assert_eq!(updated.value["spec"]["schedulerName"], "default-scheduler");
    }

    #[test]
    fn a_no_op_patch_after_binding_changes_nothing() {
        let store = Store::with_default_namespaces(100);
        bound_pod(&store, "default", "p");
        let before = store.get(res("pods"), Some("default"), "p").expect("there");
        let after = store
            .patch(
                res("pods"),
                Some("default"),
                "p",
                PatchType::Merge,
                b"{}",
                false,
            )
            .expect("patched");
        assert_eq!(after.rv, before.rv);
        assert!(store.changes_since(before.rv).expect("kept").is_empty());
        let strategic = store
            .patch(
                res("pods"),
                Some("default"),
                "p",
                PatchType::Strategic,
                br#"{"metadata":{"labels":{"app":"a"}}}"#,
                false,
            )
            .expect("patched");
        assert_eq!(strategic.rv, before.rv);
        // What a kubelet's status patch that changes nothing looks like.
        let status = store
            .patch(
                res("pods"),
                Some("default"),
                "p",
                PatchType::Strategic,
                br#"{"status":{"phase":"Pending"}}"#,
                true,
            )
            .expect("patched");
        assert_eq!(status.rv, before.rv);
        assert!(store.changes_since(before.rv).expect("kept").is_empty());
    }

    #[test]
    fn create_refuses_a_resource_version() {
        let store = Store::with_default_namespaces(100);
        let mut p = pod("p");
        p["metadata"]["resourceVersion"] = json!("3");
        let e = store
            .create(res("pods"), Some("default"), p)
            .expect_err("refused");
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "resourceVersion should not be set on objects to be created"
            )
        );
    }

    #[test]
    fn json_patch_failures_are_422_and_copy_bombs_413() {
        let mut store = Store::with_default_namespaces(100);
        store.set_max_body_bytes(16 * 1024);
        store
            .create(
                res("configmaps"),
                Some("default"),
                types::normalize(res("configmaps"), json!({"metadata": {"name": "c"}}))
                    .expect("cm"),
            )
            .expect("created");
        let failed = store
            .patch(
                res("configmaps"),
                Some("default"),
                "c",
                PatchType::Json,
                br#"[{"op":"test","path":"/metadata/name","value":"x"}]"#,
                false,
            )
            .expect_err("test fails");
        assert_eq!(failed.code, 422);
        // Each copy of the root to a new key doubles the object.
        let ops: Vec<String> = (0..40)
            .map(|i| format!(r#"{{"op":"copy","from":"","path":"/data/x{i}"}}"#))
            .collect();
        let bomb = format!(
            r#"[{{"op":"add","path":"/data","value":{{}}}},{}]"#,
            ops.join(",")
        );
        let e = store
            .patch(
                res("configmaps"),
                Some("default"),
                "c",
                PatchType::Json,
                bomb.as_bytes(),
                false,
            )
            .expect_err("bomb");
        assert_eq!(e.code, 413, "{}", e.message);
        let malformed = store
            .patch(
                res("configmaps"),
                Some("default"),
                "c",
                PatchType::Json,
                b"[{",
                false,
            )
            .expect_err("malformed");
        assert_eq!(malformed.code, 400);
    }

    /// One step of the random workload the node index is checked against.
    #[derive(Debug, Clone)]
    enum Op {
        Create {
            ns: usize,
            pod: usize,
            node: Option<usize>,
        },
        Bind {
            ns: usize,
            pod: usize,
            node: usize,
        },
        Relabel {
            ns: usize,
            pod: usize,
        },
        Delete {
            ns: usize,
            pod: usize,
            grace: Option<i64>,
        },
        DeleteOnNode {
            node: usize,
        },
        DeleteNamespace {
            ns: usize,
        },
        CreateNamespace {
            ns: usize,
        },
        Reload,
    }

    const NAMESPACES: [&str; 2] = ["default", "team"];
    const NODES: [&str; 3] = ["n0", "n1", "n2"];

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..2usize, 0..6usize, proptest::option::of(0..3usize))
                .prop_map(|(ns, pod, node)| Op::Create { ns, pod, node }),
            3 => (0..2usize, 0..6usize, 0..3usize).prop_map(|(ns, pod, node)| Op::Bind { ns, pod, node }),
            1 => (0..2usize, 0..6usize).prop_map(|(ns, pod)| Op::Relabel { ns, pod }),
            3 => (0..2usize, 0..6usize, proptest::option::of(0..2i64))
                .prop_map(|(ns, pod, grace)| Op::Delete { ns, pod, grace }),
            1 => (0..3usize).prop_map(|node| Op::DeleteOnNode { node }),
            1 => (0..2usize).prop_map(|ns| Op::DeleteNamespace { ns }),
            1 => (0..2usize).prop_map(|ns| Op::CreateNamespace { ns }),
            1 => Just(Op::Reload),
        ]
    }

    fn node_selector(node: &str) -> Selectors {
        Selectors {
            fields: FieldSelector::parse(&format!("spec.nodeName={node}"), res("pods"))
                .expect("parses"),
            ..Selectors::default()
        }
    }

    fn names(items: &[Object]) -> Vec<(String, String)> {
        items.iter().map(|o| key_of(&o.value)).collect()
    }

    fn apply(store: Store, op: &Op) -> Store {
        let pods = res("pods");
        // Errors (conflicts, missing objects, namespaces gone) are part of
        // the workload: the index must stay right whatever the outcome.
        match op {
            Op::Create { ns, pod: p, node } => {
                let mut value = pod(&format!("p{p}"));
                if let Some(n) = node {
                    value["spec"]["nodeName"] = json!(NODES[*n]);
                }
                let _ = store.create(pods, Some(NAMESPACES[*ns]), value);
            }
            Op::Bind { ns, pod: p, node } => {
                let binding: Binding = serde_json::from_value(
                    json!({"metadata": {"name": format!("p{p}")}, "target": {"name": NODES[*node]}}),
                )
                .expect("binding");
                let _ = store.bind(pods, NAMESPACES[*ns], &format!("p{p}"), &binding);
            }
            Op::Relabel { ns, pod: p } => {
                let _ = store.patch(
                    pods,
                    Some(NAMESPACES[*ns]),
                    &format!("p{p}"),
                    PatchType::Merge,
                    br#"{"metadata":{"labels":{"touched":"yes"}}}"#,
                    false,
                );
            }
            Op::Delete { ns, pod: p, grace } => {
                let opts = DeleteOpts {
                    grace: *grace,
                    ..DeleteOpts::default()
                };
                let _ = store.delete(pods, Some(NAMESPACES[*ns]), &format!("p{p}"), &opts);
            }
            Op::DeleteOnNode { node } => {
                let opts = DeleteOpts {
                    grace: Some(0),
                    ..DeleteOpts::default()
                };
                let _ = store.delete_collection(pods, None, &node_selector(NODES[*node]), &opts);
            }
            Op::DeleteNamespace { ns } if *ns > 0 => {
                let _ = store.delete(
                    res("namespaces"),
                    None,
                    NAMESPACES[*ns],
                    &DeleteOpts::default(),
                );
            }
            Op::DeleteNamespace { .. } => {}
            Op::CreateNamespace { ns } => {
                let value = types::normalize(
                    res("namespaces"),
                    json!({"metadata": {"name": NAMESPACES[*ns]}}),
                )
                .expect("namespace");
                let _ = store.create(res("namespaces"), None, value);
            }
            Op::Reload => {
                let (rv, objects) = store.dump();
                let objects = objects
                    .iter()
                    .map(|o| {
                        let kind = str_at(&o.value, "/kind");
                        let idx = RESOURCES
                            .iter()
                            .position(|r| r.kind == kind)
                            .expect("known kind");
                        (idx, o.value.clone())
                    })
                    .collect();
                return Store::from_objects(rv, objects, 1000);
            }
        }
        store
    }

    proptest::proptest! {
        #[test]
        fn node_index_answers_as_a_full_scan_does(ops in proptest::collection::vec(op(), 1..60)) {
            let mut store = Store::with_default_namespaces(1000);
            store.create(
                res("namespaces"),
                None,
                types::normalize(res("namespaces"), json!({"metadata": {"name": "team"}}))
                    .expect("namespace"),
            ).expect("created");
            for op in &ops {
                store = apply(store, op);
                let (_, everything) = store.dump();
                let all_pods: Vec<&Object> = everything
                    .iter()
                    .filter(|o| str_at(&o.value, "/kind") == "Pod")
                    .collect();
                // The index itself holds exactly the pods on each node (a
                // stale entry would be filtered out of lists, but leak).
                let mut scanned: HashMap<String, BTreeSet<Key>> = HashMap::new();
                for o in &all_pods {
                    scanned
                        .entry(str_at(&o.value, "/spec/nodeName").to_owned())
                        .or_default()
                        .insert(key_of(&o.value));
                }
                proptest::prop_assert_eq!(&store.read().pods_by_node, &scanned, "after {:?}", op);
                for node in ["", "n0", "n1", "n2", "elsewhere"] {
                    let selectors = node_selector(node);
                    for ns in [None, Some("default"), Some("team")] {
                        let want: Vec<(String, String)> = all_pods
                            .iter()
                            .filter(|o| str_at(&o.value, "/spec/nodeName") == node)
                            .filter(|o| ns.is_none_or(|n| str_at(&o.value, "/metadata/namespace") == n))
                            .map(|o| key_of(&o.value))
                            .collect();
                        let whole = store.list(res("pods"), ns, &selectors, None, None).expect("list");
                        proptest::prop_assert_eq!(&names(&whole.items), &want, "after {:?}", op);
                        // The same, page by page.
                        let mut paged = Vec::new();
                        let mut token: Option<String> = None;
                        loop {
                            let page = store
                                .list(res("pods"), ns, &selectors, Some(2), token.as_deref())
                                .expect("page");
                            paged.extend(names(&page.items));
                            match page.continue_token {
                                Some(t) => token = Some(t),
                                None => break,
                            }
                        }
                        proptest::prop_assert_eq!(&paged, &want);
                        let (_, snapshot) = store.snapshot_matching(res("pods"), ns, &selectors);
                        proptest::prop_assert_eq!(&names(&snapshot), &want);
                    }
                }
            }
        }
    }
}
