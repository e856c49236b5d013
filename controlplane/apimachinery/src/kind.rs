//! Kinds as data: what the server serves is a list of [`KindSpec`]s in a [`Registry`].

use std::collections::BTreeMap;

use serde_json::Value;

use crate::status::FieldError;

/// A column of `kubectl get` (a CRD's `additionalPrinterColumns`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Header, e.g. `Servers`.
    pub name: String,
    /// A simple dotted path such as `.spec.servers` or `.status.conditions[0].type`.
    pub json_path: String,
    /// OpenAPI type of the cell: `string`, `integer`, `number`, `boolean` or `date`.
    pub column_type: String,
    /// Shown by `kubectl explain`-like clients.
    pub description: String,
}

impl PrinterColumn {
    /// A column with the given header, path and type.
    pub fn new(name: &str, json_path: &str, column_type: &str, description: &str) -> Self {
        Self {
            name: name.to_string(),
            json_path: json_path.to_string(),
            column_type: column_type.to_string(),
            description: description.to_string(),
        }
    }
}

/// Kind-specific validation of a whole object; returns every error with its path.
pub type Validator = fn(&Value) -> Vec<FieldError>;

/// Everything the server needs to serve one kind.
#[derive(Debug, Clone)]
pub struct KindSpec {
    /// API group, e.g. `proxy.sluice.dev`.
    pub group: String,
    /// Version, e.g. `v1alpha1`.
    pub version: String,
    /// Kind, e.g. `UpstreamCluster`.
    pub kind: String,
    /// Resource name in URLs, e.g. `upstreamclusters`.
    pub plural: String,
    /// Singular resource name, e.g. `upstreamcluster`.
    pub singular: String,
    /// Short names for kubectl, e.g. `["uc"]`.
    pub short_names: Vec<String>,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether `status` is a subresource (then the main resource cannot change it).
    pub status_subresource: bool,
    /// Extra `kubectl get` columns between Name and Age.
    pub printer_columns: Vec<PrinterColumn>,
    /// OpenAPI v3 structural schema of the object's properties other than
    /// apiVersion/kind/metadata (usually `{"spec": ..., "status": ...}` as a `properties` map
    /// inside an object schema).
    pub schema: Value,
    /// Semantic validation beyond the schema.
    pub validate: Validator,
}

impl KindSpec {
    /// `group/version`; the core group's kinds (group `""`, served under `/api`) have the
    /// bare version (`v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            return self.version.clone();
        }
        format!("{}/{}", self.group, self.version)
    }

    /// `widgets.tests.sluice.dev`, as kube names a resource in messages (`events` in the core
    /// group).
    pub fn qualified_resource(&self) -> String {
        qualified(&self.plural, &self.group)
    }

    /// `Widget.tests.sluice.dev`, as kube names a kind in Invalid messages.
    pub fn qualified_kind(&self) -> String {
        qualified(&self.kind, &self.group)
    }

    /// Whether the kind is in the core group (served under `/api/<version>`).
    pub fn is_core(&self) -> bool {
        self.group.is_empty()
    }

    /// The path its group version is served at: `/api/v1` or `/apis/<group>/<version>`.
    pub fn group_version_path(&self) -> String {
        if self.is_core() {
            return format!("/api/{}", self.version);
        }
        format!("/apis/{}/{}", self.group, self.version)
    }

    /// `WidgetList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The verbs served on the main resource (no `deletecollection`: kubectl's `delete --all`
    /// lists and deletes one by one, and the server does not implement it).
    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create", "delete", "get", "list", "patch", "update", "watch",
        ]
    }
}

fn qualified(name: &str, group: &str) -> String {
    if group.is_empty() {
        return name.to_string();
    }
    format!("{name}.{group}")
}

/// The set of kinds the server serves.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    kinds: Vec<KindSpec>,
}

/// Why a kind could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two kinds claim the same group, version and plural.
    #[error("{0} is registered twice")]
    DuplicateResource(String),
    /// Two kinds claim the same group, version and kind.
    #[error("kind {0} is registered twice")]
    DuplicateKind(String),
    /// A short name is used by two kinds.
    #[error("short name {0:?} is used twice")]
    DuplicateShortName(String),
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a kind; refuses one whose resource, kind or short names collide.
    pub fn register(&mut self, spec: KindSpec) -> Result<&mut Self, RegistryError> {
        for known in &self.kinds {
            if known.group == spec.group && known.version == spec.version {
                if known.plural == spec.plural {
                    return Err(RegistryError::DuplicateResource(spec.qualified_resource()));
                }
                if known.kind == spec.kind {
                    return Err(RegistryError::DuplicateKind(spec.qualified_kind()));
                }
            }
            if let Some(short) = spec
                .short_names
                .iter()
                .find(|s| known.short_names.contains(s))
            {
                return Err(RegistryError::DuplicateShortName(short.clone()));
            }
        }
        self.kinds.push(spec);
        Ok(self)
    }

    /// Adds a kind, builder style.
    pub fn with(mut self, spec: KindSpec) -> Result<Self, RegistryError> {
        self.register(spec)?;
        Ok(self)
    }

    /// The kind served at `/apis/<group>/<version>/<plural>`.
    pub fn by_resource(&self, group: &str, version: &str, plural: &str) -> Option<&KindSpec> {
        self.kinds
            .iter()
            .find(|k| k.group == group && k.version == version && k.plural == plural)
    }

    /// The kind named by an object's apiVersion and kind.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&KindSpec> {
        self.kinds
            .iter()
            .find(|k| k.kind == kind && k.api_version() == api_version)
    }

    /// Every kind, in registration order.
    pub fn kinds(&self) -> &[KindSpec] {
        &self.kinds
    }

    /// Groups and their versions (sorted; a group has one version per distinct `version`). The
    /// core group is the key `""`.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for spec in &self.kinds {
            let versions = groups.entry(spec.group.clone()).or_default();
            if !versions.contains(&spec.version) {
                versions.push(spec.version.clone());
            }
        }
        groups
    }

    /// The kinds of one group version, in registration order.
    pub fn group_version(&self, group: &str, version: &str) -> Vec<&KindSpec> {
        self.kinds
            .iter()
            .filter(|k| k.group == group && k.version == version)
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    fn no_errors(_: &Value) -> Vec<FieldError> {
        Vec::new()
    }

    pub(crate) fn widget() -> KindSpec {
        KindSpec {
            group: "tests.sluice.dev".into(),
            version: "v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
            singular: "widget".into(),
            short_names: vec!["wd".into()],
            namespaced: true,
            status_subresource: true,
            printer_columns: vec![PrinterColumn::new("Size", ".spec.size", "integer", "size")],
            schema: json!({"type": "object", "properties": {
                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}),
            validate: no_errors,
        }
    }

    #[test]
    fn looks_kinds_up_by_resource_and_kind() {
        let registry = Registry::new().with(widget()).expect("one kind");
        assert!(registry
            .by_resource("tests.sluice.dev", "v1", "widgets")
            .is_some());
        assert!(registry
            .by_resource("tests.sluice.dev", "v2", "widgets")
            .is_none());
        assert!(registry.by_kind("tests.sluice.dev/v1", "Widget").is_some());
        assert!(registry.by_kind("v1", "Widget").is_none());
        assert_eq!(
            registry.groups()["tests.sluice.dev"],
            vec!["v1".to_string()]
        );
    }

    #[test]
    fn refuses_collisions() {
        let registry = Registry::new().with(widget()).expect("one kind");
        let again = registry.clone().with(widget()).map(|_| ());
        assert_eq!(
            again,
            Err(RegistryError::DuplicateResource(
                "widgets.tests.sluice.dev".into()
            ))
        );
        let mut renamed = widget();
        renamed.plural = "gadgets".into();
        renamed.short_names.clear();
        assert!(matches!(
            registry.clone().with(renamed),
            Err(RegistryError::DuplicateKind(_))
        ));
        let mut other = widget();
        other.group = "other.sluice.dev".into();
        assert!(matches!(
            registry.with(other),
            Err(RegistryError::DuplicateShortName(_))
        ));
    }
}
