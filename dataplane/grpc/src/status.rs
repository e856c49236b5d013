//! gRPC status codes and the `grpc-message` encoding.

use std::fmt;

/// The gRPC status codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// Any number outside 0..=16 is `Unknown`, as the spec asks of receivers.
    pub fn from_u32(value: u32) -> Self {
        Self::ALL
            .get(value as usize)
            .copied()
            .unwrap_or(Code::Unknown)
    }

    /// Parses a `grpc-status` header value.
    pub fn from_header(value: &[u8]) -> Self {
        std::str::from_utf8(value)
            .ok()
            .and_then(|text| text.parse::<u32>().ok())
            .map_or(Code::Unknown, Self::from_u32)
    }

    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// The decimal form used in the `grpc-status` header.
    pub fn header_value(self) -> &'static str {
        const VALUES: [&str; 17] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
            "16",
        ];
        VALUES[self as usize]
    }

    /// The canonical upper-case name, for logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A status to end a call with: a code and a message for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The message percent-encoded for the `grpc-message` header.
    pub fn encoded_message(&self) -> String {
        encode_message(&self.message)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

/// Percent-encodes per the gRPC HTTP/2 spec: bytes outside printable ASCII (0x20..=0x7E), and
/// '%' itself, become `%XX` of the UTF-8 bytes.
pub fn encode_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Decodes a `grpc-message` value; malformed escapes are kept literally and invalid UTF-8 is
/// replaced, never an error (the spec asks receivers to be lenient).
pub fn decode_message(value: &[u8]) -> String {
    let mut bytes = Vec::with_capacity(value.len());
    let mut index = 0;
    while index < value.len() {
        if value[index] == b'%' && index + 2 < value.len() {
            // Two hex digits exactly: `from_str_radix` alone would also take a sign (`%+1`).
            let (high, low) = (value[index + 1], value[index + 2]);
            if let (Some(high), Some(low)) = (hex_digit(high), hex_digit(low)) {
                bytes.push(high << 4 | low);
                index += 3;
                continue;
            }
        }
        bytes.push(value[index]);
        index += 1;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn hex_digit(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|digit| digit as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_escape_is_two_hex_digits_and_nothing_else() {
        assert_eq!(decode_message(b"a%41%2f%+1%-1%4"), "aA/%+1%-1%4");
    }

    #[test]
    fn codes_round_trip_and_unknown_numbers_map_to_unknown() {
        for value in 0..=16u32 {
            let code = Code::from_u32(value);
            assert_eq!(code.as_u32(), value);
            assert_eq!(Code::from_header(code.header_value().as_bytes()), code);
        }
        assert_eq!(Code::from_u32(17), Code::Unknown);
        assert_eq!(Code::from_header(b"x"), Code::Unknown);
        assert_eq!(Code::DeadlineExceeded.to_string(), "DEADLINE_EXCEEDED");
    }

    #[test]
    fn messages_are_percent_encoded_per_spec() {
        assert_eq!(
            encode_message("agent 7 not connected"),
            "agent 7 not connected"
        );
        assert_eq!(encode_message("100% done\n"), "100%25 done%0A");
        assert_eq!(encode_message("héllo"), "h%C3%A9llo");
        assert_eq!(decode_message(b"h%C3%A9llo 100%25"), "héllo 100%");
        assert_eq!(decode_message(b"bad %zz and %4"), "bad %zz and %4");
        assert_eq!(
            Status::new(Code::NotFound, "a%b").encoded_message(),
            "a%25b"
        );
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_identity(message in ".{0,100}") {
            prop_assert_eq!(decode_message(encode_message(&message).as_bytes()), message);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_message(&bytes);
            let _ = Code::from_header(&bytes);
        }
    }
}
