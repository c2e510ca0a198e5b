//! `labelSelector` and `fieldSelector`: parsed once per request, matched
//! against stored objects (lists, watches, deletecollection).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::resources::Resource;

/// A selector that does not parse, or names a field this resource lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector requirement that does not parse.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// A field selector term that is not `field=value`, `==` or `!=`.
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    Field(String, String),
    /// A field the resource does not index.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
}

/// A parsed `labelSelector`: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<(String, LabelOp)>,
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_label_key(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && key.matches('/').count() <= 1
}

fn valid_label_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(text: &str, whole: &str) -> Result<BTreeSet<String>, SelectorError> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| SelectorError::Label(format!("{whole}: expected a set in parentheses")))?;
    let mut set = BTreeSet::new();
    for value in inner.split(',') {
        let value = value.trim();
        if !valid_label_value(value) {
            return Err(SelectorError::Label(format!(
                "{whole}: invalid label value {value:?}"
            )));
        }
        set.insert(value.to_owned());
    }
    Ok(set)
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub fn parse(text: &str) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(LabelSelector { requirements });
        }
        for raw in split_top_level(text) {
            let term = raw.trim();
            if term.is_empty() {
                return Err(SelectorError::Label(format!("{text}: empty requirement")));
            }
            let (key, op) = if let Some(key) = term.strip_prefix('!') {
                (key.trim(), LabelOp::DoesNotExist)
            } else if let Some((key, value)) = term.split_once("!=") {
                (key.trim(), LabelOp::NotEquals(value.trim().to_owned()))
            } else if let Some((key, value)) = term.split_once("==") {
                (key.trim(), LabelOp::Equals(value.trim().to_owned()))
            } else if let Some((key, value)) = term.split_once('=') {
                (key.trim(), LabelOp::Equals(value.trim().to_owned()))
            } else if let Some((key, rest)) = split_word(term, "notin") {
                (key, LabelOp::NotIn(parse_set(rest, term)?))
            } else if let Some((key, rest)) = split_word(term, "in") {
                (key, LabelOp::In(parse_set(rest, term)?))
            } else {
                (term, LabelOp::Exists)
            };
            if !valid_label_key(key) {
                return Err(SelectorError::Label(format!(
                    "{term}: invalid label key {key:?}"
                )));
            }
            if let LabelOp::Equals(v) | LabelOp::NotEquals(v) = &op
                && !valid_label_value(v)
            {
                return Err(SelectorError::Label(format!(
                    "{term}: invalid label value {v:?}"
                )));
            }
            requirements.push((key.to_owned(), op));
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object (as stored) matches.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        self.requirements.iter().all(|(key, op)| {
            let value = labels.and_then(|l| l.get(key)).and_then(Value::as_str);
            match op {
                LabelOp::Equals(v) => value == Some(v.as_str()),
                LabelOp::NotEquals(v) => value != Some(v.as_str()),
                LabelOp::In(set) => value.is_some_and(|x| set.contains(x)),
                LabelOp::NotIn(set) => value.is_none_or(|x| !set.contains(x)),
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
            }
        })
    }
}

/// `key in (...)` split at the operator word (surrounded by whitespace).
fn split_word<'a>(term: &'a str, word: &str) -> Option<(&'a str, &'a str)> {
    let mut search = 0;
    while let Some(pos) = term[search..].find(word) {
        let at = search + pos;
        let before = term[..at].chars().last();
        let after = term[at + word.len()..].chars().next();
        if before.is_some_and(char::is_whitespace)
            && after.is_some_and(|c| c.is_whitespace() || c == '(')
        {
            return Some((term[..at].trim(), &term[at + word.len()..]));
        }
        search = at + word.len();
    }
    None
}

/// A parsed `fieldSelector`: every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

/// The fields a resource can be selected by, besides `metadata.name` and
/// `metadata.namespace`.
fn extra_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "Pod" => &[
            "spec.nodeName",
            "spec.schedulerName",
            "spec.restartPolicy",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "Event" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "Node" => &["spec.unschedulable"],
        "Namespace" => &["status.phase"],
        _ => &[],
    }
}

/// The value a field selector compares for `field` of `object` (absent
/// fields compare as `""`, booleans as `true`/`false`).
fn field_value(object: &Value, field: &str) -> String {
    if field == "source" {
        return object
            .pointer("/source/component")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
    }
    let pointer = format!("/{}", field.replace('.', "/"));
    match object.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        None | Some(Value::Null) => match field {
            "spec.unschedulable" | "spec.hostNetwork" => "false".to_owned(),
            _ => String::new(),
        },
        Some(other) => other.to_string(),
    }
}

impl FieldSelector {
    /// Parses `a=b,c!=d` for `resource`, refusing fields it does not index.
    pub fn parse(text: &str, resource: &Resource) -> Result<FieldSelector, SelectorError> {
        let mut terms = Vec::new();
        if text.trim().is_empty() {
            return Ok(FieldSelector { terms });
        }
        for raw in text.split(',') {
            let term = raw.trim();
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError::Field(text.to_owned(), term.to_owned()));
            };
            let field = field.trim();
            let supported = matches!(field, "metadata.name" | "metadata.namespace")
                || extra_fields(resource.kind).contains(&field);
            if !supported {
                return Err(SelectorError::UnsupportedField(field.to_owned()));
            }
            terms.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(FieldSelector { terms })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether an object (as stored) matches.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|(field, equal, value)| (field_value(object, field) == *value) == *equal)
    }

    /// The value `metadata.namespace` must equal, if the selector pins it
    /// (lets a list skip other namespaces).
    pub fn namespace(&self) -> Option<&str> {
        self.equal_to("metadata.namespace")
    }

    /// The value `field` must equal, if an `=`/`==` term pins it (lets the
    /// store answer from an index instead of scanning).
    pub fn equal_to(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, eq, _)| f == field && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

/// Both selectors of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectors {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether an object (as stored) matches both.
    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources;

    fn pod(labels: Value, node: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels},
                           "spec": {}, "status": {"phase": "Pending"}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    #[test]
    fn label_operators() {
        let p = pod(json!({"app": "web", "tier": "front"}), None);
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web, db)",
            "app notin (db)",
            "app",
            "!missing",
            "app=web,tier in (front),!x",
            "missing notin (a)",
            "",
        ];
        for s in yes {
            assert!(
                LabelSelector::parse(s).expect(s).matches(&p),
                "{s} should match"
            );
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web,x)",
            "missing",
            "!app",
            "missing in (a)",
        ];
        for s in no {
            assert!(
                !LabelSelector::parse(s).expect(s).matches(&p),
                "{s} should not match"
            );
        }
    }

    #[test]
    fn label_parse_errors() {
        for s in ["app in web", "a=b,,c", "=x", "app=we b"] {
            assert!(LabelSelector::parse(s).is_err(), "{s} should not parse");
        }
    }

    #[test]
    fn field_selector_on_pods() {
        let pods = resources::find("", "v1", "pods").expect("pods");
        let bound = pod(json!({}), Some("n1"));
        let unbound = pod(json!({}), None);
        let sel =
            FieldSelector::parse("spec.nodeName=n1,status.phase!=Running", pods).expect("parses");
        assert!(sel.matches(&bound));
        assert!(!sel.matches(&unbound));
        let unbound_sel = FieldSelector::parse("spec.nodeName=", pods).expect("parses");
        assert!(unbound_sel.matches(&unbound));
        assert!(!unbound_sel.matches(&bound));
        let ns = FieldSelector::parse("metadata.namespace==ns", pods).expect("parses");
        assert_eq!(ns.namespace(), Some("ns"));
    }

    #[test]
    fn unsupported_field_is_named() {
        let cms = resources::find("", "v1", "configmaps").expect("configmaps");
        let err = FieldSelector::parse("spec.nodeName=a", cms).expect_err("refused");
        assert_eq!(err.to_string(), "field label not supported: spec.nodeName");
    }

    #[test]
    fn node_unschedulable_defaults_to_false() {
        let nodes = resources::find("", "v1", "nodes").expect("nodes");
        let sel = FieldSelector::parse("spec.unschedulable=false", nodes).expect("parses");
        assert!(sel.matches(&json!({"metadata": {"name": "n"}, "spec": {}})));
        assert!(!sel.matches(&json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}})));
    }
}
