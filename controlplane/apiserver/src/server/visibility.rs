//! Which objects a caller may see: everything, or (a VM agent) only the objects whose span
//! includes its VM.

use serde_json::Value;
use sluice_apimachinery::KindSpec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    All,
    Span { vm: String },
}

impl Visibility {
    pub fn allows(&self, spec: &KindSpec, object: &Value) -> bool {
        match self {
            Visibility::All => true,
            Visibility::Span { vm } => crate::kinds::in_span(spec, object, vm),
        }
    }
}
