//! The control plane's kube-like API server (issue 14). This slice holds who may call it:
//! [`auth`] turns a bearer token or a client certificate into an [`auth::Identity`] and decides
//! what that identity may do; [`request`] reads what a request asks for (resource, verb) from its
//! method, path and query. Pure logic: the HTTPS server that calls them comes next.

pub mod auth;
pub mod kinds;
pub mod request;
