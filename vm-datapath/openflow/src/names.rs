//! Names of OpenFlow message types and error types/codes, so an error reply can say what failed
//! in words.

const MESSAGE_TYPES: [&str; 35] = [
    "HELLO",
    "ERROR",
    "ECHO_REQUEST",
    "ECHO_REPLY",
    "EXPERIMENTER",
    "FEATURES_REQUEST",
    "FEATURES_REPLY",
    "GET_CONFIG_REQUEST",
    "GET_CONFIG_REPLY",
    "SET_CONFIG",
    "PACKET_IN",
    "FLOW_REMOVED",
    "PORT_STATUS",
    "PACKET_OUT",
    "FLOW_MOD",
    "GROUP_MOD",
    "PORT_MOD",
    "TABLE_MOD",
    "MULTIPART_REQUEST",
    "MULTIPART_REPLY",
    "BARRIER_REQUEST",
    "BARRIER_REPLY",
    "QUEUE_GET_CONFIG_REQUEST",
    "QUEUE_GET_CONFIG_REPLY",
    "ROLE_REQUEST",
    "ROLE_REPLY",
    "GET_ASYNC_REQUEST",
    "GET_ASYNC_REPLY",
    "SET_ASYNC",
    "METER_MOD",
    "ROLE_STATUS",
    "TABLE_STATUS",
    "REQUESTFORWARD",
    "BUNDLE_CONTROL",
    "BUNDLE_ADD_MESSAGE",
];

/// The name of an OpenFlow 1.3/1.4 message type.
pub fn message_type_name(msg_type: u8) -> &'static str {
    MESSAGE_TYPES
        .get(usize::from(msg_type))
        .copied()
        .unwrap_or("UNKNOWN_MESSAGE")
}

const ERROR_TYPES: [&str; 18] = [
    "HELLO_FAILED",
    "BAD_REQUEST",
    "BAD_ACTION",
    "BAD_INSTRUCTION",
    "BAD_MATCH",
    "FLOW_MOD_FAILED",
    "GROUP_MOD_FAILED",
    "PORT_MOD_FAILED",
    "TABLE_MOD_FAILED",
    "QUEUE_OP_FAILED",
    "SWITCH_CONFIG_FAILED",
    "ROLE_REQUEST_FAILED",
    "METER_MOD_FAILED",
    "TABLE_FEATURES_FAILED",
    "BAD_PROPERTY",
    "ASYNC_CONFIG_FAILED",
    "FLOW_MONITOR_FAILED",
    "BUNDLE_FAILED",
];

/// The name of an error type (`ofp_error_type`).
pub fn error_type_name(err_type: u16) -> &'static str {
    if err_type == 0xffff {
        return "EXPERIMENTER";
    }
    ERROR_TYPES
        .get(usize::from(err_type))
        .copied()
        .unwrap_or("UNKNOWN_ERROR_TYPE")
}

const BAD_REQUEST: &[&str] = &[
    "BAD_VERSION",
    "BAD_TYPE",
    "BAD_MULTIPART",
    "BAD_EXPERIMENTER",
    "BAD_EXP_TYPE",
    "EPERM",
    "BAD_LEN",
    "BUFFER_EMPTY",
    "BUFFER_UNKNOWN",
    "BAD_TABLE_ID",
    "IS_SLAVE",
    "BAD_PORT",
    "BAD_PACKET",
    "MULTIPART_BUFFER_OVERFLOW",
];
const BAD_ACTION: &[&str] = &[
    "BAD_TYPE",
    "BAD_LEN",
    "BAD_EXPERIMENTER",
    "BAD_EXP_TYPE",
    "BAD_OUT_PORT",
    "BAD_ARGUMENT",
    "EPERM",
    "TOO_MANY",
    "BAD_QUEUE",
    "BAD_OUT_GROUP",
    "MATCH_INCONSISTENT",
    "UNSUPPORTED_ORDER",
    "BAD_TAG",
    "BAD_SET_TYPE",
    "BAD_SET_LEN",
    "BAD_SET_ARGUMENT",
];
const BAD_INSTRUCTION: &[&str] = &[
    "UNKNOWN_INST",
    "UNSUP_INST",
    "BAD_TABLE_ID",
    "UNSUP_METADATA",
    "UNSUP_METADATA_MASK",
    "BAD_EXPERIMENTER",
    "BAD_EXP_TYPE",
    "BAD_LEN",
    "EPERM",
];
const BAD_MATCH: &[&str] = &[
    "BAD_TYPE",
    "BAD_LEN",
    "BAD_TAG",
    "BAD_DL_ADDR_MASK",
    "BAD_NW_ADDR_MASK",
    "BAD_WILDCARDS",
    "BAD_FIELD",
    "BAD_VALUE",
    "BAD_MASK",
    "BAD_PREREQ",
    "DUP_FIELD",
    "EPERM",
];
const FLOW_MOD_FAILED: &[&str] = &[
    "UNKNOWN",
    "TABLE_FULL",
    "BAD_TABLE_ID",
    "OVERLAP",
    "EPERM",
    "BAD_TIMEOUT",
    "BAD_COMMAND",
    "BAD_FLAGS",
];
const METER_MOD_FAILED: &[&str] = &[
    "UNKNOWN",
    "METER_EXISTS",
    "INVALID_METER",
    "UNKNOWN_METER",
    "BAD_COMMAND",
    "BAD_FLAGS",
    "BAD_RATE",
    "BAD_BURST",
    "BAD_BAND",
    "BAD_BAND_VALUE",
    "OUT_OF_METERS",
    "OUT_OF_BANDS",
];
const BUNDLE_FAILED: &[&str] = &[
    "UNKNOWN",
    "EPERM",
    "BAD_ID",
    "BUNDLE_EXIST",
    "BUNDLE_CLOSED",
    "OUT_OF_BUNDLES",
    "BAD_TYPE",
    "BAD_FLAGS",
    "MSG_BAD_LEN",
    "MSG_BAD_XID",
    "MSG_UNSUP",
    "MSG_CONFLICT",
    "MSG_TOO_MANY",
    "MSG_FAILED",
    "TIMEOUT",
    "BUNDLE_IN_PROGRESS",
];

/// The name of an error code within its type, when known.
pub fn error_code_name(err_type: u16, code: u16) -> Option<&'static str> {
    let table = match err_type {
        0 => &["INCOMPATIBLE", "EPERM"][..],
        1 => BAD_REQUEST,
        2 => BAD_ACTION,
        3 => BAD_INSTRUCTION,
        4 => BAD_MATCH,
        5 => FLOW_MOD_FAILED,
        12 => METER_MOD_FAILED,
        17 => BUNDLE_FAILED,
        _ => return None,
    };
    table.get(usize::from(code)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_values_and_tolerates_unknown_ones() {
        assert_eq!(message_type_name(14), "FLOW_MOD");
        assert_eq!(message_type_name(34), "BUNDLE_ADD_MESSAGE");
        assert_eq!(message_type_name(200), "UNKNOWN_MESSAGE");
        assert_eq!(error_type_name(4), "BAD_MATCH");
        assert_eq!(error_type_name(0xffff), "EXPERIMENTER");
        assert_eq!(error_code_name(4, 9), Some("BAD_PREREQ"));
        assert_eq!(error_code_name(17, 13), Some("MSG_FAILED"));
        assert_eq!(error_code_name(12, 1), Some("METER_EXISTS"));
        assert_eq!(error_code_name(4, 999), None);
        assert_eq!(error_code_name(99, 0), None);
    }
}
