//! OpenAPI v3: the `/openapi/v3` index and one document per group version.
//!
//! What kubectl v1.32 does with them (k8s.io/cli-runtime `resource/query_param_verifier_v3.go`,
//! k8s.io/kubectl `pkg/cmd/util/factory_client_access.go` `Validator`,
//! `pkg/cmd/apply/patcher.go` `gvkSupportsPatchOpenAPIV3`):
//! - `--validate=strict` (the default) reads `/openapi/v3`, then the document named by
//!   `paths["apis/<group>/<version>"].serverRelativeURL`, and looks for a path whose `patch`
//!   operation carries `x-kubernetes-group-version-kind` as an *object* equal to the object's
//!   GVK and a parameter named `fieldValidation` with `in: query`. Found: kubectl skips client
//!   validation and sends `?fieldValidation=Strict` to the server. Not found: it validates
//!   client-side against `/openapi/v2`, which this server does not serve, and fails.
//! - `apply` looks at the same PATCH operation's `requestBody.content`: if it lists
//!   `application/strategic-merge-patch+json` kubectl sends a strategic merge patch; ours lists
//!   only JSON patch and merge patch (as kube-apiserver does for CRDs), so kubectl falls back to
//!   a three-way JSON merge patch.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::kind::{KindSpec, Registry};
use crate::openapi_meta::{meta_schemas, META, OBJECT_META};

/// The patch content types the server accepts (and advertises in the PATCH operations), in
/// kube-apiserver's order for custom resources.
pub const PATCH_CONTENT_TYPES: [&str; 3] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];

/// The `paths` key of a group version in the index (`apis/<group>/<version>`; the core
/// group's is `api/<version>`).
pub fn group_version_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        return format!("api/{version}");
    }
    format!("apis/{group}/{version}")
}

/// `/openapi/v3`: one entry per group version with a URL carrying the document's hash (kube
/// answers a hashed URL with `Cache-Control: public, immutable`; clients cache by it).
pub fn openapi_index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let Some(document) = openapi_document(registry, &group, &version) else {
                continue;
            };
            let key = group_version_key(&group, &version);
            let url = format!("/openapi/v3/{key}?hash={}", document_hash(&document));
            paths.insert(key, json!({"serverRelativeURL": url}));
        }
    }
    json!({"paths": paths})
}

/// The Content-Type of `/openapi/v2`: gnostic's protobuf `openapi_v2.Document`, in
/// kube-openapi's dotted form (kubectl asks with `...v2@v1.0+protobuf`, but Go's
/// `mime.ParseMediaType` refuses the `@` in a response).
pub const OPENAPI_V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `/openapi/v2`: a Swagger 2.0 document without definitions, protobuf-encoded (field 1
/// `swagger`, field 2 `info` with `title` and `version`). kubectl validates a `kind: List`
/// client-side against v2 (cli-runtime's query-param verifier declares `v1 List` unsupported
/// before it reads v3) and fails on a 404; with no definitions it skips each item's client-side
/// check, and the server still validates each item (kubectl writes them with
/// `fieldValidation=Strict`). Everything else in kubectl 1.32 reads v3.
pub fn openapi_v2_document() -> Vec<u8> {
    let mut info = Vec::new();
    protobuf_field(&mut info, 1, b"Sluice control plane");
    protobuf_field(&mut info, 2, b"v1");
    let mut document = Vec::new();
    protobuf_field(&mut document, 1, b"2.0");
    protobuf_field(&mut document, 2, &info);
    document
}

/// One length-delimited protobuf field (wire type 2).
fn protobuf_field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
    out.push(number << 3 | 2);
    let mut length = bytes.len();
    while length >= 0x80 {
        out.push((length & 0x7f) as u8 | 0x80);
        length >>= 7;
    }
    out.push(length as u8);
    out.extend_from_slice(bytes);
}

/// Upper-case hex SHA-256 of the document's JSON text.
pub fn document_hash(document: &Value) -> String {
    hex::encode_upper(Sha256::digest(document.to_string().as_bytes()))
}

/// `/openapi/v3/apis/<group>/<version>`: paths for every kind of the group version and the
/// component schemas (kinds, lists, ObjectMeta and friends); `None` when the group version is
/// not served (404).
pub fn openapi_document(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let kinds = registry.group_version(group, version);
    if kinds.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = meta_schemas();
    for spec in kinds {
        add_kind_paths(spec, &mut paths);
        schemas.insert(schema_name(spec), kind_schema(spec));
        schemas.insert(format!("{}List", schema_name(spec)), list_schema(spec));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Sluice control plane", "version": "v1"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `dev.sluice.tests.v1.Widget`: kube's reversed-group naming of definitions.
pub fn schema_name(spec: &KindSpec) -> String {
    if spec.is_core() {
        // kube's name of the core types (`io.k8s.api.core.v1.Event`).
        return format!("io.k8s.api.core.{}.{}", spec.version, spec.kind);
    }
    let reversed: Vec<&str> = spec.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), spec.version, spec.kind)
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn gvk_object(spec: &KindSpec, kind: &str) -> Value {
    json!({"group": spec.group, "version": spec.version, "kind": kind})
}

fn kind_schema(spec: &KindSpec) -> Value {
    let mut properties = Map::new();
    properties.insert("apiVersion".into(), json!({"type": "string"}));
    properties.insert("kind".into(), json!({"type": "string"}));
    properties.insert(
        "metadata".into(),
        json!({"allOf": [schema_ref(OBJECT_META)]}),
    );
    if let Some(Value::Object(own)) = spec.schema.get("properties") {
        properties.extend(own.clone());
    }
    let mut schema = json!({
        "type": "object",
        "description": format!("{} of {}", spec.kind, spec.api_version()),
        "properties": properties,
        "x-kubernetes-group-version-kind": [gvk_object(spec, &spec.kind)],
    });
    if let Some(required) = spec.schema.get("required") {
        schema["required"] = required.clone();
    }
    schema
}

fn list_schema(spec: &KindSpec) -> Value {
    json!({
        "type": "object",
        "description": format!("{} is a list of {}", spec.list_kind(), spec.kind),
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "items": {"type": "array", "items": schema_ref(&schema_name(spec))},
            "metadata": {"allOf": [schema_ref(&format!("{META}.ListMeta"))]},
        },
        "x-kubernetes-group-version-kind": [gvk_object(spec, &spec.list_kind())],
    })
}

fn query_param(name: &str, description: &str, schema_type: &str) -> Value {
    json!({
        "name": name,
        "in": "query",
        "description": description,
        "schema": {"type": schema_type, "uniqueItems": true},
    })
}

fn write_params() -> Vec<Value> {
    vec![
        query_param(
            "dryRun",
            "When present, modifications are not persisted.",
            "string",
        ),
        query_param(
            "fieldManager",
            "Name of the actor making the change.",
            "string",
        ),
        query_param(
            "fieldValidation",
            "Ignore, Warn or Strict: how unknown or duplicate fields are handled.",
            "string",
        ),
    ]
}

fn list_params() -> Vec<Value> {
    vec![
        query_param("allowWatchBookmarks", "Ask for BOOKMARK events.", "boolean"),
        query_param(
            "continue",
            "The continue token of the previous page.",
            "string",
        ),
        query_param(
            "fieldSelector",
            "metadata.name and metadata.namespace.",
            "string",
        ),
        query_param("labelSelector", "Label selector.", "string"),
        query_param("limit", "Maximum number of items in a page.", "integer"),
        query_param(
            "resourceVersion",
            "Read or watch from this version.",
            "string",
        ),
        query_param("timeoutSeconds", "Watch timeout.", "integer"),
        query_param("watch", "Watch instead of list.", "boolean"),
    ]
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

/// The parts of one operation.
struct Operation<'a> {
    action: &'a str,
    description: String,
    operation_id: String,
    parameters: Vec<Value>,
    body_types: &'a [&'a str],
    body_schema: Value,
    response_schema: Value,
}

fn operation(spec: &KindSpec, op: Operation<'_>) -> Value {
    let mut value = json!({
        "tags": [format!("{}_{}", spec.group, spec.version)],
        "description": op.description,
        "operationId": op.operation_id,
        "parameters": op.parameters,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": op.response_schema}}},
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": gvk_object(spec, &spec.kind),
    });
    if !op.body_types.is_empty() {
        let content: Map<String, Value> = op
            .body_types
            .iter()
            .map(|t| (t.to_string(), json!({"schema": op.body_schema.clone()})))
            .collect();
        value["requestBody"] = json!({"content": content, "required": true});
    }
    value
}

/// Adds the collection, item and status paths of one kind.
fn add_kind_paths(spec: &KindSpec, paths: &mut Map<String, Value>) {
    let base = spec.group_version_path();
    let scoped = if spec.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", spec.plural)
    } else {
        format!("{base}/{}", spec.plural)
    };
    let mut scope_params = vec![];
    if spec.namespaced {
        scope_params.push(path_param("namespace"));
    }
    let id = OperationIds::new(spec);
    let object = schema_ref(&schema_name(spec));
    let list = schema_ref(&format!("{}List", schema_name(spec)));
    let json_body: &[&str] = &["application/json"];

    let list_op = |op_id: String| {
        operation(
            spec,
            Operation {
                action: "list",
                description: format!("list or watch objects of kind {}", spec.kind),
                operation_id: op_id,
                parameters: list_params(),
                body_types: &[],
                body_schema: Value::Null,
                response_schema: list.clone(),
            },
        )
    };
    if spec.namespaced {
        let all = format!("{base}/{}", spec.plural);
        paths.insert(
            all,
            json!({"get": list_op(id.verb("list", "ForAllNamespaces"))}),
        );
    }
    let create = operation(
        spec,
        Operation {
            action: "post",
            description: format!("create a {}", spec.kind),
            operation_id: id.verb("create", ""),
            parameters: write_params(),
            body_types: json_body,
            body_schema: object.clone(),
            response_schema: object.clone(),
        },
    );
    let mut collection = json!({"get": list_op(id.verb("list", "")), "post": create});
    collection["parameters"] = json!(scope_params.clone());
    paths.insert(scoped.clone(), collection);

    let mut item_params = vec![path_param("name")];
    item_params.extend(scope_params);
    let item = item_operations(spec, &id, "", &object);
    paths.insert(
        format!("{scoped}/{{name}}"),
        with_params(item, &item_params),
    );
    if spec.status_subresource {
        let status = item_operations(spec, &id, "Status", &object);
        paths.insert(
            format!("{scoped}/{{name}}/status"),
            with_params(status, &item_params),
        );
    }
}

fn with_params(mut path: Value, params: &[Value]) -> Value {
    path["parameters"] = json!(params);
    path
}

/// get/put/patch (and delete on the main resource) of `{name}` or `{name}/status`.
fn item_operations(spec: &KindSpec, id: &OperationIds, suffix: &str, object: &Value) -> Value {
    let what = if suffix.is_empty() {
        String::new()
    } else {
        " status of".to_string()
    };
    let get = operation(
        spec,
        Operation {
            action: "get",
            description: format!("read the{what} specified {}", spec.kind),
            operation_id: id.verb("read", suffix),
            parameters: vec![],
            body_types: &[],
            body_schema: Value::Null,
            response_schema: object.clone(),
        },
    );
    let put = operation(
        spec,
        Operation {
            action: "put",
            description: format!("replace the{what} specified {}", spec.kind),
            operation_id: id.verb("replace", suffix),
            parameters: write_params(),
            body_types: &["application/json"],
            body_schema: object.clone(),
            response_schema: object.clone(),
        },
    );
    let mut patch_params = write_params();
    patch_params.push(query_param("force", "Only for apply patches.", "boolean"));
    let patch = operation(
        spec,
        Operation {
            action: "patch",
            description: format!("partially update the{what} specified {}", spec.kind),
            operation_id: id.verb("patch", suffix),
            parameters: patch_params,
            body_types: &PATCH_CONTENT_TYPES,
            body_schema: schema_ref(&format!("{META}.Patch")),
            response_schema: object.clone(),
        },
    );
    let mut ops = json!({"get": get, "put": put, "patch": patch});
    if suffix.is_empty() {
        ops["delete"] = operation(
            spec,
            Operation {
                action: "delete",
                description: format!("delete a {}", spec.kind),
                operation_id: id.verb("delete", ""),
                parameters: vec![query_param("dryRun", "Do not persist.", "string")],
                body_types: &["application/json"],
                body_schema: schema_ref(&format!("{META}.DeleteOptions")),
                response_schema: schema_ref(&format!("{META}.Status")),
            },
        );
    }
    ops
}

/// kube-style operation ids: `patchTestsSluiceDevV1NamespacedWidgetStatus`.
struct OperationIds {
    group_version: String,
    scoped_kind: String,
}

impl OperationIds {
    fn new(spec: &KindSpec) -> Self {
        let group = if spec.is_core() { "core" } else { &spec.group };
        let group_version: String = group
            .split('.')
            .chain(std::iter::once(spec.version.as_str()))
            .map(capitalize)
            .collect();
        let scope = if spec.namespaced { "Namespaced" } else { "" };
        Self {
            group_version,
            scoped_kind: format!("{scope}{}", spec.kind),
        }
    }

    fn verb(&self, verb: &str, suffix: &str) -> String {
        if suffix == "ForAllNamespaces" {
            let kind = self.scoped_kind.trim_start_matches("Namespaced");
            return format!("{verb}{}{kind}{suffix}", self.group_version);
        }
        format!("{verb}{}{}{suffix}", self.group_version, self.scoped_kind)
    }
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::tests::widget;

    #[test]
    fn the_v2_document_is_swagger_2_without_definitions() {
        let document = openapi_v2_document();
        // swagger (1) = "2.0", then info (2) = {title (1), version (2)}.
        assert_eq!(&document[..5], b"\x0a\x032.0");
        assert_eq!(document[5], 2 << 3 | 2);
        assert_eq!(usize::from(document[6]), document.len() - 7);
        assert_eq!(&document[7..9], b"\x0a\x14");
        assert_eq!(&document[9..29], b"Sluice control plane");
        assert_eq!(&document[29..], b"\x12\x02v1");
    }

    #[test]
    fn the_core_group_is_under_api() {
        let mut core = widget();
        core.group = String::new();
        let registry = Registry::new().with(core.clone()).expect("registry");
        assert!(
            openapi_index(&registry)["paths"]["api/v1"]["serverRelativeURL"]
                .as_str()
                .is_some_and(|url| url.starts_with("/openapi/v3/api/v1?hash="))
        );
        let doc = openapi_document(&registry, "", "v1").expect("served");
        assert!(doc["paths"]["/api/v1/namespaces/{namespace}/widgets/{name}"]["patch"].is_object());
        assert!(doc["components"]["schemas"]["io.k8s.api.core.v1.Widget"].is_object());
        let gvk = json!({"group": "", "version": "v1", "kind": "Widget"});
        assert!(kubectl_finds_field_validation(&doc, &gvk));
    }

    /// What `supportsQueryParamV3` does: a PATCH operation with the GVK object and a
    /// `fieldValidation` query parameter.
    fn kubectl_finds_field_validation(doc: &Value, gvk: &Value) -> bool {
        let Some(paths) = doc["paths"].as_object() else {
            return false;
        };
        paths.values().any(|path| {
            let patch = &path["patch"];
            patch["x-kubernetes-group-version-kind"] == *gvk
                && patch["parameters"].as_array().is_some_and(|params| {
                    params
                        .iter()
                        .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
                })
        })
    }

    #[test]
    fn patch_operations_carry_the_gvk_and_field_validation() {
        let registry = Registry::new().with(widget()).expect("registry");
        let doc = openapi_document(&registry, "tests.sluice.dev", "v1").expect("served");
        let gvk = json!({"group": "tests.sluice.dev", "version": "v1", "kind": "Widget"});
        assert!(kubectl_finds_field_validation(&doc, &gvk));
        let item = &doc["paths"]["/apis/tests.sluice.dev/v1/namespaces/{namespace}/widgets/{name}"];
        let content = item["patch"]["requestBody"]["content"]
            .as_object()
            .expect("content");
        assert!(!content.contains_key("application/strategic-merge-patch+json"));
        assert!(content.contains_key("application/merge-patch+json"));
        assert_eq!(
            item["patch"]["operationId"],
            "patchTestsSluiceDevV1NamespacedWidget"
        );
        let schema = &doc["components"]["schemas"]["dev.sluice.tests.v1.Widget"];
        assert_eq!(
            schema["x-kubernetes-group-version-kind"][0]["kind"],
            "Widget"
        );
        assert!(doc["components"]["schemas"][OBJECT_META]["properties"]["labels"].is_object());
    }

    #[test]
    fn cluster_scoped_kinds_have_no_namespace_paths() {
        let mut spec = widget();
        spec.namespaced = false;
        let registry = Registry::new().with(spec).expect("registry");
        let doc = openapi_document(&registry, "tests.sluice.dev", "v1").expect("served");
        let paths: Vec<&String> = doc["paths"].as_object().expect("paths").keys().collect();
        assert_eq!(
            paths,
            [
                "/apis/tests.sluice.dev/v1/widgets",
                "/apis/tests.sluice.dev/v1/widgets/{name}",
                "/apis/tests.sluice.dev/v1/widgets/{name}/status",
            ]
        );
        let status = &doc["paths"]["/apis/tests.sluice.dev/v1/widgets/{name}/status"];
        assert_eq!(
            status["patch"]["operationId"],
            "patchTestsSluiceDevV1WidgetStatus"
        );
        assert!(status.get("delete").is_none());
        assert_eq!(status["parameters"], json!([path_param("name")]));
        let collection = &doc["paths"]["/apis/tests.sluice.dev/v1/widgets"];
        assert_eq!(
            collection["post"]["operationId"],
            "createTestsSluiceDevV1Widget"
        );
        assert_eq!(collection["get"]["x-kubernetes-action"], "list");
        assert!(openapi_document(&registry, "tests.sluice.dev", "v2").is_none());
    }

    #[test]
    fn index_points_at_hashed_documents() {
        let registry = Registry::new().with(widget()).expect("registry");
        let index = openapi_index(&registry);
        let url = index["paths"]["apis/tests.sluice.dev/v1"]["serverRelativeURL"]
            .as_str()
            .expect("url");
        let doc = openapi_document(&registry, "tests.sluice.dev", "v1").expect("served");
        assert_eq!(
            url,
            format!(
                "/openapi/v3/apis/tests.sluice.dev/v1?hash={}",
                document_hash(&doc)
            )
        );
    }
}
