//! The scheduler extender wire format (HTTP + JSON), both directions.
//!
//! kube-scheduler marshals Go structs without JSON tags, so the keys are the
//! Go field names (`Pod`, `Nodes`, `NodeNames`, `FailedNodes`, …) and absent
//! optional values travel as `null`. Go's decoder matches keys
//! case-insensitively; the reply types here do the same, so an extender
//! answering `nodenames` or `failedNodes` is understood as kube-scheduler
//! understands it. The Tessera extender (the server side) reuses these types.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use std::fmt;

use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The highest score an extender's prioritize verb may give a node.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// Failure reasons by node name, as an extender's filter reply carries them.
pub type FailedNodesMap = BTreeMap<String, String>;

/// What the filter and prioritize verbs receive.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod")]
    pub pod: Option<Pod>,
    /// The candidate nodes, whole; sent only when the extender is not
    /// `nodeCacheCapable`.
    #[serde(rename = "Nodes")]
    pub nodes: Option<NodeList>,
    /// The candidate node names; sent only when the extender is
    /// `nodeCacheCapable`.
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
}

/// What the filter verb answers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExtenderFilterResult {
    /// The nodes that passed, whole (extenders that are not `nodeCacheCapable`).
    #[serde(rename = "Nodes")]
    pub nodes: Option<NodeList>,
    /// The names of the nodes that passed (`nodeCacheCapable` extenders).
    #[serde(rename = "NodeNames")]
    pub node_names: Option<Vec<String>>,
    /// Nodes that failed, with the reason (preemption might help).
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: FailedNodesMap,
    /// Nodes that failed for a reason preemption cannot fix.
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// A failure of the whole call.
    #[serde(rename = "Error")]
    pub error: String,
}

/// One node's score from the prioritize verb.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostPriority {
    /// The node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// Its score, 0 to [`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score")]
    pub score: i64,
}

/// What the prioritize verb answers.
pub type HostPriorityList = Vec<HostPriority>;

/// What the bind verb receives.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExtenderBindingArgs {
    /// The pod's name.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// The pod's namespace.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// The pod's uid.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// The node chosen.
    #[serde(rename = "Node")]
    pub node: String,
}

/// What the bind verb answers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExtenderBindingResult {
    /// Why binding failed; empty on success.
    #[serde(rename = "Error")]
    pub error: String,
}

/// Pods that would be evicted from a node (preempt verb; the stand-in
/// scheduler accepts `preemptVerb` but never calls it).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Victims {
    /// The pods.
    #[serde(rename = "Pods")]
    pub pods: Vec<Pod>,
    /// How many PodDisruptionBudgets evicting them violates.
    #[serde(rename = "NumPDBViolations")]
    pub num_pdb_violations: i64,
}

/// A pod named by uid only (preempt verb).
#[derive(Clone, Debug, Default, Serialize)]
pub struct MetaPod {
    /// The pod's uid.
    #[serde(rename = "UID")]
    pub uid: String,
}

/// Victims named by uid only (preempt verb).
#[derive(Clone, Debug, Default, Serialize)]
pub struct MetaVictims {
    /// The pods.
    #[serde(rename = "Pods")]
    pub pods: Vec<MetaPod>,
    /// How many PodDisruptionBudgets evicting them violates.
    #[serde(rename = "NumPDBViolations")]
    pub num_pdb_violations: i64,
}

/// What the preempt verb receives.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExtenderPreemptionArgs {
    /// The pod that wants to preempt.
    #[serde(rename = "Pod")]
    pub pod: Option<Pod>,
    /// Candidate victims per node (extenders that are not `nodeCacheCapable`).
    #[serde(rename = "NodeNameToVictims")]
    pub node_name_to_victims: Option<BTreeMap<String, Victims>>,
    /// Candidate victims per node, by uid (`nodeCacheCapable` extenders).
    #[serde(rename = "NodeNameToMetaVictims")]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

/// What the preempt verb answers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExtenderPreemptionResult {
    /// The victims the extender agrees to, per node.
    #[serde(rename = "NodeNameToMetaVictims")]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

/// Decodes an extender's reply as Go's `json.Decoder.Decode` does (what
/// kube-scheduler calls): the first JSON value, whatever follows it
/// ignored, `null` giving the zero value.
pub fn decode_reply<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // No `de.end()`: trailing bytes are not read, as Go's Decoder leaves them.
    Ok(Option::<T>::deserialize(&mut de)?.unwrap_or_default())
}

/// A JSON object's members in document order, looked up as Go's decoder
/// matches them to struct fields: case-insensitively, a later member
/// overriding an earlier one. `null` decodes as an empty object (Go leaves
/// the zero value). Values nested deeper are decoded by serde, keys exact.
struct GoObject(Vec<(String, Value)>);

struct GoObjectVisitor(&'static str);

impl<'de> Visitor<'de> for GoObjectVisitor {
    type Value = GoObject;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a JSON object ({})", self.0)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<GoObject, E> {
        Ok(GoObject(Vec::new()))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<GoObject, E> {
        Ok(GoObject(Vec::new()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<GoObject, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry::<String, Value>()? {
            members.push(member);
        }
        Ok(GoObject(members))
    }
}

/// A character as Go folds struct field names (upper case of the lower
/// case, so `ſ` matches `S` and the Kelvin sign matches `K`).
fn go_fold(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_uppercase();
    }
    fn single(mut it: impl Iterator<Item = char>, fallback: char) -> char {
        match (it.next(), it.next()) {
            (Some(one), None) => one,
            _ => fallback,
        }
    }
    let lower = single(c.to_lowercase(), c);
    single(lower.to_uppercase(), lower)
}

fn go_fold_eq(key: &str, field: &str) -> bool {
    key.chars().map(go_fold).eq(field.chars().map(go_fold))
}

impl GoObject {
    fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
        what: &'static str,
    ) -> Result<GoObject, D::Error> {
        d.deserialize_any(GoObjectVisitor(what))
    }

    /// The members naming `field`, in document order.
    fn members(&mut self, field: &str) -> Vec<Value> {
        self.0
            .iter_mut()
            .filter(|(k, _)| go_fold_eq(k, field))
            .map(|(_, v)| std::mem::take(v))
            .collect()
    }

    fn decode<T: DeserializeOwned, E: serde::de::Error>(field: &str, v: Value) -> Result<T, E> {
        serde_json::from_value(v).map_err(|e| E::custom(format!("{field}: {e}")))
    }

    /// A pointer or slice field: the last member wins, `null` resets it to
    /// `None`.
    fn field<T: DeserializeOwned, E: serde::de::Error>(
        &mut self,
        field: &str,
    ) -> Result<Option<T>, E> {
        let mut out = None;
        for v in self.members(field) {
            out = match v {
                Value::Null => None,
                v => Some(Self::decode(field, v)?),
            };
        }
        Ok(out)
    }

    /// A plain field (string, number, slice): the last member wins, `null`
    /// leaves it as it was.
    fn value<T: DeserializeOwned + Default, E: serde::de::Error>(
        &mut self,
        field: &str,
    ) -> Result<T, E> {
        let mut out = T::default();
        for v in self.members(field) {
            if !v.is_null() {
                out = Self::decode(field, v)?;
            }
        }
        Ok(out)
    }

    /// A map field: Go decodes every member into the same map, so the
    /// entries of all count, later ones overriding; `null` empties it.
    fn map<E: serde::de::Error>(&mut self, field: &str) -> Result<FailedNodesMap, E> {
        let mut out = FailedNodesMap::new();
        for v in self.members(field) {
            match v {
                Value::Null => out.clear(),
                v => out.extend(Self::decode::<FailedNodesMap, E>(field, v)?),
            }
        }
        Ok(out)
    }
}

impl<'de> Deserialize<'de> for ExtenderArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "ExtenderArgs")?;
        Ok(ExtenderArgs {
            pod: o.field("Pod")?,
            nodes: o.field("Nodes")?,
            node_names: o.field("NodeNames")?,
        })
    }
}

impl<'de> Deserialize<'de> for ExtenderFilterResult {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "ExtenderFilterResult")?;
        Ok(ExtenderFilterResult {
            nodes: o.field("Nodes")?,
            node_names: o.field("NodeNames")?,
            failed_nodes: o.map("FailedNodes")?,
            failed_and_unresolvable_nodes: o.map("FailedAndUnresolvableNodes")?,
            error: o.value("Error")?,
        })
    }
}

impl<'de> Deserialize<'de> for HostPriority {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "HostPriority")?;
        Ok(HostPriority {
            host: o.value("Host")?,
            score: o.value("Score")?,
        })
    }
}

impl<'de> Deserialize<'de> for ExtenderBindingArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "ExtenderBindingArgs")?;
        Ok(ExtenderBindingArgs {
            pod_name: o.value("PodName")?,
            pod_namespace: o.value("PodNamespace")?,
            pod_uid: o.value("PodUID")?,
            node: o.value("Node")?,
        })
    }
}

impl<'de> Deserialize<'de> for ExtenderBindingResult {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "ExtenderBindingResult")?;
        Ok(ExtenderBindingResult {
            error: o.value("Error")?,
        })
    }
}

impl<'de> Deserialize<'de> for MetaPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "MetaPod")?;
        Ok(MetaPod {
            uid: o.value("UID")?,
        })
    }
}

impl<'de> Deserialize<'de> for MetaVictims {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "MetaVictims")?;
        Ok(MetaVictims {
            pods: o.value("Pods")?,
            num_pdb_violations: o.value("NumPDBViolations")?,
        })
    }
}

impl<'de> Deserialize<'de> for Victims {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "Victims")?;
        Ok(Victims {
            pods: o.value("Pods")?,
            num_pdb_violations: o.value("NumPDBViolations")?,
        })
    }
}

impl<'de> Deserialize<'de> for ExtenderPreemptionArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "ExtenderPreemptionArgs")?;
        Ok(ExtenderPreemptionArgs {
            pod: o.field("Pod")?,
            node_name_to_victims: o.field("NodeNameToVictims")?,
            node_name_to_meta_victims: o.field("NodeNameToMetaVictims")?,
        })
    }
}

impl<'de> Deserialize<'de> for ExtenderPreemptionResult {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut o = GoObject::deserialize(d, "ExtenderPreemptionResult")?;
        Ok(ExtenderPreemptionResult {
            node_name_to_meta_victims: o.field("NodeNameToMetaVictims")?,
        })
    }
}

/// A core/v1 `NodeList` as kube-scheduler marshals it: `metadata` and
/// `items` (an empty TypeMeta is left out).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeList {
    /// List metadata (empty as sent).
    #[serde(default)]
    pub metadata: ListMeta,
    /// The nodes.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub items: Vec<Node>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Node>, D::Error> {
    Ok(Option::<Vec<Node>>::deserialize(d)?.unwrap_or_default())
}

impl NodeList {
    /// The names of the nodes, in order.
    pub fn names(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_use_go_field_names_and_null_for_absent() {
        let args = ExtenderArgs {
            pod: None,
            nodes: None,
            node_names: Some(vec!["a".into()]),
        };
        let v = serde_json::to_value(&args).expect("serialize");
        assert_eq!(
            v,
            serde_json::json!({"Pod": null, "Nodes": null, "NodeNames": ["a"]})
        );
    }

    #[test]
    fn filter_result_is_read_case_insensitively() {
        let r: ExtenderFilterResult = serde_json::from_str(
            r#"{"nodenames":["n1"],"failedNodes":{"n2":"no room"},"FAILEDANDUNRESOLVABLENODES":{"n3":"never"},"error":""}"#,
        )
        .expect("parse");
        assert_eq!(r.node_names, Some(vec!["n1".to_owned()]));
        assert_eq!(
            r.failed_nodes.get("n2").map(String::as_str),
            Some("no room")
        );
        assert_eq!(
            r.failed_and_unresolvable_nodes
                .get("n3")
                .map(String::as_str),
            Some("never")
        );
        assert!(r.nodes.is_none());
    }

    #[test]
    fn filter_result_last_key_wins_as_in_go() {
        // Go's decoder assigns every member in document order, so among keys
        // differing only in case the last one wins, whichever is exact.
        let r: ExtenderFilterResult =
            serde_json::from_str(r#"{"error":"low","Error":"exact"}"#).expect("parse");
        assert_eq!(r.error, "exact");
        let r: ExtenderFilterResult =
            serde_json::from_str(r#"{"Error":"exact","error":"low"}"#).expect("parse");
        assert_eq!(r.error, "low");
        // null resets a slice pointer, but leaves a string alone.
        let r: ExtenderFilterResult = serde_json::from_str(
            r#"{"NodeNames":["a"],"nodeNames":null,"Error":"e","ERROR":null}"#,
        )
        .expect("parse");
        assert_eq!(r.node_names, None);
        assert_eq!(r.error, "e");
        // Maps merge, later entries overriding.
        let r: ExtenderFilterResult =
            serde_json::from_str(r#"{"FailedNodes":{"a":"1","b":"2"},"failednodes":{"b":"3"}}"#)
                .expect("parse");
        assert_eq!(
            r.failed_nodes,
            FailedNodesMap::from([("a".into(), "1".into()), ("b".into(), "3".into())])
        );
        // Go folds the long s to S.
        let r: ExtenderFilterResult =
            serde_json::from_str("{\"NodeName\u{17f}\":[\"x\"]}").expect("parse");
        assert_eq!(r.node_names, Some(vec!["x".to_owned()]));
    }

    #[test]
    fn replies_decode_as_go_decoder_does() {
        // null is the zero value: no node passed.
        let r: ExtenderFilterResult = decode_reply(b"null").expect("null");
        assert!(r.node_names.is_none() && r.nodes.is_none() && r.error.is_empty());
        let r: ExtenderFilterResult = serde_json::from_str(" null ").expect("null");
        assert!(r.failed_nodes.is_empty());
        let list: HostPriorityList = decode_reply(b"null").expect("null list");
        assert!(list.is_empty());
        // Bytes after the first value are not read.
        let r: ExtenderFilterResult =
            decode_reply(br#"{"NodeNames":["a"]} trailing {garbage"#).expect("trailing");
        assert_eq!(r.node_names, Some(vec!["a".to_owned()]));
        let r: ExtenderBindingResult = decode_reply(b"{}\n{}\n").expect("two values");
        assert_eq!(r.error, "");
        // Nothing at all is an error, as Go's io.EOF.
        assert!(decode_reply::<ExtenderFilterResult>(b"  ").is_err());
        assert!(decode_reply::<ExtenderFilterResult>(b"[1]").is_err());
    }

    #[test]
    fn priorities_and_binding_round_trip() {
        let list: HostPriorityList =
            serde_json::from_str(r#"[{"host":"a","score":3},{"Host":"b","Score":10}]"#)
                .expect("parse");
        assert_eq!(
            list,
            vec![
                HostPriority {
                    host: "a".into(),
                    score: 3
                },
                HostPriority {
                    host: "b".into(),
                    score: 10
                }
            ]
        );
        let args = ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            node: "n".into(),
        };
        let v = serde_json::to_value(&args).expect("serialize");
        assert_eq!(
            v,
            serde_json::json!({"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"})
        );
        let back: ExtenderBindingArgs = serde_json::from_value(v).expect("parse");
        assert_eq!(back.pod_uid, "u");
        let res: ExtenderBindingResult = serde_json::from_str("{}").expect("parse");
        assert_eq!(res.error, "");
    }

    #[test]
    fn wrong_types_are_errors_naming_the_field() {
        let e = serde_json::from_str::<ExtenderFilterResult>(r#"{"NodeNames": 3}"#)
            .expect_err("must fail");
        assert!(e.to_string().contains("NodeNames"), "{e}");
        let e = serde_json::from_str::<ExtenderFilterResult>("[1]").expect_err("must fail");
        assert!(e.to_string().contains("expected a JSON object"), "{e}");
    }
}
