//! Discovery documents: `/version`, `/api`, `/apis`, `/api/v1`,
//! `/apis/<group>/<version>`, built from [`crate::resources::RESOURCES`].

/// The JSON document served at `path` (no query), or `None` when `path` is
/// not a discovery path. `server_address` is `host:port` as the client
/// reached the server (for `serverAddressByClientCIDRs`).
pub fn document(path: &str, server_address: &str) -> Option<serde_json::Value> {
    let _ = (path, server_address);
    None
}
