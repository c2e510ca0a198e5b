//! The HTTP client for one extender: POST `<urlPrefix>/<verb>` with a JSON
//! body, 200 and a JSON reply expected, within `httpTimeout`.

use std::collections::BTreeSet;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::ExtenderConfig;
use crate::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, FailedNodesMap,
    HostPriorityList, NodeList, decode_reply,
};

/// The largest reply read from an extender.
const MAX_REPLY_BYTES: usize = 64 << 20;

/// What went wrong talking to an extender; the texts follow kube-scheduler's
/// where it has one (they end up in FailedScheduling events).
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    /// The request did not get an answer.
    #[error("Post \"{url}\": {message}")]
    Transport {
        /// The URL posted to.
        url: String,
        /// Why.
        message: String,
    },
    /// No answer within `httpTimeout`.
    #[error("Post \"{url}\": no answer within {timeout:?} (httpTimeout)")]
    Timeout {
        /// The URL posted to.
        url: String,
        /// The timeout.
        timeout: std::time::Duration,
    },
    /// A status other than 200.
    #[error("failed {verb} with extender at URL {url}, code {code}")]
    Status {
        /// The verb.
        verb: String,
        /// The URL posted to.
        url: String,
        /// The HTTP status code.
        code: u16,
    },
    /// The reply is not the JSON expected.
    #[error("extender at URL {url}: bad {verb} reply: {message}")]
    Decode {
        /// The verb.
        verb: String,
        /// The URL posted to.
        url: String,
        /// Why.
        message: String,
    },
    /// The extender reported an error (`Error` in its reply).
    #[error("{0}")]
    Reported(String),
    /// A filter reply named a node that was not sent.
    #[error(
        "extender {url:?} claims a filtered node {node:?} which is not found in the input node list"
    )]
    UnknownNode {
        /// The extender's urlPrefix.
        url: String,
        /// The node named.
        node: String,
    },
}

/// What the filter verb decided.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FilterOutcome {
    /// Nodes that passed, in the extender's order.
    pub passed: Vec<String>,
    /// Nodes that failed (preemption might help), with reasons.
    pub failed: FailedNodesMap,
    /// Nodes that failed for good, with reasons.
    pub failed_and_unresolvable: FailedNodesMap,
}

/// One configured extender and an HTTP client for it.
#[derive(Clone, Debug)]
pub struct Extender {
    /// Its configuration.
    pub config: ExtenderConfig,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Extender {
    /// A client for one `extenders[]` entry.
    pub fn new(config: ExtenderConfig) -> Extender {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.http_timeout));
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Extender { config, http }
    }

    fn url(&self, verb: &str) -> String {
        format!("{}/{verb}", self.config.url_prefix.trim_end_matches('/'))
    }

    async fn send<A: Serialize, R: DeserializeOwned + Default>(
        &self,
        verb: &str,
        args: &A,
    ) -> Result<R, ExtenderError> {
        let url = self.url(verb);
        let body = serde_json::to_vec(args).map_err(|e| ExtenderError::Decode {
            verb: verb.to_owned(),
            url: url.clone(),
            message: format!("encoding the request: {e}"),
        })?;
        let transport = |message: String| ExtenderError::Transport {
            url: url.clone(),
            message,
        };
        let request = http::Request::post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| transport(e.to_string()))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| transport(error_chain(&e)))?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_REPLY_BYTES)
                .collect()
                .await
                .map_err(|e| transport(format!("reading the reply: {e}")))?
                .to_bytes();
            Ok::<_, ExtenderError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.config.http_timeout, exchange)
            .await
            .map_err(|_| ExtenderError::Timeout {
                url: url.clone(),
                timeout: self.config.http_timeout,
            })??;
        if status != http::StatusCode::OK {
            return Err(ExtenderError::Status {
                verb: verb.to_owned(),
                url,
                code: status.as_u16(),
            });
        }
        decode_reply(&bytes).map_err(|e| ExtenderError::Decode {
            verb: verb.to_owned(),
            url,
            message: e.to_string(),
        })
    }

    fn args(&self, pod: &Pod, nodes: &[Node]) -> ExtenderArgs {
        if self.config.node_cache_capable {
            ExtenderArgs {
                pod: Some(pod.clone()),
                nodes: None,
                node_names: Some(
                    nodes
                        .iter()
                        .map(|n| n.metadata.name.clone().unwrap_or_default())
                        .collect(),
                ),
            }
        } else {
            ExtenderArgs {
                pod: Some(pod.clone()),
                nodes: Some(NodeList {
                    items: nodes.to_vec(),
                    ..Default::default()
                }),
                node_names: None,
            }
        }
    }

    /// The filter verb over `nodes`; without a filterVerb every node passes.
    pub async fn filter(&self, pod: &Pod, nodes: &[Node]) -> Result<FilterOutcome, ExtenderError> {
        let sent: BTreeSet<String> = nodes
            .iter()
            .map(|n| n.metadata.name.clone().unwrap_or_default())
            .collect();
        if self.config.filter_verb.is_empty() {
            return Ok(FilterOutcome {
                passed: sent.into_iter().collect(),
                ..Default::default()
            });
        }
        let result: ExtenderFilterResult = self
            .send(&self.config.filter_verb, &self.args(pod, nodes))
            .await?;
        if !result.error.is_empty() {
            return Err(ExtenderError::Reported(result.error));
        }
        // As kube-scheduler: NodeNames count only from a nodeCacheCapable
        // extender, and only there is a name not sent an error; else Nodes
        // (whose unsent entries kube-scheduler would fail on later, when it
        // finds no such node to score: dropped here); neither means no node
        // passed. Failed entries are recorded whatever node they name.
        let passed = match (result.node_names, result.nodes) {
            (Some(names), _) if self.config.node_cache_capable => {
                if let Some(node) = names.iter().find(|n| !sent.contains(*n)) {
                    return Err(ExtenderError::UnknownNode {
                        url: self.config.url_prefix.clone(),
                        node: node.clone(),
                    });
                }
                names
            }
            (_, Some(list)) => {
                let (known, unknown): (Vec<String>, Vec<String>) =
                    list.names().into_iter().partition(|n| sent.contains(n));
                if !unknown.is_empty() {
                    tracing::warn!(
                        extender = %self.config.url_prefix,
                        nodes = ?unknown,
                        "filter reply passes nodes it was not sent; ignored"
                    );
                }
                known
            }
            (Some(_), None) => {
                tracing::warn!(
                    extender = %self.config.url_prefix,
                    "filter reply has NodeNames but no Nodes, and the extender is not nodeCacheCapable: no node passes"
                );
                Vec::new()
            }
            (None, None) => Vec::new(),
        };
        Ok(FilterOutcome {
            passed,
            failed: result.failed_nodes,
            failed_and_unresolvable: result.failed_and_unresolvable_nodes,
        })
    }

    /// The prioritize verb over `nodes`, scores as the extender gave them
    /// (not yet weighted); `None` without a prioritizeVerb.
    pub async fn prioritize(
        &self,
        pod: &Pod,
        nodes: &[Node],
    ) -> Result<Option<HostPriorityList>, ExtenderError> {
        if self.config.prioritize_verb.is_empty() {
            return Ok(None);
        }
        self.send(&self.config.prioritize_verb, &self.args(pod, nodes))
            .await
            .map(Some)
    }

    /// The bind verb.
    pub async fn bind(&self, pod: &Pod, node: &str) -> Result<(), ExtenderError> {
        let args = ExtenderBindingArgs {
            pod_name: pod.metadata.name.clone().unwrap_or_default(),
            pod_namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            node: node.to_owned(),
        };
        let result: ExtenderBindingResult = self.send(&self.config.bind_verb, &args).await?;
        if result.error.is_empty() {
            Ok(())
        } else {
            Err(ExtenderError::Reported(result.error))
        }
    }
}

/// An error and its sources on one line ("connection refused" lives in a
/// source of hyper's error).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_EXTENDER_TIMEOUT;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one canned HTTP reply per connection, after `delay`.
    async fn server(status: u16, body: &'static str, delay: Duration) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/x", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let _ = s.read(&mut buf).await;
                    tokio::time::sleep(delay).await;
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        url
    }

    fn extender(url: &str, node_cache_capable: bool) -> Extender {
        Extender::new(ExtenderConfig {
            url_prefix: url.to_owned(),
            filter_verb: "filter".into(),
            preempt_verb: String::new(),
            prioritize_verb: "prioritize".into(),
            weight: 1,
            bind_verb: "bind".into(),
            http_timeout: DEFAULT_EXTENDER_TIMEOUT,
            node_cache_capable,
            managed_resources: Vec::new(),
            ignorable: false,
        })
    }

    fn nodes(names: &[&str]) -> Vec<Node> {
        names
            .iter()
            .map(|n| Node {
                metadata: ObjectMeta {
                    name: Some((*n).into()),
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect()
    }

    #[tokio::test]
    async fn filter_reply_is_read_case_insensitively() {
        let url = server(
            200,
            r#"{"nodenames":["a"],"failednodes":{"b":"full"}}"#,
            Duration::ZERO,
        )
        .await;
        let out = extender(&url, true)
            .filter(&Pod::default(), &nodes(&["a", "b"]))
            .await
            .expect("filter");
        assert_eq!(out.passed, vec!["a"]);
        assert_eq!(out.failed.get("b").map(String::as_str), Some("full"));
        // Not nodeCacheCapable: NodeNames do not count, as in kube-scheduler.
        let out = extender(&url, false)
            .filter(&Pod::default(), &nodes(&["a", "b"]))
            .await
            .expect("filter");
        assert!(out.passed.is_empty());
    }

    #[tokio::test]
    async fn errors_have_kube_scheduler_wording() {
        let url = server(500, "{}", Duration::ZERO).await;
        let e = extender(&url, true)
            .filter(&Pod::default(), &nodes(&["a"]))
            .await
            .expect_err("500");
        assert_eq!(
            e.to_string(),
            format!("failed filter with extender at URL {url}/filter, code 500")
        );
        let url = server(200, r#"{"Error":"no GPU model fits"}"#, Duration::ZERO).await;
        let e = extender(&url, true)
            .bind(&Pod::default(), "a")
            .await
            .expect_err("reported");
        assert_eq!(e.to_string(), "no GPU model fits");
        let url = server(200, r#"{"NodeNames":["ghost"]}"#, Duration::ZERO).await;
        let e = extender(&url, true)
            .filter(&Pod::default(), &nodes(&["a"]))
            .await
            .expect_err("unknown node");
        assert!(matches!(e, ExtenderError::UnknownNode { ref node, .. } if node == "ghost"));
        let url = server(200, "not json", Duration::ZERO).await;
        let e = extender(&url, true)
            .prioritize(&Pod::default(), &nodes(&["a"]))
            .await
            .expect_err("bad json");
        assert!(e.to_string().contains("bad prioritize reply"), "{e}");
    }

    #[tokio::test]
    async fn only_passed_node_names_must_have_been_sent() {
        // Failed entries naming other nodes are kept, as kube-scheduler
        // records them.
        let url = server(
            200,
            r#"{"NodeNames":["a"],"FailedNodes":{"b":"full","gone":"deleted"},"FailedAndUnresolvableNodes":{"old":"never"}}"#,
            Duration::ZERO,
        )
        .await;
        let out = extender(&url, true)
            .filter(&Pod::default(), &nodes(&["a", "b"]))
            .await
            .expect("failed entries for unsent nodes are no error");
        assert_eq!(out.passed, vec!["a"]);
        assert_eq!(out.failed.get("gone").map(String::as_str), Some("deleted"));
        assert_eq!(
            out.failed_and_unresolvable.get("old").map(String::as_str),
            Some("never")
        );
        // Whole nodes from an extender that is not nodeCacheCapable: one not
        // sent is dropped, not an error.
        let url = server(
            200,
            r#"{"Nodes":{"items":[{"metadata":{"name":"ghost"}},{"metadata":{"name":"a"}}]}}"#,
            Duration::ZERO,
        )
        .await;
        let out = extender(&url, false)
            .filter(&Pod::default(), &nodes(&["a", "b"]))
            .await
            .expect("unsent whole node");
        assert_eq!(out.passed, vec!["a"]);
        // A null reply passes no node; trailing bytes are ignored.
        let url = server(200, "null", Duration::ZERO).await;
        let out = extender(&url, true)
            .filter(&Pod::default(), &nodes(&["a"]))
            .await
            .expect("null");
        assert_eq!(out, FilterOutcome::default());
        let url = server(200, r#"{"NodeNames":["a"]}garbage"#, Duration::ZERO).await;
        let out = extender(&url, true)
            .filter(&Pod::default(), &nodes(&["a"]))
            .await
            .expect("trailing bytes");
        assert_eq!(out.passed, vec!["a"]);
    }

    #[tokio::test]
    async fn slow_replies_time_out() {
        let url = server(200, "{}", Duration::from_secs(5)).await;
        let mut ext = extender(&url, true);
        ext.config.http_timeout = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let e = ext
            .filter(&Pod::default(), &nodes(&["a"]))
            .await
            .expect_err("timeout");
        assert!(matches!(e, ExtenderError::Timeout { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
