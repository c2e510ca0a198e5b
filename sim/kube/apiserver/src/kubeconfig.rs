//! `--kubeconfig-out FILE`: a kubeconfig naming the stand-in (plain HTTP,
//! no credentials), written atomically once the socket listens so a reader
//! that sees the file can connect.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// The name of the cluster, context and user in the kubeconfig.
pub const NAME: &str = "tessera-sim";

/// The URL clients reach a server listening on `addr` at (a wildcard
/// address is reached through loopback).
pub fn server_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The kubeconfig text for a server at `url`.
pub fn render(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {NAME}\n  cluster:\n    server: {url}\n\
         contexts:\n- name: {NAME}\n  context:\n    cluster: {NAME}\n    user: {NAME}\n\
         current-context: {NAME}\nusers:\n- name: {NAME}\n  user: {{}}\npreferences: {{}}\n"
    )
}

/// Writes the kubeconfig for a server listening on `addr` to `path`.
pub fn write(path: &Path, addr: SocketAddr) -> std::io::Result<()> {
    crate::state::write_atomic(path, render(&server_url(addr)).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_is_yaml_naming_the_server() {
        let url = server_url("0.0.0.0:1234".parse().expect("addr"));
        assert_eq!(url, "http://127.0.0.1:1234");
        let doc: serde_yaml::Value = serde_yaml::from_str(&render(&url)).expect("yaml");
        assert_eq!(
            doc["clusters"][0]["cluster"]["server"].as_str(),
            Some(url.as_str())
        );
        assert_eq!(doc["current-context"].as_str(), Some(NAME));
        assert_eq!(doc["contexts"][0]["context"]["user"].as_str(), Some(NAME));
    }
}
