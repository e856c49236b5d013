//! Self reviews sent as Kubernetes protobuf (kubectl's typed client sends
//! `application/vnd.kubernetes.protobuf` for built-in kinds): the `k8s\0` envelope holding a
//! `runtime.Unknown` whose `raw` is the review, read into the JSON shape [`super::review`]
//! takes. Only the fields a review's decision reads are kept; the answer goes back as JSON,
//! which kubectl accepts too. The bytes come from the network: every length is checked, and
//! nothing recurses deeper than the three levels a review has.

use serde_json::{json, Map, Value};

/// The content type of a protobuf body.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// A body that is not a protobuf review.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the protobuf body is not a review: {0}")]
pub struct ProtoError(&'static str);

/// `resourceAttributes` field numbers and names (`authorization/v1 ResourceAttributes`).
const RESOURCE_ATTRIBUTES: [(u64, &str); 7] = [
    (1, "namespace"),
    (2, "verb"),
    (3, "group"),
    (4, "version"),
    (5, "resource"),
    (6, "subresource"),
    (7, "name"),
];
const NON_RESOURCE_ATTRIBUTES: [(u64, &str); 2] = [(1, "path"), (2, "verb")];

/// The review in `body` as JSON (`kind` from the envelope's type meta).
pub fn decode_review(body: &[u8]) -> Result<Value, ProtoError> {
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or(ProtoError("no k8s envelope"))?;
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (number, value) in fields(unknown)? {
        match (number, value) {
            (1, Field::Bytes(type_meta)) => kind = string_field(type_meta, 2)?,
            (2, Field::Bytes(bytes)) => raw = bytes,
            _ => {}
        }
    }
    let mut spec = Map::new();
    for (number, value) in fields(raw)? {
        if let (2, Field::Bytes(bytes)) = (number, value) {
            spec = decode_spec(bytes, kind == "SelfSubjectRulesReview")?;
        }
    }
    Ok(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": kind, "metadata": {}, "spec": spec,
    }))
}

/// A review's spec: the two attribute sets (access review) or the namespace (rules review).
fn decode_spec(bytes: &[u8], rules: bool) -> Result<Map<String, Value>, ProtoError> {
    let mut spec = Map::new();
    for (number, value) in fields(bytes)? {
        let Field::Bytes(inner) = value else { continue };
        match number {
            // Field 1 is `namespace` in a rules review, `resourceAttributes` in an access one.
            1 if rules => {
                spec.insert("namespace".into(), json!(text(inner)?));
            }
            1 => {
                let attributes = strings(inner, &RESOURCE_ATTRIBUTES)?;
                spec.insert("resourceAttributes".into(), attributes);
            }
            2 => {
                let attributes = strings(inner, &NON_RESOURCE_ATTRIBUTES)?;
                spec.insert("nonResourceAttributes".into(), attributes);
            }
            _ => {}
        }
    }
    Ok(spec)
}

fn strings(bytes: &[u8], names: &[(u64, &str)]) -> Result<Value, ProtoError> {
    let mut object = Map::new();
    for (number, value) in fields(bytes)? {
        let Some((_, name)) = names.iter().find(|(known, _)| *known == number) else {
            continue;
        };
        let Field::Bytes(inner) = value else {
            return Err(ProtoError("an attribute is not a string"));
        };
        object.insert((*name).to_string(), json!(text(inner)?));
    }
    Ok(Value::Object(object))
}

fn string_field(bytes: &[u8], wanted: u64) -> Result<String, ProtoError> {
    for (number, value) in fields(bytes)? {
        if let (true, Field::Bytes(inner)) = (number == wanted, value) {
            return text(inner);
        }
    }
    Ok(String::new())
}

fn text(bytes: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError("a string is not UTF-8"))
}

enum Field<'a> {
    Bytes(&'a [u8]),
    Other,
}

/// Every field of one message, in order; a truncated or malformed one is an error.
fn fields(mut bytes: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ProtoError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let field = match key & 7 {
            0 => {
                varint(&mut bytes)?;
                Field::Other
            }
            1 => {
                bytes = bytes.get(8..).ok_or(ProtoError("truncated fixed64"))?;
                Field::Other
            }
            2 => {
                let length = usize::try_from(varint(&mut bytes)?)
                    .map_err(|_| ProtoError("length out of range"))?;
                if length > bytes.len() {
                    return Err(ProtoError("truncated field"));
                }
                let (inner, rest) = bytes.split_at(length);
                bytes = rest;
                Field::Bytes(inner)
            }
            5 => {
                bytes = bytes.get(4..).ok_or(ProtoError("truncated fixed32"))?;
                Field::Other
            }
            _ => return Err(ProtoError("unsupported wire type")),
        };
        out.push((key >> 3, field));
    }
    Ok(out)
}

fn varint(bytes: &mut &[u8]) -> Result<u64, ProtoError> {
    let mut value = 0u64;
    for shift in 0..10 {
        let (&byte, rest) = bytes.split_first().ok_or(ProtoError("truncated varint"))?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(ProtoError("varint longer than 10 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![number << 3 | 2, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    fn envelope(kind: &str, spec: &[u8]) -> Vec<u8> {
        let type_meta = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, kind.as_bytes()),
        ]
        .concat();
        // metadata (empty), spec, status {allowed: false} as a varint field.
        let review = [
            field(1, b""),
            field(2, spec),
            vec![3 << 3 | 2, 2, 1 << 3, 0],
        ]
        .concat();
        [MAGIC.to_vec(), field(1, &type_meta), field(2, &review)].concat()
    }

    #[test]
    fn kubectls_access_review_reads_as_its_json() {
        let attributes = [
            field(1, b"default"),
            field(2, b"delete"),
            field(3, b"vm.sluice.dev"),
            field(5, b"virtualmachines"),
            field(7, b"vm1"),
        ]
        .concat();
        let body = envelope("SelfSubjectAccessReview", &field(1, &attributes));
        assert_eq!(
            decode_review(&body).unwrap(),
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "metadata": {}, "spec": {"resourceAttributes": {"namespace": "default",
                "verb": "delete", "group": "vm.sluice.dev", "resource": "virtualmachines",
                "name": "vm1"}}})
        );
        let path = [field(1, b"/metrics"), field(2, b"get")].concat();
        let body = envelope("SelfSubjectAccessReview", &field(2, &path));
        assert_eq!(
            decode_review(&body).unwrap()["spec"]["nonResourceAttributes"],
            json!({"path": "/metrics", "verb": "get"})
        );
        let rules = envelope("SelfSubjectRulesReview", &field(1, b"default"));
        assert_eq!(
            decode_review(&rules).unwrap()["spec"],
            json!({"namespace": "default"})
        );
    }

    #[test]
    fn hostile_bodies_are_errors_not_panics() {
        assert!(decode_review(b"{}").is_err());
        let good = envelope("SelfSubjectAccessReview", &field(1, &field(2, b"get")));
        for end in MAGIC.len()..good.len() {
            let _ = decode_review(&good[..end]);
        }
        let mut long_varint = MAGIC.to_vec();
        long_varint.extend([0x80; 11]);
        assert_eq!(
            decode_review(&long_varint),
            Err(ProtoError("varint longer than 10 bytes"))
        );
        let mut huge = MAGIC.to_vec();
        huge.extend([2 << 3 | 2, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(decode_review(&huge), Err(ProtoError("truncated field")));
    }
}
