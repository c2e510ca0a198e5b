//! `KubeSchedulerConfiguration` (kubescheduler.config.k8s.io/v1), decoded
//! strictly as kube-scheduler decodes it: unknown fields, a wrong
//! apiVersion/kind and invalid extender settings are one-line errors naming
//! the field path.
//!
//! Fields kube-scheduler knows but the stand-in does not act on
//! (`leaderElection`, `parallelism`, `percentageOfNodesToScore`, profile
//! `plugins`/`pluginConfig`, `clientConnection.qps`, …) are accepted and
//! ignored. `preemptVerb` is accepted and never called: the stand-in does not
//! preempt. `enableHTTPS` and `tlsConfig` are refused: the stand-in speaks
//! plain HTTP only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

/// The apiVersion accepted.
pub const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";
/// The kind accepted.
pub const KIND: &str = "KubeSchedulerConfiguration";
/// The scheduler name of a profile that names none.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// kube-scheduler's extender timeout when `httpTimeout` is unset or zero.
pub const DEFAULT_EXTENDER_TIMEOUT: Duration = Duration::from_secs(5);

/// A bad configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is neither YAML nor JSON.
    #[error("{path}: not YAML or JSON: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// The parser's message, on one line.
        message: String,
    },
    /// A field is wrong.
    #[error("{path}: {field}: {message}")]
    Field {
        /// The file.
        path: String,
        /// The field path, e.g. `extenders[0].weight`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// The configuration the stand-in acts on.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// `clientConnection.kubeconfig`, resolved against the config file's
    /// directory when relative; `None` when empty.
    pub kubeconfig: Option<PathBuf>,
    /// The profiles' scheduler names, in order (at least one).
    pub scheduler_names: Vec<String>,
    /// The extenders, in order.
    pub extenders: Vec<ExtenderConfig>,
    /// `podInitialBackoffSeconds` (default 1).
    pub pod_initial_backoff: Duration,
    /// `podMaxBackoffSeconds` (default 10).
    pub pod_max_backoff: Duration,
}

/// One `extenders[]` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtenderConfig {
    /// `urlPrefix` (an `http://` URL).
    pub url_prefix: String,
    /// `filterVerb`; empty: no filter call.
    pub filter_verb: String,
    /// `preemptVerb`: accepted, never called.
    pub preempt_verb: String,
    /// `prioritizeVerb`; empty: no prioritize call.
    pub prioritize_verb: String,
    /// `weight` (> 0 when `prioritizeVerb` is set).
    pub weight: i64,
    /// `bindVerb`; empty: the scheduler binds through the API.
    pub bind_verb: String,
    /// `httpTimeout` (default 5 s).
    pub http_timeout: Duration,
    /// `nodeCacheCapable`: send node names only.
    pub node_cache_capable: bool,
    /// `managedResources`.
    pub managed_resources: Vec<ManagedResource>,
    /// `ignorable`: errors of this extender do not fail scheduling.
    pub ignorable: bool,
}

/// One `managedResources[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagedResource {
    /// The extended resource name.
    pub name: String,
    /// Whether the scheduler leaves this resource's fit check to the extender.
    pub ignored_by_scheduler: bool,
}

impl ExtenderConfig {
    /// Whether the pod requests (or limits) a resource this extender
    /// manages; an extender without managed resources is interested in
    /// every pod.
    pub fn is_interested(&self, pod: &k8s_openapi::api::core::v1::Pod) -> bool {
        if self.managed_resources.is_empty() {
            return true;
        }
        let Some(spec) = &pod.spec else { return false };
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.resources.as_ref())
            .any(|r| {
                r.requests
                    .iter()
                    .chain(r.limits.iter())
                    .flat_map(|m| m.keys())
                    .any(|k| self.managed_resources.iter().any(|m| &m.name == k))
            })
    }

    /// Whether the extender binds pods itself.
    pub fn is_binder(&self) -> bool {
        !self.bind_verb.is_empty()
    }
}

impl SchedulerConfig {
    /// Reads and decodes a configuration file.
    pub fn load(path: &Path) -> Result<SchedulerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        SchedulerConfig::parse(&text, &path.display().to_string(), base)
    }

    /// Decodes configuration text (YAML or JSON); `origin` names it in
    /// errors, `base` resolves a relative kubeconfig path.
    pub fn parse(text: &str, origin: &str, base: &Path) -> Result<SchedulerConfig, ConfigError> {
        let value: Value = serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: origin.to_owned(),
            message: one_line(&e.to_string()),
        })?;
        decode(value, base).map_err(|(field, message)| ConfigError::Field {
            path: origin.to_owned(),
            field: if field.is_empty() {
                "(top)".into()
            } else {
                field
            },
            message,
        })
    }

    /// Which extenders to ask about `pod`, in configuration order.
    pub fn interested_extenders<'a>(
        &'a self,
        pod: &'a k8s_openapi::api::core::v1::Pod,
    ) -> impl Iterator<Item = (usize, &'a ExtenderConfig)> + 'a {
        self.extenders
            .iter()
            .enumerate()
            .filter(move |(_, e)| e.is_interested(pod))
    }

    /// Extended resources whose fit check an extender took over.
    pub fn ignored_resources(&self) -> BTreeSet<String> {
        self.extenders
            .iter()
            .flat_map(|e| &e.managed_resources)
            .filter(|m| m.ignored_by_scheduler)
            .map(|m| m.name.clone())
            .collect()
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

type FieldResult<T> = Result<T, (String, String)>;

/// A JSON object being decoded: fields are taken one by one, and whatever
/// is left at the end is an unknown field.
struct Obj {
    path: String,
    map: Map<String, Value>,
}

impl Obj {
    fn new(path: &str, value: Value) -> FieldResult<Obj> {
        match value {
            Value::Object(map) => Ok(Obj {
                path: path.to_owned(),
                map,
            }),
            other => Err((
                path.to_owned(),
                format!("expected an object, got {}", kind(&other)),
            )),
        }
    }

    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The field, `None` when absent or null.
    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn string(&mut self, key: &str) -> FieldResult<Option<String>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err((
                self.child(key),
                format!("expected a string, got {}", kind(&other)),
            )),
        }
    }

    fn boolean(&mut self, key: &str) -> FieldResult<Option<bool>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err((
                self.child(key),
                format!("expected true or false, got {}", kind(&other)),
            )),
        }
    }

    fn integer(&mut self, key: &str) -> FieldResult<Option<i64>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| (self.child(key), format!("expected an integer, got {n}"))),
            Some(other) => Err((
                self.child(key),
                format!("expected an integer, got {}", kind(&other)),
            )),
        }
    }

    fn number(&mut self, key: &str) -> FieldResult<Option<f64>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err((
                self.child(key),
                format!("expected a number, got {}", kind(&other)),
            )),
        }
    }

    fn array(&mut self, key: &str) -> FieldResult<Vec<Value>> {
        match self.take(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err((
                self.child(key),
                format!("expected a list, got {}", kind(&other)),
            )),
        }
    }

    fn object(&mut self, key: &str) -> FieldResult<Option<Obj>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => Obj::new(&self.child(key), v).map(Some),
        }
    }

    /// Accepts a field of any content (known to kube-scheduler, unused here).
    fn ignore(&mut self, key: &str) {
        self.map.remove(key);
    }

    /// Fails on the first field left over.
    fn finish(self) -> FieldResult<()> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => Err((
                if self.path.is_empty() {
                    key.clone()
                } else {
                    format!("{}.{key}", self.path)
                },
                "unknown field".into(),
            )),
        }
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn decode(value: Value, base: &Path) -> FieldResult<SchedulerConfig> {
    let mut top = Obj::new("", value)?;
    match top.string("apiVersion")? {
        Some(v) if v == API_VERSION => {}
        Some(v) => return Err(("apiVersion".into(), format!("{v:?} is not {API_VERSION:?}"))),
        None => {
            return Err((
                "apiVersion".into(),
                format!("missing (want {API_VERSION:?})"),
            ));
        }
    }
    match top.string("kind")? {
        Some(v) if v == KIND => {}
        Some(v) => return Err(("kind".into(), format!("{v:?} is not {KIND:?}"))),
        None => return Err(("kind".into(), format!("missing (want {KIND:?})"))),
    }
    let mut kubeconfig = None;
    if let Some(mut cc) = top.object("clientConnection")? {
        if let Some(path) = cc.string("kubeconfig")?.filter(|p| !p.is_empty()) {
            kubeconfig = Some(base.join(path));
        }
        cc.string("acceptContentTypes")?;
        cc.string("contentType")?;
        cc.number("qps")?;
        cc.integer("burst")?;
        cc.finish()?;
    }
    for key in [
        "leaderElection",
        "featureGates",
        "delayCacheUntilActive",
        "enableProfiling",
        "enableContentionProfiling",
        "parallelism",
        "percentageOfNodesToScore",
    ] {
        top.ignore(key);
    }
    let backoff = |top: &mut Obj, key: &str, default: u64| -> FieldResult<Duration> {
        match top.integer(key)? {
            None => Ok(Duration::from_secs(default)),
            Some(n) if n > 0 => Ok(Duration::from_secs(n.unsigned_abs())),
            Some(n) => Err((key.to_owned(), format!("must be greater than 0, got {n}"))),
        }
    };
    let pod_initial_backoff = backoff(&mut top, "podInitialBackoffSeconds", 1)?;
    let pod_max_backoff = backoff(&mut top, "podMaxBackoffSeconds", 10)?;
    if pod_max_backoff < pod_initial_backoff {
        return Err((
            "podMaxBackoffSeconds".into(),
            "must be greater than or equal to podInitialBackoffSeconds".into(),
        ));
    }

    let mut scheduler_names = Vec::new();
    for (i, item) in top.array("profiles")?.into_iter().enumerate() {
        let path = format!("profiles[{i}]");
        let mut p = Obj::new(&path, item)?;
        let name = p
            .string("schedulerName")?
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| DEFAULT_SCHEDULER_NAME.to_owned());
        p.ignore("plugins");
        p.ignore("pluginConfig");
        p.ignore("percentageOfNodesToScore");
        p.finish()?;
        if scheduler_names.contains(&name) {
            return Err((
                format!("{path}.schedulerName"),
                format!("duplicate profile {name:?}"),
            ));
        }
        scheduler_names.push(name);
    }
    if scheduler_names.is_empty() {
        scheduler_names.push(DEFAULT_SCHEDULER_NAME.to_owned());
    }

    let mut extenders = Vec::new();
    for (i, item) in top.array("extenders")?.into_iter().enumerate() {
        extenders.push(decode_extender(&format!("extenders[{i}]"), item)?);
    }
    if let Some(second) = extenders
        .iter()
        .enumerate()
        .filter(|(_, e)| e.is_binder())
        .nth(1)
    {
        return Err((
            format!("extenders[{}].bindVerb", second.0),
            "only one extender can implement bind".into(),
        ));
    }
    top.finish()?;
    Ok(SchedulerConfig {
        kubeconfig,
        scheduler_names,
        extenders,
        pod_initial_backoff,
        pod_max_backoff,
    })
}

fn decode_extender(path: &str, item: Value) -> FieldResult<ExtenderConfig> {
    let mut e = Obj::new(path, item)?;
    let url_prefix = e.string("urlPrefix")?.unwrap_or_default();
    if url_prefix.is_empty() {
        return Err((e.child("urlPrefix"), "missing".into()));
    }
    let filter_verb = e.string("filterVerb")?.unwrap_or_default();
    let preempt_verb = e.string("preemptVerb")?.unwrap_or_default();
    let prioritize_verb = e.string("prioritizeVerb")?.unwrap_or_default();
    let bind_verb = e.string("bindVerb")?.unwrap_or_default();
    let weight = e.integer("weight")?.unwrap_or(0);
    if !prioritize_verb.is_empty() && weight <= 0 {
        return Err((
            e.child("weight"),
            format!("must be greater than 0 when prioritizeVerb is set, got {weight}"),
        ));
    }
    if e.boolean("enableHTTPS")?.unwrap_or(false) {
        return Err((
            e.child("enableHTTPS"),
            "not supported: the stand-in scheduler speaks plain HTTP only".into(),
        ));
    }
    if e.take("tlsConfig").is_some() {
        return Err((
            e.child("tlsConfig"),
            "not supported: the stand-in scheduler speaks plain HTTP only".into(),
        ));
    }
    match url_prefix.split_once("://") {
        Some(("http", rest)) if !rest.is_empty() => {}
        Some(("https", _)) => {
            return Err((
                e.child("urlPrefix"),
                "https is not supported: the stand-in scheduler speaks plain HTTP only".into(),
            ));
        }
        _ => {
            return Err((
                e.child("urlPrefix"),
                format!("{url_prefix:?} is not an http:// URL"),
            ));
        }
    }
    if url_prefix.parse::<http::Uri>().is_err() {
        return Err((
            e.child("urlPrefix"),
            format!("{url_prefix:?} is not a valid URL"),
        ));
    }
    let http_timeout = match e.string("httpTimeout")? {
        None => DEFAULT_EXTENDER_TIMEOUT,
        Some(text) => match parse_go_duration(&text) {
            Ok(d) if d.is_zero() => DEFAULT_EXTENDER_TIMEOUT,
            Ok(d) => d,
            Err(msg) => return Err((e.child("httpTimeout"), msg)),
        },
    };
    let node_cache_capable = e.boolean("nodeCacheCapable")?.unwrap_or(false);
    let ignorable = e.boolean("ignorable")?.unwrap_or(false);
    let mut managed_resources: Vec<ManagedResource> = Vec::new();
    for (j, m) in e.array("managedResources")?.into_iter().enumerate() {
        let mpath = format!("{path}.managedResources[{j}]");
        let mut m = Obj::new(&mpath, m)?;
        let name = m.string("name")?.unwrap_or_default();
        if name.is_empty() {
            return Err((format!("{mpath}.name"), "missing".into()));
        }
        if !is_extended_resource_name(&name) {
            return Err((
                format!("{mpath}.name"),
                format!(
                    "{name:?} is not an extended resource name (domain/name, not kubernetes.io/)"
                ),
            ));
        }
        if managed_resources.iter().any(|r| r.name == name) {
            return Err((
                format!("{mpath}.name"),
                format!("duplicate managed resource {name:?}"),
            ));
        }
        let ignored_by_scheduler = m.boolean("ignoredByScheduler")?.unwrap_or(false);
        m.finish()?;
        managed_resources.push(ManagedResource {
            name,
            ignored_by_scheduler,
        });
    }
    e.finish()?;
    Ok(ExtenderConfig {
        url_prefix,
        filter_verb,
        preempt_verb,
        prioritize_verb,
        weight,
        bind_verb,
        http_timeout,
        node_cache_capable,
        managed_resources,
        ignorable,
    })
}

/// An extended resource name: `domain/name`, the domain not
/// `kubernetes.io` nor one of its subdomains, and not `requests.` prefixed.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    let native = domain == "kubernetes.io" || domain.ends_with(".kubernetes.io");
    !native
        && !domain.is_empty()
        && !rest.is_empty()
        && !rest.contains('/')
        && !name.starts_with("requests.")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._/".contains(c))
}

/// Parses a Go `time.Duration` string (`5s`, `1m30s`, `500ms`, `1.5h`,
/// `0`); negative durations are refused.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (like 5s, 1m30s, 500ms)");
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.starts_with('-') {
        return Err(format!("{text:?}: must not be negative"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number = &rest[..num_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad());
        }
        let value: f64 = number.parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total_nanos += value * unit;
    }
    // Go's Duration is an int64 of nanoseconds: about 292 years.
    if total_nanos > i64::MAX as f64 {
        return Err(format!("{text:?}: too long"));
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SchedulerConfig, ConfigError> {
        SchedulerConfig::parse(text, "cfg.yaml", Path::new("/etc/sched"))
    }

    fn err(text: &str) -> String {
        let e = parse(text).expect_err("must be refused").to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    const GOOD: &str = r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: kubeconfig.yaml
  qps: 50
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: tessera-scheduler
    plugins: {score: {disabled: [{name: "*"}]}}
extenders:
  - urlPrefix: http://127.0.0.1:12345/scheduler
    filterVerb: filter
    prioritizeVerb: prioritize
    preemptVerb: preempt
    bindVerb: bind
    weight: 2
    httpTimeout: 1m30s
    nodeCacheCapable: true
    managedResources:
      - name: nvidia.com/gpu
        ignoredByScheduler: true
      - name: nvidia.com/gpumem
    ignorable: false
  - urlPrefix: http://other:80
    filterVerb: f
"#;

    #[test]
    fn good_yaml_is_read_with_defaults() {
        let c = parse(GOOD).expect("good config");
        assert_eq!(
            c.kubeconfig,
            Some(PathBuf::from("/etc/sched/kubeconfig.yaml"))
        );
        assert_eq!(c.scheduler_names, vec!["tessera-scheduler".to_owned()]);
        assert_eq!(c.extenders.len(), 2);
        let e = &c.extenders[0];
        assert_eq!(e.url_prefix, "http://127.0.0.1:12345/scheduler");
        assert_eq!(e.filter_verb, "filter");
        assert_eq!(e.prioritize_verb, "prioritize");
        assert_eq!(e.preempt_verb, "preempt");
        assert_eq!(e.bind_verb, "bind");
        assert_eq!(e.weight, 2);
        assert_eq!(e.http_timeout, Duration::from_secs(90));
        assert!(e.node_cache_capable);
        assert!(!e.ignorable);
        assert_eq!(
            e.managed_resources,
            vec![
                ManagedResource {
                    name: "nvidia.com/gpu".into(),
                    ignored_by_scheduler: true
                },
                ManagedResource {
                    name: "nvidia.com/gpumem".into(),
                    ignored_by_scheduler: false
                },
            ]
        );
        let d = &c.extenders[1];
        assert_eq!(d.http_timeout, Duration::from_secs(5));
        assert_eq!(d.weight, 0);
        assert!(!d.node_cache_capable && !d.is_binder());
        assert_eq!(c.pod_initial_backoff, Duration::from_secs(1));
        assert_eq!(c.pod_max_backoff, Duration::from_secs(10));
        assert_eq!(
            c.ignored_resources().into_iter().collect::<Vec<_>>(),
            vec!["nvidia.com/gpu".to_owned()]
        );
    }

    #[test]
    fn json_and_minimal_configs_work() {
        let c = parse(r#"{"apiVersion":"kubescheduler.config.k8s.io/v1","kind":"KubeSchedulerConfiguration"}"#)
            .expect("minimal");
        assert_eq!(c.scheduler_names, vec![DEFAULT_SCHEDULER_NAME.to_owned()]);
        assert!(c.extenders.is_empty());
        assert_eq!(c.kubeconfig, None);
        let c = parse(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles: [{}, {schedulerName: b}]\n",
        )
        .expect("two profiles");
        assert_eq!(
            c.scheduler_names,
            vec!["default-scheduler".to_owned(), "b".to_owned()]
        );
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let base = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";
        let e = err(&format!("{base}bogus: 1\n"));
        assert_eq!(e, "cfg.yaml: bogus: unknown field");
        let e = err(&format!(
            "{base}extenders:\n  - urlPrefix: http://a\n    filterverb: x\n"
        ));
        assert_eq!(e, "cfg.yaml: extenders[0].filterverb: unknown field");
        let e = err(&format!(
            "{base}extenders:\n  - urlPrefix: http://a\n    managedResources: [{{name: a.b/c, ignored: true}}]\n"
        ));
        assert_eq!(
            e,
            "cfg.yaml: extenders[0].managedResources[0].ignored: unknown field"
        );
        let e = err(&format!("{base}clientConnection: {{kubeConfig: x}}\n"));
        assert_eq!(e, "cfg.yaml: clientConnection.kubeConfig: unknown field");
        let e = err(&format!(
            "{base}profiles: [{{schedulerName: a, extra: 1}}]\n"
        ));
        assert_eq!(e, "cfg.yaml: profiles[0].extra: unknown field");
    }

    #[test]
    fn wrong_api_version_or_kind_is_refused() {
        let e = err(
            "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n",
        );
        assert!(e.starts_with("cfg.yaml: apiVersion: "), "{e}");
        let e = err("apiVersion: kubescheduler.config.k8s.io/v1\nkind: Pod\n");
        assert!(e.starts_with("cfg.yaml: kind: "), "{e}");
        let e = err("kind: KubeSchedulerConfiguration\n");
        assert!(e.contains("apiVersion: missing"), "{e}");
        let e = err("- a\n- b\n");
        assert!(e.contains("expected an object"), "{e}");
        let e = err("apiVersion: [unclosed\n");
        assert!(e.starts_with("cfg.yaml: not YAML or JSON"), "{e}");
    }

    #[test]
    fn extender_rules_are_enforced() {
        let base = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders:\n";
        let cases = [
            (
                "  - {urlPrefix: 'http://a', prioritizeVerb: p}\n",
                "extenders[0].weight: must be greater than 0",
            ),
            (
                "  - {urlPrefix: 'http://a', prioritizeVerb: p, weight: -1}\n",
                "extenders[0].weight: must be greater than 0",
            ),
            (
                "  - {urlPrefix: 'http://a', enableHTTPS: true}\n",
                "extenders[0].enableHTTPS: not supported",
            ),
            (
                "  - {urlPrefix: 'http://a', tlsConfig: {insecure: true}}\n",
                "extenders[0].tlsConfig: not supported",
            ),
            (
                "  - {urlPrefix: 'https://a'}\n",
                "extenders[0].urlPrefix: https is not supported",
            ),
            (
                "  - {urlPrefix: 'a:80'}\n",
                "extenders[0].urlPrefix: \"a:80\" is not an http:// URL",
            ),
            ("  - {filterVerb: f}\n", "extenders[0].urlPrefix: missing"),
            (
                "  - {urlPrefix: 'http://a', httpTimeout: 5}\n",
                "extenders[0].httpTimeout: expected a string",
            ),
            (
                "  - {urlPrefix: 'http://a', httpTimeout: 5x}\n",
                "extenders[0].httpTimeout: \"5x\" is not a duration",
            ),
            (
                "  - {urlPrefix: 'http://a', weight: two}\n",
                "extenders[0].weight: expected an integer",
            ),
            (
                "  - {urlPrefix: 'http://a', ignorable: 'yes'}\n",
                "extenders[0].ignorable: expected true or false",
            ),
            (
                "  - {urlPrefix: 'http://a', bindVerb: b}\n  - {urlPrefix: 'http://b', bindVerb: b}\n",
                "extenders[1].bindVerb: only one extender can implement bind",
            ),
            (
                "  - {urlPrefix: 'http://a', managedResources: [{name: cpu}]}\n",
                "extenders[0].managedResources[0].name: \"cpu\" is not an extended resource name",
            ),
            (
                "  - {urlPrefix: 'http://a', managedResources: [{name: a.io/x}, {name: a.io/x}]}\n",
                "extenders[0].managedResources[1].name: duplicate managed resource",
            ),
            (
                "  - {urlPrefix: 'http://a', managedResources: [{ignoredByScheduler: true}]}\n",
                "extenders[0].managedResources[0].name: missing",
            ),
        ];
        for (body, want) in cases {
            let e = err(&format!("{base}{body}"));
            assert!(
                e.starts_with(&format!("cfg.yaml: {want}")),
                "for {body:?}: got {e:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn duplicate_profiles_are_refused() {
        let e = err(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles: [{schedulerName: a}, {schedulerName: a}]\n",
        );
        assert!(
            e.contains("profiles[1].schedulerName: duplicate profile"),
            "{e}"
        );
    }

    #[test]
    fn go_durations() {
        let ok = [
            ("5s", Duration::from_secs(5)),
            ("1m30s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(5400)),
            ("250us", Duration::from_micros(250)),
            ("3µs", Duration::from_micros(3)),
            ("10ns", Duration::from_nanos(10)),
            ("0", Duration::ZERO),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_go_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "5", "s", "1.2.3s", "5d", "-1s", "1s2", ".s", "1 s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn zero_timeout_means_the_default() {
        let c = parse("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders: [{urlPrefix: 'http://a', httpTimeout: 0s}]\n").expect("ok");
        assert_eq!(c.extenders[0].http_timeout, DEFAULT_EXTENDER_TIMEOUT);
    }
}
