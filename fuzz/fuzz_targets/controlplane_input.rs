//! What the control plane and its roles read besides requests (`api_request`) and watch
//! events (`watch_event`): a LIST answer a role decodes (`sluice_watch_client::decode_list`),
//! Agent and Token objects checked by their kinds' validation (`kinds::agent`, `kinds::token`)
//! and a Token read as a credential (`kinds::token_identity`), and a client certificate's
//! subject (`server::identity_of`). The first byte picks the decoder.
//!
//! Properties: an accepted list has a resourceVersion and keys each item by its own non-empty
//! name and namespace; a Token the API accepts always authenticates as the role and subject it
//! names; an identity from a certificate or a Token has a valid subject and a role that reads
//! back from its name.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_apiserver::auth::{Identity, Role};
use sluice_apiserver::kinds;
use sluice_apiserver::server::identity_of;
use sluice_watch_client::decode_list;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => list(rest),
        1 => objects(rest),
        _ => certificate(rest),
    }
});

fn list(data: &[u8]) {
    let Ok(page) = decode_list(Bytes::copy_from_slice(data)) else {
        return;
    };
    assert!(!page.resource_version.is_empty());
    if let Some(token) = &page.continue_token {
        assert!(!token.is_empty());
    }
    for (key, item) in &page.items {
        let field = |name: &str| item["metadata"][name].as_str().unwrap_or_default();
        assert!(!key.name.is_empty());
        assert_eq!(key.name, field("name"));
        assert_eq!(key.namespace, field("namespace"));
    }
}

fn valid_identity(identity: &Identity) {
    assert_eq!(
        Identity::new(identity.role, &identity.subject)
            .ok()
            .as_ref(),
        Some(identity)
    );
    assert_eq!(
        identity.role.as_str().parse::<Role>().ok(),
        Some(identity.role)
    );
}

fn objects(data: &[u8]) {
    let Ok(object) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let _ = (kinds::agent().validate)(&object);
    let token_errors = (kinds::token().validate)(&object);
    match kinds::token_identity(&object) {
        Some((digest, identity)) => {
            valid_identity(&identity);
            assert_eq!(
                object["spec"]["subject"].as_str(),
                Some(identity.subject.as_str())
            );
            assert_eq!(
                object["spec"]["tokenSha256"].as_str(),
                Some(digest.as_str())
            );
        }
        None => assert!(
            !token_errors.is_empty(),
            "a Token the API accepts must authenticate"
        ),
    }
}

fn certificate(data: &[u8]) {
    if let Ok(identity) = identity_of(data) {
        valid_identity(&identity);
    }
}
