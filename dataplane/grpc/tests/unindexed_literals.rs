//! The h2 patch's memo of the last literal a peer sent without indexing (vendor/README.md):
//! a repeated never-indexed `authorization` is decoded once, and every request still gets
//! exactly the fields its own bytes encode, whether its value repeats, changes, or names a
//! dynamic-table entry whose index now means another name. Its own test binary: the Huffman
//! switch it turns is process-wide.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::block_on;
use common::echo::{echo_headers, start_echo_server};
use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_grpc::transport::{connect, ClientConnection, H2Settings};

const AUTHORITY: &str = "memo-probe.example:8443";

fn sensitive(value: &str) -> HeaderValue {
    let mut value = HeaderValue::from_str(value).unwrap();
    value.set_sensitive(true);
    value
}

/// Sends `headers`; asserts the server decoded exactly the `authorization` and `x-probe-*`
/// fields sent, no more.
async fn round_trip(connection: &ClientConnection, headers: Vec<(&'static str, HeaderValue)>) {
    let mut map = HeaderMap::new();
    for (name, value) in &headers {
        map.append(HeaderName::from_static(name), value.clone());
    }
    let echoed = echo_headers(connection, AUTHORITY, "/memo", map).await;
    let decoded: Vec<(String, String)> = echoed
        .iter()
        .filter_map(|(name, value)| {
            let sent = name.as_str().strip_prefix("x-echo-")?;
            Some((sent.to_string(), value.to_str().unwrap().to_string()))
        })
        .collect();
    let sent: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_string()))
        .collect();
    assert_eq!(decoded, sent);
}

#[test]
fn repeated_unindexed_literals_decode_as_their_own_bytes_say() {
    let token_a = format!("Bearer {}", "a".repeat(180));
    let token_b = format!("Bearer {}", "b".repeat(180));
    // One byte longer: its encoding starts like token_a's but for the length.
    let token_a_longer = format!("{token_a}a");
    let secret = "s3cr3t-".repeat(12);
    for huffman in [true, false] {
        h2::set_huffman_encoding(huffman);
        for legacy in [false, true] {
            let server = start_echo_server(legacy, None);
            block_on(legacy, async {
                let connection = connect(server, None, &H2Settings::default()).await.unwrap();
                let auth = |token: &str| ("authorization", sensitive(token));
                for token in [&token_a, &token_a, &token_b, &token_a, &token_b, &token_b] {
                    round_trip(&connection, vec![auth(token)]).await;
                }
                round_trip(&connection, vec![auth(&token_a_longer)]).await;
                round_trip(&connection, vec![auth(&token_a)]).await;
                // A short value, and two unindexed fields in one request.
                round_trip(&connection, vec![auth("Bearer x")]).await;
                round_trip(
                    &connection,
                    vec![auth(&token_a), ("x-probe-secret", sensitive(&secret))],
                )
                .await;
                round_trip(
                    &connection,
                    vec![auth(&token_a), ("x-probe-secret", sensitive(&secret))],
                )
                .await;

                // A never-indexed value whose name the encoder takes from the dynamic table:
                // the same bytes mean another name once a newer entry takes that index.
                round_trip(
                    &connection,
                    vec![("x-probe-a", HeaderValue::from_static("one"))],
                )
                .await;
                round_trip(&connection, vec![("x-probe-a", sensitive(&secret))]).await;
                round_trip(
                    &connection,
                    vec![("x-probe-b", HeaderValue::from_static("two"))],
                )
                .await;
                round_trip(&connection, vec![("x-probe-b", sensitive(&secret))]).await;
                round_trip(&connection, vec![("x-probe-a", sensitive(&secret))]).await;
            });
        }
    }
}
