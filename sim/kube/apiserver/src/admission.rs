//! What the real server does to an object between decoding and storing it:
//! defaulting (the pod fields the scheduler and kubelet read) and validation
//! (names, the pod fields that must be there) → 422 Invalid.

use serde_json::{Value, json};

use crate::status::FieldError;

const DNS1123_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";

fn label_chars_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS-1123 label (namespace names, container names).
pub fn is_dns1123_label(s: &str) -> bool {
    label_chars_ok(s)
}

/// Whether `s` is a DNS-1123 subdomain (most object names).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(label_chars_ok)
}

/// Field errors of an object's name (`namespaces` take labels, the rest subdomains).
pub fn name_errors(kind: &str, name: &str) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )];
    }
    if kind == "Namespace" {
        if !is_dns1123_label(name) {
            return vec![FieldError::invalid("metadata.name", name, DNS1123_LABEL)];
        }
    } else if !is_dns1123_subdomain(name) {
        return vec![FieldError::invalid(
            "metadata.name",
            name,
            DNS1123_SUBDOMAIN,
        )];
    }
    Vec::new()
}

/// Kind-specific field errors of an object about to be stored.
pub fn object_errors(kind: &str, object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match kind {
        "Pod" => {
            let containers = object.pointer("/spec/containers").and_then(Value::as_array);
            match containers {
                None => errors.push(FieldError::required("spec.containers", "")),
                Some(list) if list.is_empty() => {
                    errors.push(FieldError::required("spec.containers", ""))
                }
                Some(_) => {}
            }
            let mut seen = Vec::new();
            for field in ["initContainers", "containers"] {
                let list = object
                    .pointer(&format!("/spec/{field}"))
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                for (i, c) in list.iter().enumerate() {
                    let name = c.get("name").and_then(Value::as_str).unwrap_or("");
                    let at = format!("spec.{field}[{i}]");
                    if name.is_empty() {
                        errors.push(FieldError::required(format!("{at}.name"), ""));
                    } else if !is_dns1123_label(name) {
                        errors.push(FieldError::invalid(
                            format!("{at}.name"),
                            name,
                            DNS1123_LABEL,
                        ));
                    } else if seen.contains(&name) {
                        errors.push(FieldError::duplicate(format!("{at}.name"), name));
                    } else {
                        seen.push(name);
                    }
                    if c.get("image")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        errors.push(FieldError::required(format!("{at}.image"), ""));
                    }
                }
            }
        }
        "Event"
            if object
                .get("involvedObject")
                .is_none_or(|o| o.as_object().is_none_or(|m| m.is_empty())) =>
        {
            errors.push(FieldError::required("involvedObject", ""));
        }
        _ => {}
    }
    errors
}

/// Fields of a pod spec that an update may change (the rest is immutable).
const MUTABLE_POD_SPEC: &[&str] = &[
    "activeDeadlineSeconds",
    "tolerations",
    "terminationGracePeriodSeconds",
    "schedulingGates",
];

/// A 422 field error when an update changes an immutable part of a pod spec.
pub fn pod_spec_update_errors(old: &Value, new: &Value) -> Vec<FieldError> {
    let strip = |spec: &Value| -> Value {
        let mut spec = spec.clone();
        if let Some(map) = spec.as_object_mut() {
            for f in MUTABLE_POD_SPEC {
                map.remove(*f);
            }
            for list in ["containers", "initContainers"] {
                if let Some(Value::Array(items)) = map.get_mut(list) {
                    for c in items {
                        if let Some(c) = c.as_object_mut() {
                            c.remove("image");
                        }
                    }
                }
            }
        }
        spec
    };
    let old_spec = old.get("spec").cloned().unwrap_or(Value::Null);
    let new_spec = new.get("spec").cloned().unwrap_or(Value::Null);
    if strip(&old_spec) == strip(&new_spec) {
        Vec::new()
    } else {
        vec![FieldError::forbidden(
            "spec",
            "pod updates may only change container images, activeDeadlineSeconds, tolerations, terminationGracePeriodSeconds and schedulingGates",
        )]
    }
}

fn set_default(map: &mut serde_json::Map<String, Value>, key: &str, value: Value) {
    if map.get(key).is_none_or(Value::is_null) {
        map.insert(key.to_owned(), value);
    }
}

/// The image pull policy a container gets when it names none.
fn pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        "IfNotPresent"
    } else {
        match last.split_once(':') {
            None => "Always",
            Some((_, "latest")) => "Always",
            Some(_) => "IfNotPresent",
        }
    }
}

/// Pod defaulting on create: the spec defaults (see [`default_pod_spec`])
/// and the initial status.
pub fn default_pod(pod: &mut Value) {
    default_pod_spec(pod);
    let Some(obj) = pod.as_object_mut() else {
        return;
    };
    let qos = qos_class(obj.get("spec").unwrap_or(&Value::Null));
    obj.insert(
        "status".to_owned(),
        json!({"phase": "Pending", "qosClass": qos}),
    );
}

/// The spec defaults the scheduler and kubelet read, and requests
/// defaulted from limits (on create, and on update before the immutable
/// fields are compared).
pub fn default_pod_spec(pod: &mut Value) {
    let Some(obj) = pod.as_object_mut() else {
        return;
    };
    let spec = obj.entry("spec").or_insert_with(|| json!({}));
    if let Some(spec) = spec.as_object_mut() {
        set_default(spec, "restartPolicy", json!("Always"));
        set_default(spec, "dnsPolicy", json!("ClusterFirst"));
        set_default(spec, "schedulerName", json!("default-scheduler"));
        set_default(spec, "terminationGracePeriodSeconds", json!(30));
        set_default(spec, "securityContext", json!({}));
        set_default(spec, "enableServiceLinks", json!(true));
        set_default(spec, "priority", json!(0));
        set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
        for list in ["initContainers", "containers"] {
            if let Some(Value::Array(items)) = spec.get_mut(list) {
                for c in items.iter_mut().filter_map(Value::as_object_mut) {
                    let image = c
                        .get("image")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    set_default(c, "imagePullPolicy", json!(pull_policy(&image)));
                    set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
                    set_default(c, "terminationMessagePolicy", json!("File"));
                    set_default(c, "resources", json!({}));
                    if let Some(Value::Array(ports)) = c.get_mut("ports") {
                        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                            set_default(p, "protocol", json!("TCP"));
                        }
                    }
                    if let Some(res) = c.get_mut("resources").and_then(Value::as_object_mut)
                        && let Some(Value::Object(limits)) = res.get("limits").cloned()
                    {
                        let requests = res.entry("requests").or_insert_with(|| json!({}));
                        if let Some(requests) = requests.as_object_mut() {
                            for (k, v) in limits {
                                requests.entry(k).or_insert(v);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A resource quantity (`500m`, `1Gi`, `2e3`) in billionths of a unit;
/// `None` when it does not parse or does not fit.
pub fn quantity_nanos(text: &str) -> Option<i128> {
    let text = text.trim();
    let (number, suffix) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let (sign, number) = match number.strip_prefix('-') {
        Some(rest) => (-1i128, rest),
        None => (1, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    // value = mantissa × 10^exponent10 × 2^exponent2
    let mut exponent10: i32 = 9 - i32::try_from(fraction.len()).ok()?;
    let mut exponent2: u32 = 0;
    match suffix {
        "" => {}
        "n" => exponent10 -= 9,
        "u" => exponent10 -= 6,
        "m" => exponent10 -= 3,
        "k" => exponent10 += 3,
        "M" => exponent10 += 6,
        "G" => exponent10 += 9,
        "T" => exponent10 += 12,
        "P" => exponent10 += 15,
        "E" => exponent10 += 18,
        "Ki" => exponent2 = 10,
        "Mi" => exponent2 = 20,
        "Gi" => exponent2 = 30,
        "Ti" => exponent2 = 40,
        "Pi" => exponent2 = 50,
        "Ei" => exponent2 = 60,
        other => {
            let e = other.strip_prefix(['e', 'E'])?;
            exponent10 += e.parse::<i32>().ok()?;
        }
    }
    mantissa = mantissa.checked_mul(1i128.checked_shl(exponent2)?)?;
    if exponent10 >= 0 {
        mantissa = mantissa.checked_mul(10i128.checked_pow(u32::try_from(exponent10).ok()?)?)?;
    } else {
        let divisor = 10i128.checked_pow(u32::try_from(-exponent10).ok()?);
        mantissa = divisor.map_or(0, |d| mantissa / d);
    }
    Some(sign * mantissa)
}

/// Whether two quantities are the same amount (`1` and `1000m` are);
/// text that does not parse is compared as text.
fn same_quantity(a: &str, b: &str) -> bool {
    match (quantity_nanos(a), quantity_nanos(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The pod's QoS class from its containers' cpu/memory requests and limits.
pub fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .filter_map(|f| spec.get(*f).and_then(Value::as_array))
        .flatten()
        .collect();
    let get = |c: &Value, which: &str, res: &str| -> Option<String> {
        c.pointer(&format!("/resources/{which}/{res}"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in &containers {
        for res in ["cpu", "memory"] {
            let request = get(c, "requests", res);
            let limit = get(c, "limits", res);
            any |= request.is_some() || limit.is_some();
            match (&request, &limit) {
                (_, None) => guaranteed = false,
                (Some(r), Some(l)) if !same_quantity(r, l) => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Namespace defaulting on create: the `kubernetes` finalizer, phase Active.
pub fn default_namespace(ns: &mut Value) {
    let Some(obj) = ns.as_object_mut() else {
        return;
    };
    obj.insert("spec".to_owned(), json!({"finalizers": ["kubernetes"]}));
    obj.insert("status".to_owned(), json!({"phase": "Active"}));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("a.b-c.d1"));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(is_dns1123_label("kube-system"));
        assert!(!is_dns1123_label("a.b"));
        assert_eq!(name_errors("Namespace", "a.b").len(), 1);
        assert!(name_errors("Pod", "a.b").is_empty());
        assert_eq!(name_errors("Pod", "")[0].reason, "FieldValueRequired");
    }

    #[test]
    fn pod_checks() {
        let ok = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert!(object_errors("Pod", &ok).is_empty());
        let bad = json!({"spec": {"containers": [{"name": "C", "image": "i"}, {"name": "d"}]}});
        let errs = object_errors("Pod", &bad);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(
            object_errors("Pod", &json!({"spec": {}}))[0].field,
            "spec.containers"
        );
    }

    #[test]
    fn pod_defaults_and_qos() {
        let mut p = json!({"spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        default_pod(&mut p);
        assert_eq!(p["spec"]["schedulerName"], "default-scheduler");
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "1"
        );
        assert_eq!(
            p["status"],
            json!({"phase": "Pending", "qosClass": "Guaranteed"})
        );
        assert_eq!(
            qos_class(&json!({"containers": [{"name": "c"}]})),
            "BestEffort"
        );
        assert_eq!(
            qos_class(&json!({"containers": [{"resources": {"requests": {"cpu": "1"}}}]})),
            "Burstable"
        );
        assert_eq!(pull_policy("reg:5000/busybox:1.36"), "IfNotPresent");
    }

    #[test]
    fn quantities_compare_by_amount() {
        assert_eq!(quantity_nanos("1"), Some(1_000_000_000));
        assert_eq!(quantity_nanos("1000m"), quantity_nanos("1"));
        assert_eq!(quantity_nanos("0.5"), quantity_nanos("500m"));
        assert_eq!(quantity_nanos("1Gi"), quantity_nanos("1073741824"));
        assert_eq!(quantity_nanos("1k"), quantity_nanos("1e3"));
        assert_eq!(quantity_nanos("x"), None);
        assert_eq!(quantity_nanos("1Xi"), None);
        let spec = json!({"containers": [{"resources": {
            "requests": {"cpu": "1000m", "memory": "1Gi"},
            "limits": {"cpu": "1", "memory": "1024Mi"}}}]});
        assert_eq!(qos_class(&spec), "Guaranteed");
        let spec = json!({"containers": [{"resources": {
            "requests": {"cpu": "500m", "memory": "1Gi"},
            "limits": {"cpu": "1", "memory": "1Gi"}}}]});
        assert_eq!(qos_class(&spec), "Burstable");
    }

    #[test]
    fn pod_spec_changes() {
        let old = json!({"spec": {"containers": [{"name": "c", "image": "a"}], "nodeName": "n"}});
        let image = json!({"spec": {"containers": [{"name": "c", "image": "b"}], "nodeName": "n"}});
        let node = json!({"spec": {"containers": [{"name": "c", "image": "a"}], "nodeName": "m"}});
        assert!(pod_spec_update_errors(&old, &image).is_empty());
        assert_eq!(pod_spec_update_errors(&old, &node).len(), 1);
    }
}
