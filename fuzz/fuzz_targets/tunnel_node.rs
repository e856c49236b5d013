//! What agents and clients send a tunnel node besides the gRPC frames (`tunnel_proto`) and
//! tokens (`tunnel_auth`): the ListConnectedAgents page token, an agent's connection id and
//! version headers, its Descriptor (service list, version), and the `grpc-message` of a status
//! (`sluice_grpc::status::decode_message`). The first byte picks the decoder.
//!
//! Properties: a token the node issues parses back to the same key, and a token it accepted
//! names a key whose token it would issue itself; an accepted announcement is a non-negative id
//! written only in digits and a version within the limit; an accepted Descriptor is within the
//! limits; a decoded `grpc-message` re-encoded decodes to the same text.
#![no_main]
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use sluice_config::AgentLimits;
use sluice_grpc::status::{decode_message, encode_message};
use sluice_locator::ConnectionKey;
use sluice_proto::tunnel::v1::Descriptor;
use sluice_tunnel::node::fuzzing::{announcement, check_descriptor, page_token, parse_page_token};
use sluice_tunnel::protocol::{AGENT_VERSION_HEADER, CONNECTION_ID_HEADER};

const LIMITS: AgentLimits = AgentLimits {
    connections: 16,
    tunnels: 64,
    waiting_calls: 64,
    services: 8,
    version_bytes: 32,
    list_page_size: 100,
};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => token_text(rest),
        1 => token_key(rest),
        2 => headers(rest),
        3 => descriptor(rest),
        _ => grpc_message(rest),
    }
});

fn token_text(data: &[u8]) {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    match parse_page_token(token) {
        Ok(None) => assert!(token.is_empty()),
        Ok(Some(key)) => {
            let issued = page_token(&key);
            assert_eq!(parse_page_token(&issued).ok(), Some(Some(key)));
        }
        Err(_) => {}
    }
}

/// A key of the fuzzer's choosing (ids from the first 16 bytes, the node from the rest).
fn token_key(data: &[u8]) {
    if data.len() < 16 {
        return;
    }
    let (ids, node) = data.split_at(16);
    let Ok(node) = std::str::from_utf8(node) else {
        return;
    };
    let number = |bytes: &[u8]| i64::from_le_bytes(bytes.try_into().unwrap_or_default());
    let key = ConnectionKey {
        agent: number(&ids[..8]),
        node: node.to_string(),
        connection_id: number(&ids[8..]),
    };
    let issued = page_token(&key);
    assert_eq!(parse_page_token(&issued).ok(), Some(Some(key)));
}

/// `<connection id>\n<version>`: each present when its line is there.
fn headers(data: &[u8]) {
    let mut lines = data.splitn(2, |&byte| byte == b'\n');
    let mut map = HeaderMap::new();
    let id = lines.next().and_then(|id| HeaderValue::from_bytes(id).ok());
    if let Some(id) = &id {
        map.insert(CONNECTION_ID_HEADER, id.clone());
    }
    if let Some(version) = lines.next().and_then(|v| HeaderValue::from_bytes(v).ok()) {
        map.insert(AGENT_VERSION_HEADER, version);
    }
    let Ok((connection_id, version)) = announcement(&map, &LIMITS) else {
        return;
    };
    assert!(connection_id >= 0);
    assert!(version.len() <= LIMITS.version_bytes);
    match id {
        None => assert_eq!(connection_id, 0),
        Some(id) => {
            assert!(id.as_bytes().iter().all(u8::is_ascii_digit));
            let text = std::str::from_utf8(id.as_bytes()).unwrap_or_default();
            assert_eq!(text.parse::<i64>().ok(), Some(connection_id));
        }
    }
}

fn descriptor(data: &[u8]) {
    let Ok(descriptor) = Descriptor::decode(data) else {
        return;
    };
    if check_descriptor(&descriptor, &LIMITS).is_ok() {
        assert!(descriptor.services.len() <= LIMITS.services);
        assert!(descriptor.agent_version.len() <= LIMITS.version_bytes);
        for service in &descriptor.services {
            assert!(!service.is_empty() && service.len() <= 256);
            assert!(service
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.'));
        }
    }
}

fn grpc_message(data: &[u8]) {
    let decoded = decode_message(data);
    let encoded = encode_message(&decoded);
    assert!(encoded.bytes().all(|b| (0x20..=0x7e).contains(&b)));
    assert_eq!(decode_message(encoded.as_bytes()), decoded);
    // Decoding never grows the text but for U+FFFD standing in for invalid UTF-8 (3 bytes
    // for at least 1).
    assert!(decoded.len() <= data.len() * 3);
}
