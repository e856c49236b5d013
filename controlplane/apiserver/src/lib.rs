//! The control plane's kube-like API server (issue 14). This slice holds who may call it:
//! [`auth`] turns a bearer token or a client certificate into an [`auth::Identity`] and decides
//! what that identity may do. Pure logic: the HTTPS server that calls it comes next.

pub mod auth;
