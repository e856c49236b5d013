//! Reading every interface's OpenFlow port number at once: a VM agent resolves the applied-to
//! interfaces a document names without a port number (a VM's internal port) by name.

use std::collections::BTreeMap;

use serde_json::json;

use crate::{OvsdbClient, OvsdbError};

/// Every interface that has an OpenFlow port number now, by name (interfaces still waiting
/// for one, or that failed, are absent). One select, no waiting.
pub async fn interface_ports(
    client: &mut OvsdbClient,
) -> Result<BTreeMap<String, u32>, OvsdbError> {
    let results = client
        .transact(
            "read the interfaces' ofports",
            vec![json!({"op": "select", "table": "Interface", "where": [], "columns": ["name", "ofport"]})],
        )
        .await?;
    let rows = results
        .first()
        .and_then(|result| result["rows"].as_array())
        .ok_or_else(|| OvsdbError::Protocol("select on Interface returned no rows".into()))?;
    Ok(rows
        .iter()
        .filter_map(|row| {
            let name = row["name"].as_str()?;
            let ofport = u32::try_from(row["ofport"].as_i64()?).ok()?;
            (ofport > 0).then(|| (name.to_string(), ofport))
        })
        .collect())
}
