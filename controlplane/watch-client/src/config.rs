//! What to watch and how to reach the API server.

use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// How to reach the control plane's API server and the bounds the client holds it to.
#[derive(Debug, Clone)]
pub struct WatchClientConfig {
    /// The server's base URL, `https://host:port` (no path).
    pub url: String,
    /// PEM file of the CA(s) the server's certificate must chain to.
    pub ca_file: PathBuf,
    /// File holding the bearer token; read again before every request, so a rotated token is
    /// picked up at the next reconnect. `None`: no `Authorization` header (client cert only).
    pub token_file: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub client_cert: Option<ClientCertFiles>,
    /// TCP connect plus TLS handshake.
    pub connect_timeout: Duration,
    /// A whole LIST page: headers and body.
    pub request_timeout: Duration,
    /// `timeoutSeconds` of a watch: the server ends it then and the client re-watches from the
    /// last resourceVersion. The client gives up on a silent stream `watch_grace` later.
    pub watch_timeout: Duration,
    /// How much longer than `watch_timeout` a watch may stay open before the client treats
    /// the connection as dead (a half-open TCP connection sends nothing).
    pub watch_grace: Duration,
    /// First retry delay after a failure; doubles up to `backoff_max`, with jitter.
    pub backoff_min: Duration,
    /// Largest retry delay.
    pub backoff_max: Duration,
    /// `limit` of a LIST page.
    pub page_size: u32,
    /// Largest watch event line (one object plus its envelope). A longer line ends the watch
    /// with an error instead of growing a buffer for a hostile or broken server.
    pub max_event_bytes: usize,
    /// Largest LIST page body.
    pub max_list_page_bytes: usize,
    /// Offer h2 in ALPN: if the server takes it, all requests of one
    /// [`Transport`](crate::Transport) share one connection. `false`: HTTP/1.1 only, one
    /// connection per request (a load generator that wants many connections).
    pub http2: bool,
}

/// A client certificate and its key, PEM files.
#[derive(Debug, Clone)]
pub struct ClientCertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl WatchClientConfig {
    /// Defaults close to client-go's reflector: 5 min watches, 500-item pages, 0.8 s to 30 s
    /// backoff; objects up to 3 MiB (etcd's default request limit is 1.5 MiB).
    pub fn new(url: impl Into<String>, ca_file: impl Into<PathBuf>) -> Self {
        Self {
            url: url.into(),
            ca_file: ca_file.into(),
            token_file: None,
            client_cert: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            watch_timeout: Duration::from_secs(300),
            watch_grace: Duration::from_secs(30),
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            page_size: 500,
            max_event_bytes: 3 << 20,
            max_list_page_bytes: 64 << 20,
            http2: true,
        }
    }
}

/// One resource (optionally narrowed by namespace and selectors) to mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// API group (`sluice.dev`); empty for the core group.
    pub group: String,
    /// API version (`v1alpha1`).
    pub version: String,
    /// Plural resource name (`upstreamclusters`).
    pub plural: String,
    /// Only this namespace; `None`: cluster-scoped, or all namespaces.
    pub namespace: Option<String>,
    /// `labelSelector`, sent as is.
    pub label_selector: Option<String>,
    /// `fieldSelector`, sent as is.
    pub field_selector: Option<String>,
}

/// Path segments are taken from config, never from the server, but still encoded so that a
/// stray `/` or `?` cannot change the request.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_');
/// Query values: everything but unreserved characters.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl Resource {
    /// A resource of `group/version` in all namespaces, no selectors.
    pub fn new(
        group: impl Into<String>,
        version: impl Into<String>,
        plural: impl Into<String>,
    ) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            namespace: None,
            label_selector: None,
            field_selector: None,
        }
    }

    /// `/apis/<g>/<v>/[namespaces/<ns>/]<plural>` (`/api/v1/...` for the core group).
    pub fn path(&self) -> String {
        let segment = |text: &str| utf8_percent_encode(text, SEGMENT).to_string();
        let mut path = if self.group.is_empty() {
            format!("/api/{}", segment(&self.version))
        } else {
            format!("/apis/{}/{}", segment(&self.group), segment(&self.version))
        };
        if let Some(namespace) = &self.namespace {
            path.push_str("/namespaces/");
            path.push_str(&segment(namespace));
        }
        path.push('/');
        path.push_str(&segment(&self.plural));
        path
    }

    /// The path and query of one LIST page.
    pub fn list_uri(&self, limit: u32, continue_token: Option<&str>) -> String {
        let mut query = self.selector_query();
        query.push(("limit", limit.to_string()));
        if let Some(token) = continue_token {
            query.push(("continue", token.to_string()));
        }
        with_query(self.path(), &query)
    }

    /// The path and query of a watch from `resource_version` with bookmarks.
    pub fn watch_uri(&self, resource_version: &str, timeout: std::time::Duration) -> String {
        let mut query = self.selector_query();
        query.push(("watch", "1".into()));
        query.push(("resourceVersion", resource_version.to_string()));
        query.push(("allowWatchBookmarks", "true".into()));
        query.push(("timeoutSeconds", timeout.as_secs().max(1).to_string()));
        with_query(self.path(), &query)
    }

    fn selector_query(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        if let Some(selector) = &self.label_selector {
            query.push(("labelSelector", selector.clone()));
        }
        if let Some(selector) = &self.field_selector {
            query.push(("fieldSelector", selector.clone()));
        }
        query
    }
}

fn with_query(mut path: String, query: &[(&str, String)]) -> String {
    for (index, (name, value)) in query.iter().enumerate() {
        path.push(if index == 0 { '?' } else { '&' });
        path.push_str(name);
        path.push('=');
        path.extend(utf8_percent_encode(value, QUERY_VALUE));
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_kube() {
        let mut resource = Resource::new("sluice.dev", "v1alpha1", "agents");
        assert_eq!(resource.path(), "/apis/sluice.dev/v1alpha1/agents");
        resource.namespace = Some("team-a".into());
        assert_eq!(
            resource.path(),
            "/apis/sluice.dev/v1alpha1/namespaces/team-a/agents"
        );
        assert_eq!(Resource::new("", "v1", "pods").path(), "/api/v1/pods");
        let hostile = Resource::new("a/b", "v1?x", "p#q");
        assert_eq!(hostile.path(), "/apis/a%2Fb/v1%3Fx/p%23q");
    }

    #[test]
    fn queries_carry_selectors_paging_and_watch_options() {
        let mut resource = Resource::new("sluice.dev", "v1", "agents");
        resource.label_selector = Some("app in (a,b),tier!=x".into());
        assert_eq!(
            resource.list_uri(500, None),
            "/apis/sluice.dev/v1/agents?labelSelector=app%20in%20%28a%2Cb%29%2Ctier%21%3Dx&limit=500"
        );
        resource.label_selector = None;
        resource.field_selector = Some("metadata.name=n1".into());
        assert_eq!(
            resource.list_uri(2, Some("tok+/=")),
            "/apis/sluice.dev/v1/agents?fieldSelector=metadata.name%3Dn1&limit=2&continue=tok%2B%2F%3D"
        );
        assert_eq!(
            Resource::new("g", "v1", "r").watch_uri("42", std::time::Duration::from_secs(300)),
            "/apis/g/v1/r?watch=1&resourceVersion=42&allowWatchBookmarks=true&timeoutSeconds=300"
        );
    }
}
