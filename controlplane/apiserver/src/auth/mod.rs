//! Authentication and authorization. Every caller is one of four roles, named in its token or
//! certificate; there is no anonymous access.
//!
//! | role | may |
//! |---|---|
//! | `admin` | everything |
//! | `gateway` | get, list, watch UpstreamClusters; update and patch their `status` |
//! | `node` | get, list, watch Agents; update and patch their `status` (the nodes holding each) |
//! | `vm-agent` | get, list, watch the policy objects whose span includes its own VM (the subject) |

mod identity;
mod rbac;
pub mod review;
pub mod review_proto;
mod token;

pub use identity::{AuthError, Identity, Role};
pub use rbac::{authorize, Decision, Denied, Request, Verb};
pub use token::{digest, issue, IssuedToken, TokenBook, TokenChange, TokenRecord};
