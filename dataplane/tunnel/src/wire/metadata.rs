//! HTTP/2 headers as tunnel metadata (`MetadataEntry`) and back, with the limits both
//! directions are held to.
//!
//! Outgoing metadata is encoded straight from the header map: a call's headers are not copied
//! into owned entries first (a `String` and a `Vec` per name and a copy per value, then dropped,
//! were 5% of a node's CPU per call). The frames are the bytes prost encodes from the same
//! entries; the tests hold the two to that.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{GetAll, HeaderMap, HeaderName, HeaderValue};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use sluice_grpc::{message_header, MESSAGE_HEADER_LEN};
use sluice_proto::tunnel::v1::MetadataEntry;

/// Headers that describe one HTTP/2 hop, or that the node sets itself, and so are not carried
/// through the tunnel. `authorization` is the caller's credential for this node: it never
/// reaches the agent or its backend.
pub(crate) fn is_hop_header(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "authorization"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "te"
            | "content-length"
            | "grpc-timeout"
            | "sluice-agent-id"
    )
}

fn is_carried(name: &HeaderName) -> bool {
    !is_hop_header(name)
}

/// Trailers a `Trailer` carries in its own fields (or gRPC sets itself) besides hop headers.
fn is_carried_trailer(name: &HeaderName) -> bool {
    is_carried(name)
        && !matches!(
            name.as_str(),
            "grpc-status" | "grpc-message" | "content-type"
        )
}

/// Headers read in place as tunnel metadata: every carried name in the map's order with all
/// its values in order, then optionally one entry the sender adds (a call's remaining
/// `grpc-timeout`).
#[derive(Clone, Copy)]
pub struct HeaderMetadata<'a> {
    headers: &'a HeaderMap,
    carried: fn(&HeaderName) -> bool,
    added: Option<(&'a str, &'a [u8])>,
}

impl<'a> HeaderMetadata<'a> {
    /// A call's request or response headers, hop headers and credentials left out.
    pub fn of(headers: &'a HeaderMap) -> Self {
        Self {
            headers,
            carried: is_carried,
            added: None,
        }
    }

    /// A backend's trailers (or trailers-only headers), without what `Trailer` carries itself.
    pub fn of_trailers(headers: &'a HeaderMap) -> Self {
        Self {
            headers,
            carried: is_carried_trailer,
            added: None,
        }
    }

    /// The same metadata with one more entry at the end.
    pub fn with_entry(self, key: &'a str, value: &'a [u8]) -> Self {
        Self {
            added: Some((key, value)),
            ..self
        }
    }

    fn carried_names(&self) -> impl Iterator<Item = &'a HeaderName> + 'a {
        let carried = self.carried;
        self.headers.keys().filter(move |name| carried(name))
    }

    fn values(&self, name: &HeaderName) -> GetAll<'a, HeaderValue> {
        self.headers.get_all(name)
    }

    /// Values and bytes as [`check_metadata`] counts the same entries.
    pub fn size(&self) -> (usize, usize) {
        let (mut count, mut bytes) = (0usize, 0usize);
        for name in self.carried_names() {
            for value in self.values(name) {
                count += 1;
                bytes += name.as_str().len() + value.len();
            }
        }
        if let Some((key, value)) = self.added {
            count += 1;
            bytes += key.len() + value.len();
        }
        (count, bytes)
    }

    /// [`check_metadata`] of the same entries, without building them.
    pub fn check(&self, limits: &MetadataLimits) -> Result<(), MetadataTooLarge> {
        let (entries, bytes) = self.size();
        if entries > limits.entries || bytes > limits.bytes {
            return Err(MetadataTooLarge {
                entries,
                bytes,
                limits: *limits,
            });
        }
        Ok(())
    }

    /// Bytes of the metadata as a repeated message field (field keys and lengths included).
    pub fn encoded_len(&self, field: u32) -> usize {
        let entry = |len: usize| key_len(field) + encoded_len_varint(len as u64) + len;
        let mut total = 0;
        for name in self.carried_names() {
            total += entry(entry_len(name.as_str(), self.values(name)));
        }
        if let Some((key, value)) = self.added {
            total += entry(entry_len(key, [value]));
        }
        total
    }

    /// Appends the metadata as repeated `MetadataEntry` field number `field`.
    pub fn encode(&self, field: u32, out: &mut BytesMut) {
        for name in self.carried_names() {
            encode_entry(field, name.as_str(), &self.values(name), out);
        }
        if let Some((key, value)) = self.added {
            encode_entry(field, key, [value], out);
        }
    }

    /// The same metadata as owned entries (for the places that keep a message, and for tests).
    pub fn to_entries(&self) -> Vec<MetadataEntry> {
        let mut entries: Vec<MetadataEntry> = self
            .carried_names()
            .map(|name| MetadataEntry {
                key: name.as_str().to_string(),
                values: self
                    .values(name)
                    .iter()
                    .map(|value| Bytes::copy_from_slice(value.as_bytes()))
                    .collect(),
            })
            .collect();
        if let Some((key, value)) = self.added {
            entries.push(MetadataEntry {
                key: key.to_string(),
                values: vec![Bytes::copy_from_slice(value)],
            });
        }
        entries
    }
}

/// Length of one `MetadataEntry { key = 1, values = 2 }` message body.
fn entry_len<V: AsRef<[u8]>>(key: &str, values: impl IntoIterator<Item = V>) -> usize {
    bytes_field_len(1, key.as_bytes())
        + values
            .into_iter()
            .map(|value| {
                let len = value.as_ref().len();
                key_len(2) + encoded_len_varint(len as u64) + len
            })
            .sum::<usize>()
}

fn encode_entry<V: AsRef<[u8]>>(
    field: u32,
    key: &str,
    values: impl IntoIterator<Item = V> + Clone,
    out: &mut BytesMut,
) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(entry_len(key, values.clone()) as u64, out);
    put_bytes_field(1, key.as_bytes(), out);
    for value in values {
        // Repeated `bytes` keep empty values: prost writes every element.
        let value = value.as_ref();
        encode_key(2, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.put_slice(value);
    }
}

/// A singular `string`/`bytes` field: proto3 leaves an empty one out.
fn bytes_field_len(field: u32, value: &[u8]) -> usize {
    if value.is_empty() {
        0
    } else {
        key_len(field) + encoded_len_varint(value.len() as u64) + value.len()
    }
}

fn put_bytes_field(field: u32, value: &[u8], out: &mut BytesMut) {
    if !value.is_empty() {
        encode_key(field, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.put_slice(value);
    }
}

/// A `uint32` field: proto3 leaves zero out.
fn uint32_field_len(field: u32, value: u32) -> usize {
    if value == 0 {
        0
    } else {
        key_len(field) + encoded_len_varint(u64::from(value))
    }
}

/// Appends `outer_field { body }` as one whole gRPC frame, `body_len` bytes of body written by
/// `body`.
fn frame_message_into(
    out: &mut BytesMut,
    outer_field: u32,
    body_len: usize,
    body: impl FnOnce(&mut BytesMut),
) {
    let message_len = key_len(outer_field) + encoded_len_varint(body_len as u64) + body_len;
    out.reserve(MESSAGE_HEADER_LEN + message_len);
    out.put_slice(&message_header(false, message_len));
    encode_key(outer_field, WireType::LengthDelimited, out);
    encode_varint(body_len as u64, out);
    let before = out.len();
    body(out);
    debug_assert_eq!(
        out.len() - before,
        body_len,
        "message length computed wrongly"
    );
}

/// `ConnectResponse { request_info: RequestInfo { method_name, metadata } }` as one gRPC frame.
pub fn request_info_frame_into(out: &mut BytesMut, method: &str, metadata: &HeaderMetadata) {
    let body_len = bytes_field_len(1, method.as_bytes()) + metadata.encoded_len(2);
    frame_message_into(out, 1, body_len, |out| {
        put_bytes_field(1, method.as_bytes(), out);
        metadata.encode(2, out);
    });
}

/// `ConnectRequest { header: Header { metadata } }` as one gRPC frame.
pub fn header_frame_into(out: &mut BytesMut, metadata: &HeaderMetadata) {
    frame_message_into(out, 2, metadata.encoded_len(1), |out| {
        metadata.encode(1, out)
    });
}

/// `ConnectRequest { trailer: Trailer { grpc_status, grpc_message, metadata } }` as one gRPC
/// frame.
pub fn trailer_frame_into(
    out: &mut BytesMut,
    status: u32,
    message: &str,
    metadata: &HeaderMetadata,
) {
    let body_len = uint32_field_len(1, status)
        + bytes_field_len(2, message.as_bytes())
        + metadata.encoded_len(3);
    frame_message_into(out, 4, body_len, |out| {
        if status != 0 {
            encode_key(1, WireType::Varint, out);
            encode_varint(u64::from(status), out);
        }
        put_bytes_field(2, message.as_bytes(), out);
        metadata.encode(3, out);
    });
}

/// How much metadata one call's headers (or trailers) may carry through a tunnel, from a client
/// or an agent (`tunnel.max_metadata_entries`, `tunnel.max_metadata_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataLimits {
    /// Most values (one per name without values); far above what gRPC peers send (a few dozen).
    pub entries: usize,
    /// Most bytes of names and values, each name counted once per value.
    pub bytes: usize,
}

impl MetadataLimits {
    /// The largest limits configuration may set (`HeaderMap` panics past 24,576 distinct
    /// names). Also what an agent applies to what its node forwards: the node already held the
    /// call to its own limits, which are at most these.
    pub const CEILING: Self = Self {
        entries: sluice_config::METADATA_ENTRIES_CEILING,
        bytes: sluice_config::METADATA_BYTES_CEILING,
    };
}

impl Default for MetadataLimits {
    /// 512 values and 64 KiB: the bytes are the HTTP/2 header list a node accepts from clients.
    fn default() -> Self {
        Self {
            entries: 512,
            bytes: 64 * 1024,
        }
    }
}

/// Metadata over [`MetadataLimits`]; refused, never forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata too large: {entries} entries and {bytes} bytes exceed the limit of {} entries and {} bytes", limits.entries, limits.bytes)]
pub struct MetadataTooLarge {
    pub entries: usize,
    pub bytes: usize,
    pub limits: MetadataLimits,
}

/// Checks metadata against `limits`, counting without allocating (a hostile peer's metadata may
/// be millions of entries).
pub fn check_metadata(
    entries: &[MetadataEntry],
    limits: &MetadataLimits,
) -> Result<(), MetadataTooLarge> {
    let (mut count, mut bytes) = (0usize, 0usize);
    for entry in entries {
        count += entry.values.len().max(1);
        bytes += entry.key.len() * entry.values.len().max(1)
            + entry.values.iter().map(Bytes::len).sum::<usize>();
    }
    if count > limits.entries || bytes > limits.bytes {
        return Err(MetadataTooLarge {
            entries: count,
            bytes,
            limits: *limits,
        });
    }
    Ok(())
}

/// Adds tunnel metadata to headers. Entries that are not valid HTTP/2 headers, or are hop
/// headers, are skipped and counted in the return value. Metadata over the limits
/// ([`check_metadata`]) is refused whole and nothing is added.
pub fn metadata_into_headers(
    entries: &[MetadataEntry],
    headers: &mut HeaderMap,
    limits: &MetadataLimits,
) -> Result<usize, MetadataTooLarge> {
    check_metadata(entries, limits)?;
    let mut skipped = 0;
    for entry in entries {
        let Ok(name) = HeaderName::from_bytes(entry.key.as_bytes()) else {
            skipped += entry.values.len().max(1);
            continue;
        };
        if is_hop_header(&name) {
            skipped += entry.values.len().max(1);
            continue;
        }
        for value in &entry.values {
            // Shares the decoded message's bytes instead of copying them.
            match HeaderValue::from_maybe_shared(value.clone()) {
                Ok(value) => {
                    headers.append(name.clone(), value);
                }
                Err(_) => skipped += 1,
            }
        }
    }
    Ok(skipped)
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
mod tests;
