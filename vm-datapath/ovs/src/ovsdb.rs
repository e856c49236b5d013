//! OVSDB client (RFC 7047 JSON-RPC over the database's unix socket) for the bridge and port
//! set-up the policy engine needs. serde_json is the whole codec: OVSDB messages are JSON values
//! sent back to back, which `serde_json`'s streaming deserializer splits.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const DATABASE: &str = "Open_vSwitch";

/// What went wrong talking to ovsdb-server.
#[derive(Debug, thiserror::Error)]
pub enum OvsdbError {
    #[error("connecting to OVSDB at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("I/O with OVSDB: {0}")]
    Io(#[from] std::io::Error),
    #[error("OVSDB sent invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("OVSDB closed the connection")]
    Closed,
    #[error("OVSDB {method} failed: {error}")]
    Rpc { method: &'static str, error: Value },
    #[error("OVSDB transaction ({what}) failed at operation {index}: {error}: {details}")]
    OperationFailed {
        what: String,
        index: usize,
        error: String,
        details: String,
    },
    #[error("{table} `{name}` does not exist")]
    NotFound { table: &'static str, name: String },
    #[error("{table} `{name}` already exists")]
    AlreadyExists { table: &'static str, name: String },
    #[error("{what} did not happen within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    #[error("interface `{name}` could not be created by ovs-vswitchd: {error}")]
    Interface { name: String, error: String },
    #[error("unexpected OVSDB reply: {0}")]
    Protocol(String),
}

/// The kind of port to add to a bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortKind {
    /// An OVS internal port (a new network device OVS creates).
    Internal,
    /// An existing network device, e.g. one end of a veth pair.
    System,
}

/// Splits a byte stream of back-to-back JSON values (how OVSDB frames its messages).
#[derive(Debug, Default)]
pub struct JsonStream {
    buf: Vec<u8>,
}

impl JsonStream {
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Takes the next complete value out of the buffer; `None` until one is complete.
    pub fn next_value(&mut self) -> Result<Option<Value>, OvsdbError> {
        let mut values = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
        match values.next() {
            None => {
                self.buf.clear(); // only whitespace
                Ok(None)
            }
            Some(Ok(value)) => {
                let used = values.byte_offset();
                self.buf.drain(..used);
                Ok(Some(value))
            }
            Some(Err(err)) if err.is_eof() => Ok(None),
            Some(Err(err)) => Err(err.into()),
        }
    }
}

/// Checks the result of a `transact` of `count` operations: the first failed operation (or a
/// failure of the whole transaction) becomes an error naming it.
pub fn check_transact_result(
    what: &str,
    count: usize,
    result: &Value,
) -> Result<Vec<Value>, OvsdbError> {
    let results = result.as_array().ok_or_else(|| {
        OvsdbError::Protocol(format!("transact result is not an array: {result}"))
    })?;
    for (index, outcome) in results.iter().enumerate() {
        if let Some(error) = outcome.get("error").and_then(Value::as_str) {
            return Err(OvsdbError::OperationFailed {
                what: what.to_string(),
                index,
                error: error.to_string(),
                details: outcome
                    .get("details")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            });
        }
    }
    // A transaction that fails after its operations appends one extra error result.
    if results.len() != count {
        return Err(OvsdbError::Protocol(format!(
            "transaction ({what}) returned {} results for {count} operations: {result}",
            results.len()
        )));
    }
    Ok(results.clone())
}

/// A connection to ovsdb-server.
pub struct OvsdbClient {
    stream: UnixStream,
    received: JsonStream,
    next_id: u64,
    timeout: Duration,
}

impl OvsdbClient {
    /// Connects to the database socket (e.g. `/var/run/openvswitch/db.sock`). `timeout` bounds
    /// every request and every wait for ovs-vswitchd.
    pub async fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Self, OvsdbError> {
        let path = path.as_ref();
        let stream = tokio::time::timeout(timeout, UnixStream::connect(path))
            .await
            .map_err(|_| OvsdbError::Timeout {
                what: format!("connecting to {}", path.display()),
                timeout,
            })?
            .map_err(|source| OvsdbError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(OvsdbClient {
            stream,
            received: JsonStream::default(),
            next_id: 1,
            timeout,
        })
    }

    /// Sends one JSON-RPC request and returns its result, answering the server's echo requests
    /// while waiting.
    async fn request(&mut self, method: &'static str, params: Value) -> Result<Value, OvsdbError> {
        let id = self.next_id;
        self.next_id += 1;
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.request_inner(method, params, id))
            .await
            .map_err(|_| OvsdbError::Timeout {
                what: format!("the reply to OVSDB {method}"),
                timeout,
            })?
    }

    async fn request_inner(
        &mut self,
        method: &'static str,
        params: Value,
        id: u64,
    ) -> Result<Value, OvsdbError> {
        let request = serde_json::to_vec(&json!({"method": method, "params": params, "id": id}))?;
        self.stream.write_all(&request).await?;
        loop {
            while let Some(message) = self.received.next_value()? {
                if message.get("method").and_then(Value::as_str) == Some("echo") {
                    let reply =
                        json!({"result": message["params"], "error": null, "id": message["id"]});
                    self.stream.write_all(&serde_json::to_vec(&reply)?).await?;
                    continue;
                }
                if message.get("id").and_then(Value::as_u64) != Some(id) {
                    continue; // a notification or a stale reply
                }
                return match message.get("error") {
                    Some(error) if !error.is_null() => Err(OvsdbError::Rpc {
                        method,
                        error: error.clone(),
                    }),
                    _ => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
                };
            }
            let mut chunk = [0u8; 16 << 10];
            let read = self.stream.read(&mut chunk).await?;
            if read == 0 {
                return Err(OvsdbError::Closed);
            }
            self.received.push(&chunk[..read]);
        }
    }

    /// Runs a transaction on the Open_vSwitch database; fails with the first failed operation.
    pub async fn transact(
        &mut self,
        what: &str,
        operations: Vec<Value>,
    ) -> Result<Vec<Value>, OvsdbError> {
        let mut params = vec![json!(DATABASE)];
        params.extend(operations);
        let count = params.len() - 1;
        let result = self.request("transact", Value::Array(params)).await?;
        check_transact_result(what, count, &result)
    }

    /// The `_uuid` of the row of `table` named `name`, if there is one.
    pub(crate) async fn uuid_of(
        &mut self,
        table: &'static str,
        name: &str,
    ) -> Result<Option<String>, OvsdbError> {
        let results = self
            .transact(
                &format!("look up {table} {name}"),
                vec![json!({"op": "select", "table": table, "where": [["name", "==", name]], "columns": ["_uuid"]})],
            )
            .await?;
        Ok(results
            .first()
            .and_then(|r| r["rows"].as_array())
            .and_then(|rows| rows.first())
            .and_then(|row| row["_uuid"].get(1))
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// Operations that bump `next_cfg`, so [`Self::wait_for_vswitchd`] can tell when
    /// ovs-vswitchd has applied the transaction (what `ovs-vsctl` does).
    pub(crate) fn bump_next_cfg() -> [Value; 2] {
        [
            json!({"op": "mutate", "table": "Open_vSwitch", "where": [], "mutations": [["next_cfg", "+=", 1]]}),
            json!({"op": "select", "table": "Open_vSwitch", "where": [], "columns": ["next_cfg"]}),
        ]
    }

    pub(crate) fn next_cfg_of(results: &[Value]) -> Result<i64, OvsdbError> {
        results
            .last()
            .and_then(|r| r["rows"].get(0))
            .and_then(|row| row["next_cfg"].as_i64())
            .ok_or_else(|| {
                OvsdbError::Protocol("no next_cfg in the transaction result".to_string())
            })
    }

    /// Waits until ovs-vswitchd has caught up with configuration number `next_cfg`.
    pub(crate) async fn wait_for_vswitchd(
        &mut self,
        next_cfg: i64,
        what: &str,
    ) -> Result<(), OvsdbError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let results = self
                .transact(
                    "read cur_cfg",
                    vec![json!({"op": "select", "table": "Open_vSwitch", "where": [], "columns": ["cur_cfg"]})],
                )
                .await?;
            let cur_cfg = results
                .first()
                .and_then(|r| r["rows"].get(0))
                .and_then(|row| row["cur_cfg"].as_i64())
                .unwrap_or(0);
            if cur_cfg >= next_cfg {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(OvsdbError::Timeout {
                    what: format!("ovs-vswitchd applying {what}"),
                    timeout: self.timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Creates bridge `name` on the userspace (`netdev`) datapath, speaking OpenFlow 1.3-1.5,
    /// in fail mode `secure` (no NORMAL flow before ours), and waits until ovs-vswitchd has
    /// created it (its management socket exists from then on).
    pub async fn create_bridge(&mut self, name: &str) -> Result<(), OvsdbError> {
        if self.uuid_of("Bridge", name).await?.is_some() {
            return Err(OvsdbError::AlreadyExists {
                table: "Bridge",
                name: name.to_string(),
            });
        }
        let mut operations = vec![
            json!({"op": "insert", "table": "Interface", "row": {"name": name, "type": "internal"}, "uuid-name": "iface"}),
            json!({"op": "insert", "table": "Port", "row": {"name": name, "interfaces": ["named-uuid", "iface"]}, "uuid-name": "port"}),
            json!({"op": "insert", "table": "Bridge", "row": {
                "name": name,
                "ports": ["named-uuid", "port"],
                "datapath_type": "netdev",
                "protocols": ["set", ["OpenFlow13", "OpenFlow14", "OpenFlow15"]],
                "fail_mode": "secure",
            }, "uuid-name": "bridge"}),
            json!({"op": "mutate", "table": "Open_vSwitch", "where": [], "mutations": [["bridges", "insert", ["set", [["named-uuid", "bridge"]]]]]}),
        ];
        operations.extend(Self::bump_next_cfg());
        let results = self
            .transact(&format!("create bridge {name}"), operations)
            .await?;
        let next_cfg = Self::next_cfg_of(&results)?;
        self.wait_for_vswitchd(next_cfg, &format!("bridge {name}"))
            .await
    }

    /// Removes `other_config:flow-restore-wait` when it is `true`; returns whether it was.
    ///
    /// Whoever restarts ovs-vswitchd the way `ovs-ctl restart` does sets it first: the new
    /// process then forwards nothing (and, with the kernel datapath, leaves the old datapath
    /// flows alone) until the flows are restored and the key is cleared. The agent restores its
    /// flows by replaying them, so it clears the key afterwards (as Antrea's agent does).
    pub async fn clear_flow_restore_wait(&mut self) -> Result<bool, OvsdbError> {
        let results = self
            .transact(
                "read other_config",
                vec![json!({"op": "select", "table": "Open_vSwitch", "where": [], "columns": ["other_config"]})],
            )
            .await?;
        let waiting = results
            .first()
            .and_then(|r| r["rows"].get(0))
            .and_then(|row| row["other_config"].get(1))
            .and_then(Value::as_array)
            .is_some_and(|pairs| {
                pairs.iter().any(|pair| {
                    pair.get(0).and_then(Value::as_str) == Some("flow-restore-wait")
                        && pair.get(1).and_then(Value::as_str) == Some("true")
                })
            });
        if waiting {
            self.transact(
                "clear other_config:flow-restore-wait",
                vec![json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
                    "mutations": [["other_config", "delete", ["set", ["flow-restore-wait"]]]]})],
            )
            .await?;
        }
        Ok(waiting)
    }

    /// Deletes bridge `name` (its ports go with it).
    pub async fn delete_bridge(&mut self, name: &str) -> Result<(), OvsdbError> {
        let uuid = self
            .uuid_of("Bridge", name)
            .await?
            .ok_or_else(|| OvsdbError::NotFound {
                table: "Bridge",
                name: name.to_string(),
            })?;
        let mut operations = vec![json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
            "mutations": [["bridges", "delete", ["set", [["uuid", uuid]]]]]})];
        operations.extend(Self::bump_next_cfg());
        let results = self
            .transact(&format!("delete bridge {name}"), operations)
            .await?;
        let next_cfg = Self::next_cfg_of(&results)?;
        self.wait_for_vswitchd(next_cfg, &format!("deleting bridge {name}"))
            .await
    }

    /// Adds port `port` (one interface of the same name) to `bridge` and returns its OpenFlow
    /// port number once ovs-vswitchd has assigned one.
    pub async fn add_port(
        &mut self,
        bridge: &str,
        port: &str,
        kind: PortKind,
    ) -> Result<u32, OvsdbError> {
        if self.uuid_of("Bridge", bridge).await?.is_none() {
            return Err(OvsdbError::NotFound {
                table: "Bridge",
                name: bridge.to_string(),
            });
        }
        if self.uuid_of("Port", port).await?.is_some() {
            return Err(OvsdbError::AlreadyExists {
                table: "Port",
                name: port.to_string(),
            });
        }
        let interface_type = match kind {
            PortKind::Internal => "internal",
            PortKind::System => "",
        };
        let mut operations = vec![
            json!({"op": "insert", "table": "Interface", "row": {"name": port, "type": interface_type}, "uuid-name": "iface"}),
            json!({"op": "insert", "table": "Port", "row": {"name": port, "interfaces": ["named-uuid", "iface"]}, "uuid-name": "port"}),
            json!({"op": "mutate", "table": "Bridge", "where": [["name", "==", bridge]],
                "mutations": [["ports", "insert", ["set", [["named-uuid", "port"]]]]]}),
        ];
        operations.extend(Self::bump_next_cfg());
        let results = self
            .transact(&format!("add port {port} to {bridge}"), operations)
            .await?;
        let next_cfg = Self::next_cfg_of(&results)?;
        self.wait_for_vswitchd(next_cfg, &format!("port {port}"))
            .await?;
        self.ofport(port).await
    }

    /// Removes port `port` from `bridge`.
    pub async fn delete_port(&mut self, bridge: &str, port: &str) -> Result<(), OvsdbError> {
        let uuid = self
            .uuid_of("Port", port)
            .await?
            .ok_or_else(|| OvsdbError::NotFound {
                table: "Port",
                name: port.to_string(),
            })?;
        let mut operations = vec![
            json!({"op": "mutate", "table": "Bridge", "where": [["name", "==", bridge]],
            "mutations": [["ports", "delete", ["set", [["uuid", uuid]]]]]}),
        ];
        operations.extend(Self::bump_next_cfg());
        let results = self
            .transact(&format!("delete port {port} from {bridge}"), operations)
            .await?;
        let next_cfg = Self::next_cfg_of(&results)?;
        self.wait_for_vswitchd(next_cfg, &format!("deleting port {port}"))
            .await
    }

    /// The OpenFlow port number of interface `name`, waiting until ovs-vswitchd assigns one.
    pub async fn ofport(&mut self, name: &str) -> Result<u32, OvsdbError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let results = self
                .transact(
                    &format!("read ofport of {name}"),
                    vec![json!({"op": "select", "table": "Interface", "where": [["name", "==", name]], "columns": ["ofport", "error"]})],
                )
                .await?;
            let row = results
                .first()
                .and_then(|r| r["rows"].get(0))
                .cloned()
                .ok_or_else(|| OvsdbError::NotFound {
                    table: "Interface",
                    name: name.to_string(),
                })?;
            // Unassigned: an empty set `["set", []]`; failed: -1 with the reason in `error`.
            match row["ofport"].as_i64() {
                Some(ofport) if ofport > 0 => {
                    return u32::try_from(ofport)
                        .map_err(|_| OvsdbError::Protocol(format!("ofport {ofport} out of range")))
                }
                Some(-1) => {
                    if let Some(error) = row["error"].as_str() {
                        return Err(OvsdbError::Interface {
                            name: name.to_string(),
                            error: error.to_string(),
                        });
                    }
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(OvsdbError::Timeout {
                    what: format!("an ofport for {name}"),
                    timeout: self.timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn transact_failures_name_the_operation() {
        let ok = json!([{"uuid": ["uuid", "x"]}, {}]);
        assert_eq!(check_transact_result("t", 2, &ok).unwrap().len(), 2);
        let failed = json!([{}, {"error": "constraint violation", "details": "no such bridge"}]);
        let error = check_transact_result("add port p", 2, &failed).unwrap_err();
        assert_eq!(
            error.to_string(),
            "OVSDB transaction (add port p) failed at operation 1: constraint violation: no such bridge"
        );
        let commit_failed = json!([{}, {"error": "referential integrity violation"}]);
        assert!(matches!(
            check_transact_result("t", 1, &commit_failed),
            Err(OvsdbError::OperationFailed { index: 1, .. })
        ));
        assert!(matches!(
            check_transact_result("t", 1, &json!({"not": "an array"})),
            Err(OvsdbError::Protocol(_))
        ));
    }

    proptest! {
        #[test]
        fn json_stream_splits_values_at_any_chunk_boundary(
            numbers in proptest::collection::vec(any::<i64>(), 1..8),
            cut in any::<proptest::sample::Index>(),
        ) {
            let values: Vec<Value> = numbers
                .iter()
                .map(|n| json!({"id": n, "result": [n.to_string()], "error": null}))
                .collect();
            let mut bytes = Vec::new();
            for value in &values {
                bytes.extend(serde_json::to_vec(value).unwrap());
            }
            let cut = cut.index(bytes.len());
            let mut stream = JsonStream::default();
            let mut seen = Vec::new();
            for chunk in [&bytes[..cut], &bytes[cut..]] {
                stream.push(chunk);
                while let Some(value) = stream.next_value().unwrap() {
                    seen.push(value);
                }
            }
            prop_assert_eq!(seen, values);
        }

        #[test]
        fn arbitrary_input_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut stream = JsonStream::default();
            stream.push(&bytes);
            for _ in 0..bytes.len() + 1 {
                match stream.next_value() {
                    Ok(Some(value)) => { let _ = check_transact_result("t", 1, &value); }
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }
}
