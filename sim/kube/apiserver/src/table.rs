//! Server-side printing: `meta.k8s.io/v1` Table responses, as kubectl asks for
//! with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.

use crate::resources::Resource;

/// Whether an `Accept` header asks for a Table (and this server gives one).
pub fn wants_table(accept: &str) -> bool {
    let _ = accept;
    false
}

/// A Table of `items` (objects of `resource`, as stored), with each row's
/// `object` as PartialObjectMetadata unless `include_object` is `Object`;
/// `list_metadata` is the list's `metadata` (resourceVersion, continue).
pub fn to_table(
    resource: &Resource,
    items: &[serde_json::Value],
    include_object: &str,
    list_metadata: serde_json::Value,
) -> serde_json::Value {
    let _ = (resource, items, include_object);
    serde_json::json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_metadata, "columnDefinitions": [], "rows": []})
}
