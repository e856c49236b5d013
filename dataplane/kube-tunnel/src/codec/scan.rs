//! A shallow walk over a message's protobuf fields, before it is decoded: a head's size and its
//! number of header fields are checked here, so a message of many tiny header fields is refused
//! before one allocation per field is made.

use super::{CodecError, ExchangeLimits};

/// The `head` field of both `HttpRequest` and `HttpResponse`.
const HEAD_FIELD: u64 = 1;
const WIRE_VARINT: u64 = 0;
const WIRE_FIXED64: u64 = 1;
const WIRE_LEN: u64 = 2;
const WIRE_FIXED32: u64 = 5;

/// Checks the message's size, and the size and header count of its heads (protobuf merges
/// repeated occurrences of one message field, so they are counted together).
/// `headers_field` is the head's `repeated HeaderField headers` field number.
pub(super) fn check_bounds(
    bytes: &[u8],
    limits: &ExchangeLimits,
    headers_field: u64,
) -> Result<(), CodecError> {
    let limit = limits.max_message_bytes();
    if bytes.len() > limit {
        return Err(CodecError::MessageTooLarge {
            len: bytes.len(),
            limit,
        });
    }
    let mut head_bytes = 0;
    let mut header_fields = 0;
    for field in Fields(bytes) {
        let (number, value) = field?;
        let (HEAD_FIELD, Value::Len(head)) = (number, value) else {
            continue;
        };
        head_bytes += head.len();
        if head_bytes > limits.max_head_bytes() {
            return Err(CodecError::HeadTooLarge {
                len: head_bytes,
                limit: limits.max_head_bytes(),
            });
        }
        for field in Fields(head) {
            if field?.0 != headers_field {
                continue;
            }
            header_fields += 1;
            if header_fields > limits.max_header_fields {
                return Err(CodecError::TooManyHeaders {
                    count: header_fields,
                    limit: limits.max_header_fields,
                });
            }
        }
    }
    Ok(())
}

enum Value<'a> {
    Len(&'a [u8]),
    Other,
}

/// The fields of one message: (field number, value), or an error at the first malformed one.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            // Stop after the first error: the rest cannot be framed.
            self.0 = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u64, Value<'a>), CodecError> {
        let key = self.varint()?;
        let number = key >> 3;
        let value = match key & 7 {
            WIRE_VARINT => {
                self.varint()?;
                Value::Other
            }
            WIRE_FIXED64 => {
                self.take(8)?;
                Value::Other
            }
            WIRE_LEN => {
                let len = usize::try_from(self.varint()?).map_err(|_| truncated())?;
                Value::Len(self.take(len)?)
            }
            WIRE_FIXED32 => {
                self.take(4)?;
                Value::Other
            }
            _ => {
                return Err(CodecError::Malformed(
                    "unsupported protobuf wire type".into(),
                ))
            }
        };
        Ok((number, value))
    }

    fn varint(&mut self) -> Result<u64, CodecError> {
        let mut value = 0u64;
        for (index, byte) in self.0.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * index);
            if byte & 0x80 == 0 {
                self.0 = &self.0[index + 1..];
                return Ok(value);
            }
        }
        Err(CodecError::Malformed("invalid protobuf varint".into()))
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], CodecError> {
        if len > self.0.len() {
            return Err(truncated());
        }
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(taken)
    }
}

fn truncated() -> CodecError {
    CodecError::Malformed("protobuf field runs past the message".into())
}
