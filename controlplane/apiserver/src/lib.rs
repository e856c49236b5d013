//! The control plane's kube-like API server (issue 14): [`server`] serves the kinds of
//! [`kinds`] over HTTPS with Kubernetes API conventions, stored in a `sluice-store`; [`auth`]
//! turns a bearer token or a client certificate into an [`auth::Identity`] and decides what
//! that identity may do; [`request`] reads what a request asks for from its method, path and
//! query; [`events`] records core v1 Events about the objects. `auth`, `request`, `kinds` and
//! `events::book` are pure; `server` and the events' writer are the I/O.

pub mod auth;
pub mod bootstrap;
pub mod events;
pub mod kinds;
pub mod request;
pub mod server;
