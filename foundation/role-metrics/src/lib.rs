//! The metrics every Sluice role exports on its `/metrics`, whatever runtime serves it (the data
//! plane's monoio admin endpoint, the control plane's and the VM agent's tokio servers): the
//! `process_*` families, `sluice_build_info` with the git revision, and certificate expiry.

mod build_info;
mod cert_expiry;
mod process;

pub use build_info::{register_build_info, REVISION};
pub use cert_expiry::{earliest_not_after, CertificateError, CertificateExpiry};
pub use process::{ProcError, ProcFile, ProcessCollector};
