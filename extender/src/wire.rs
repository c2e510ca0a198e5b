//! kube-scheduler's extender v1 wire format: the JSON bodies of `filter`,
//! `prioritize` and `bind`, as kube-scheduler writes and reads them.
//!
//! Keys are Go field names (`Pod`, `NodeNames`, `FailedNodes`, …). Replies
//! are written with exactly those names. Requests are read as Go's
//! `encoding/json` reads them: a key matches a field exactly or, failing
//! that, ignoring ASCII case (`nodenames` fills `NodeNames`). The Kubernetes
//! objects inside (`Pod`, the nodes of `Nodes.items`) use their own
//! camelCase names and are read as such.
//!
//! Anything that is not such a body is a [`WireError`] naming the field, for
//! an HTTP 400; nothing here panics on input.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

/// Why a request body was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Not JSON at all, or not a JSON object.
    #[error("request body: {0}")]
    NotJson(String),
    /// A field that must be present is missing.
    #[error("request body: {0} is missing")]
    Missing(&'static str),
    /// A field of the wrong shape.
    #[error("request body: {field}: {problem}")]
    Invalid {
        /// The field, e.g. `Nodes.items[2]` or `PodName`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// `ExtenderArgs`: the pod and the candidate nodes, either as whole Node
/// objects (`Nodes`) or, with `nodeCacheCapable`, as names (`NodeNames`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    pub pod: Pod,
    /// `Nodes.items`, when sent.
    pub nodes: Option<Vec<Node>>,
    /// `NodeNames`, when sent.
    pub node_names: Option<Vec<String>>,
}

/// Which form the candidate nodes came in, so the reply uses the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeForm {
    /// Whole Node objects (`Nodes`).
    Objects,
    /// Names only (`NodeNames`).
    Names,
}

impl ExtenderArgs {
    /// Reads a request body.
    pub fn parse(body: &[u8]) -> Result<ExtenderArgs, WireError> {
        let object = object_of(body)?;
        let pod = field(&object, "Pod").ok_or(WireError::Missing("Pod"))?;
        let pod: Pod = serde_json::from_value(pod.clone()).map_err(|e| WireError::Invalid {
            field: "Pod".into(),
            problem: e.to_string(),
        })?;
        let nodes = match field(&object, "Nodes") {
            None | Some(Value::Null) => None,
            Some(Value::Object(list)) => {
                let items = match field(list, "items") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(items)) => items.clone(),
                    Some(_) => {
                        return Err(WireError::Invalid {
                            field: "Nodes.items".into(),
                            problem: "not a list".into(),
                        });
                    }
                };
                let mut nodes = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    let node: Node =
                        serde_json::from_value(item).map_err(|e| WireError::Invalid {
                            field: format!("Nodes.items[{i}]"),
                            problem: e.to_string(),
                        })?;
                    if node.metadata.name.as_deref().is_none_or(str::is_empty) {
                        return Err(WireError::Invalid {
                            field: format!("Nodes.items[{i}].metadata.name"),
                            problem: "missing".into(),
                        });
                    }
                    nodes.push(node);
                }
                Some(nodes)
            }
            Some(_) => {
                return Err(WireError::Invalid {
                    field: "Nodes".into(),
                    problem: "not a NodeList object".into(),
                });
            }
        };
        let node_names = match field(&object, "NodeNames") {
            None | Some(Value::Null) => None,
            Some(value) => Some(string_list(value, "NodeNames")?),
        };
        if nodes.is_none() && node_names.is_none() {
            return Err(WireError::Missing("Nodes or NodeNames"));
        }
        Ok(ExtenderArgs {
            pod,
            nodes,
            node_names,
        })
    }

    /// The candidate node names, and the form they came in. When both forms
    /// are sent, `NodeNames` wins (kube-scheduler sends one or the other).
    pub fn candidates(&self) -> (Vec<String>, NodeForm) {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => (names.clone(), NodeForm::Names),
            (None, Some(nodes)) => (
                nodes
                    .iter()
                    .filter_map(|n| n.metadata.name.clone())
                    .collect(),
                NodeForm::Objects,
            ),
            (None, None) => (Vec::new(), NodeForm::Names),
        }
    }
}

/// `ExtenderFilterResult`, written with Go's field names. `Nodes` and
/// `NodeNames` are written only in the form the request used.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ExtenderFilterResult {
    /// The nodes that passed, as objects (`{"items": [...]}`).
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// The nodes that passed, by name.
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    /// Node name → why it does not fit.
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: BTreeMap<String, String>,
    /// Node name → why it does not fit, where preemption would not help.
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// A failure of the whole call ("" when none).
    #[serde(rename = "Error")]
    pub error: String,
}

/// A `NodeList` as the reply's `Nodes`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct NodeList {
    /// The nodes.
    pub items: Vec<Node>,
}

/// One `HostPriority`; prioritize answers a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// 0..=10.
    #[serde(rename = "Score")]
    pub score: i64,
}

/// `ExtenderBindingArgs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod uid.
    pub pod_uid: String,
    /// The node chosen.
    pub node: String,
}

impl ExtenderBindingArgs {
    /// Reads a request body; every field must be a non-empty string.
    pub fn parse(body: &[u8]) -> Result<ExtenderBindingArgs, WireError> {
        let object = object_of(body)?;
        let text = |name: &'static str| -> Result<String, WireError> {
            match field(&object, name) {
                None | Some(Value::Null) => Err(WireError::Missing(name)),
                Some(Value::String(s)) if s.is_empty() => Err(WireError::Invalid {
                    field: name.into(),
                    problem: "empty".into(),
                }),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(WireError::Invalid {
                    field: name.into(),
                    problem: "not a string".into(),
                }),
            }
        };
        Ok(ExtenderBindingArgs {
            pod_name: text("PodName")?,
            pod_namespace: text("PodNamespace")?,
            pod_uid: text("PodUID")?,
            node: text("Node")?,
        })
    }
}

/// `ExtenderBindingResult`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ExtenderBindingResult {
    /// Why the bind failed ("" on success).
    #[serde(rename = "Error")]
    pub error: String,
}

fn object_of(body: &[u8]) -> Result<Map<String, Value>, WireError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(WireError::NotJson("not a JSON object".into())),
        Err(e) => Err(WireError::NotJson(e.to_string())),
    }
}

/// Go's key matching: the exact key, else one equal to it ignoring ASCII case.
fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).or_else(|| {
        object
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    })
}

fn string_list(value: &Value, name: &str) -> Result<Vec<String>, WireError> {
    let Value::Array(items) = value else {
        return Err(WireError::Invalid {
            field: name.into(),
            problem: "not a list".into(),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            _ => Err(WireError::Invalid {
                field: format!("{name}[{i}]"),
                problem: "not a string".into(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_case_insensitively_as_go_does() {
        let body = br#"{"pod":{"metadata":{"name":"p","namespace":"ns"}},"NODENAMES":["a","b"]}"#;
        let args = ExtenderArgs::parse(body).expect("valid");
        assert_eq!(args.pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(
            args.candidates(),
            (vec!["a".to_string(), "b".to_string()], NodeForm::Names)
        );
        let bind = ExtenderBindingArgs::parse(
            br#"{"podname":"p","PodNamespace":"ns","PODUID":"u","node":"n"}"#,
        )
        .expect("valid");
        assert_eq!(
            bind,
            ExtenderBindingArgs {
                pod_name: "p".into(),
                pod_namespace: "ns".into(),
                pod_uid: "u".into(),
                node: "n".into()
            }
        );
    }

    #[test]
    fn an_exact_key_wins_over_a_folded_one() {
        let body = br#"{"Pod":{"metadata":{"name":"p"}},"nodenames":["x"],"NodeNames":["y"]}"#;
        let args = ExtenderArgs::parse(body).expect("valid");
        assert_eq!(args.node_names, Some(vec!["y".to_string()]));
    }

    #[test]
    fn nodes_come_from_the_node_list_items() {
        let body = br#"{"Pod":{"metadata":{"name":"p"}},"Nodes":{"metadata":{},"items":[{"metadata":{"name":"n1"}},{"metadata":{"name":"n2"}}]}}"#;
        let args = ExtenderArgs::parse(body).expect("valid");
        assert_eq!(
            args.candidates(),
            (vec!["n1".to_string(), "n2".to_string()], NodeForm::Objects)
        );
    }

    #[test]
    fn malformed_bodies_name_the_field() {
        let cases: [(&[u8], &str); 9] = [
            (b"", "request body"),
            (b"[1]", "not a JSON object"),
            (b"{\"NodeNames\":[]}", "Pod is missing"),
            (b"{\"Pod\":{}}", "Nodes or NodeNames is missing"),
            (b"{\"Pod\":5,\"NodeNames\":[]}", "Pod"),
            (b"{\"Pod\":{},\"NodeNames\":[1]}", "NodeNames[0]"),
            (b"{\"Pod\":{},\"NodeNames\":\"a\"}", "NodeNames"),
            (b"{\"Pod\":{},\"Nodes\":{\"items\":5}}", "Nodes.items"),
            (
                b"{\"Pod\":{},\"Nodes\":{\"items\":[{\"metadata\":{}}]}}",
                "Nodes.items[0].metadata.name",
            ),
        ];
        for (body, needle) in cases {
            let err = ExtenderArgs::parse(body).expect_err(needle).to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let err = ExtenderBindingArgs::parse(
            br#"{"PodName":"p","PodNamespace":"ns","PodUID":7,"Node":"n"}"#,
        )
        .expect_err("uid")
        .to_string();
        assert!(err.contains("PodUID"), "{err}");
    }

    #[test]
    fn replies_carry_go_field_names() {
        let reply = ExtenderFilterResult {
            node_names: Some(vec!["a".into()]),
            failed_nodes: BTreeMap::from([("b".to_string(), "why".to_string())]),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&reply).expect("serializes"),
            r#"{"NodeNames":["a"],"FailedNodes":{"b":"why"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        let scores = vec![HostPriority {
            host: "a".into(),
            score: 7,
        }];
        assert_eq!(
            serde_json::to_string(&scores).expect("serializes"),
            r#"[{"Host":"a","Score":7}]"#
        );
        assert_eq!(
            serde_json::to_string(&ExtenderBindingResult::default()).expect("serializes"),
            r#"{"Error":""}"#
        );
    }
}
