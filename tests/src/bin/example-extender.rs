//! A tiny scheduler extender for the cluster end-to-end test, speaking
//! kube-scheduler's HTTP + JSON wire format (Go field names) with its own
//! reading of it, independent of the scheduler stand-in's types:
//! - `POST /filter`: keeps the nodes labelled `example.com/dev-ok=true`, fails
//!   the others with `node has no example.com/dev`;
//! - `POST /prioritize`: the node named by `--prefer` (default `node-1`)
//!   gets the top score (10), the others 1;
//! - `POST /bind`: creates the pod's Binding through the API server.
//!
//! Every call is appended as one JSON line to `--record`. Works the same
//! behind a real kube-scheduler.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use axum::Json;
use axum::extract::State;
use axum::routing::post;
use clap::Parser;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// The label a node needs to pass the filter.
const LABEL: &str = "example.com/dev-ok";
/// The reason given for a node without it.
const REASON: &str = "node has no example.com/dev";

#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Where to write the address actually bound (for port 0).
    #[arg(long)]
    address_out: Option<PathBuf>,
    /// The kubeconfig for bind (and for node labels when nodeCacheCapable);
    /// read at the first call that needs it, so it may not exist yet at start.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// A file to append one JSON line per call to.
    #[arg(long)]
    record: Option<PathBuf>,
    /// The node prioritize scores highest.
    #[arg(long, default_value = "node-1")]
    prefer: String,
}

/// How long one request to the API server may take.
const API_TIMEOUT: Duration = Duration::from_secs(10);

struct Ctx {
    kubeconfig: PathBuf,
    client: tokio::sync::OnceCell<kube::Client>,
    record: Option<PathBuf>,
    prefer: String,
}

impl Ctx {
    async fn client(&self) -> Result<kube::Client, String> {
        self.client
            .get_or_try_init(|| async {
                let config = kube::config::Kubeconfig::read_from(&self.kubeconfig)
                    .map_err(|e| format!("{}: {e}", self.kubeconfig.display()))?;
                let options = kube::config::KubeConfigOptions::default();
                let config = kube::Config::from_custom_kubeconfig(config, &options)
                    .await
                    .map_err(|e| e.to_string())?;
                kube::Client::try_from(config).map_err(|e| e.to_string())
            })
            .await
            .cloned()
    }

    fn record(&self, line: &Value) {
        eprintln!("example-extender: {line}");
        if let Some(path) = &self.record {
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| writeln!(f, "{line}"));
        }
    }
}

fn pod_key(args: &Value) -> String {
    let meta = &args["Pod"]["metadata"];
    format!(
        "{}/{}",
        meta["namespace"].as_str().unwrap_or(""),
        meta["name"].as_str().unwrap_or("")
    )
}

fn labelled(node: &Value) -> bool {
    node["metadata"]["labels"][LABEL] == "true"
}

async fn filter(State(ctx): State<Arc<Ctx>>, Json(args): Json<Value>) -> Json<Value> {
    let mut failed = serde_json::Map::new();
    let reply = if let Some(names) = args["NodeNames"].as_array() {
        // nodeCacheCapable: names only; read the labels from the API server.
        let nodes: Option<Api<Node>> = ctx.client().await.ok().map(Api::all);
        let mut passed = Vec::new();
        for name in names.iter().filter_map(Value::as_str) {
            let node = match &nodes {
                Some(api) => tokio::time::timeout(API_TIMEOUT, api.get(name))
                    .await
                    .ok()
                    .and_then(Result::ok),
                None => None,
            };
            let ok = node
                .and_then(|n| serde_json::to_value(n).ok())
                .is_some_and(|n| labelled(&n));
            if ok {
                passed.push(json!(name));
            } else {
                failed.insert(name.to_owned(), json!(REASON));
            }
        }
        json!({"NodeNames": passed, "FailedNodes": failed, "Error": ""})
    } else {
        let items = args["Nodes"]["items"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let (passed, rejected): (Vec<Value>, Vec<Value>) = items.into_iter().partition(labelled);
        for node in rejected {
            let name = node["metadata"]["name"].as_str().unwrap_or("").to_owned();
            failed.insert(name, json!(REASON));
        }
        json!({"Nodes": {"items": passed}, "FailedNodes": failed, "Error": ""})
    };
    ctx.record(&json!({"verb": "filter", "pod": pod_key(&args), "reply": reply}));
    Json(reply)
}

async fn prioritize(State(ctx): State<Arc<Ctx>>, Json(args): Json<Value>) -> Json<Value> {
    let names: Vec<String> = match args["NodeNames"].as_array() {
        Some(names) => names
            .iter()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect(),
        None => args["Nodes"]["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
            .collect(),
    };
    let scores: Vec<Value> = names
        .iter()
        .map(|n| json!({"Host": n, "Score": if *n == ctx.prefer { 10 } else { 1 }}))
        .collect();
    ctx.record(&json!({"verb": "prioritize", "pod": pod_key(&args), "reply": scores}));
    Json(Value::Array(scores))
}

async fn bind(State(ctx): State<Arc<Ctx>>, Json(args): Json<Value>) -> Json<Value> {
    let text = |k: &str| args[k].as_str().unwrap_or("").to_owned();
    let (name, namespace, uid, node) = (
        text("PodName"),
        text("PodNamespace"),
        text("PodUID"),
        text("Node"),
    );
    let binding = Binding {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid: Some(uid).filter(|u| !u.is_empty()),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.clone()),
            ..Default::default()
        },
    };
    let outcome = match ctx.client().await {
        Ok(client) => tokio::time::timeout(
            API_TIMEOUT,
            Api::<Pod>::namespaced(client, &namespace).create_subresource::<Binding, Value>(
                "binding",
                &name,
                &PostParams::default(),
                &binding,
            ),
        )
        .await
        .map_err(|_| format!("no answer from the API server in {API_TIMEOUT:?}"))
        .and_then(|r| r.map(|_| ()).map_err(|e| e.to_string())),
        Err(e) => Err(e),
    };
    let error = outcome.err().unwrap_or_default();
    ctx.record(&json!({"verb": "bind", "pod": format!("{namespace}/{name}"), "node": node, "error": error}));
    Json(json!({"Error": error}))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let ctx = Arc::new(Ctx {
        kubeconfig: args.kubeconfig,
        client: tokio::sync::OnceCell::new(),
        record: args.record,
        prefer: args.prefer,
    });
    let app = axum::Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .with_state(ctx);
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let address = listener.local_addr()?;
    eprintln!("example-extender: listening on http://{address}");
    if let Some(out) = &args.address_out {
        let tmp = out.with_extension("tmp");
        std::fs::write(&tmp, address.to_string())?;
        std::fs::rename(&tmp, out)?;
    }
    axum::serve(listener, app).await?;
    Ok(())
}
