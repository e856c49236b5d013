//! HTTP/2 written by hand, for attack tests that send what no client library would: frames
//! (RFC 9113 4.1) and HPACK literals without Huffman coding (RFC 7541).

/// Frame types and flags the attack tests use.
pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const CONTINUATION: u8 = 9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// One frame: 24-bit length, type, flags, stream id, payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2): any name
/// and value at all, `:path` included.
pub fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    for text in [name, value] {
        string_length(out, text.len());
        out.extend_from_slice(text.as_bytes());
    }
}

/// A string length: an integer with a 7-bit prefix, Huffman bit clear (RFC 7541 5.1).
fn string_length(out: &mut Vec<u8>, length: usize) {
    if length < 127 {
        out.push(length as u8);
        return;
    }
    out.push(127);
    let mut rest = length - 127;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A frame read back from the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY frame (RFC 9113 6.4, 6.8).
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let bytes = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes(bytes.try_into().ok()?))
    }
}

/// The next frame from `stream`; `Ok(None)` when the peer closed the connection between frames.
pub fn read_frame(stream: &mut impl std::io::Read) -> std::io::Result<Option<Frame>> {
    let mut head = [0u8; 9];
    match stream.read_exact(&mut head) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload)?;
    Ok(Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_as_written_with_their_error_codes() {
        let mut wire = frame(GOAWAY, 0, 0, &[0, 0, 0, 3, 0, 0, 0, 0xb, b'x']);
        wire.extend(frame(RST_STREAM, 0, 5, &[0, 0, 0, 7]));
        wire.extend(frame(HEADERS, END_HEADERS, 1, b"abc"));
        let mut reader = wire.as_slice();
        let goaway = read_frame(&mut reader).unwrap().unwrap();
        assert_eq!((goaway.kind, goaway.stream), (GOAWAY, 0));
        assert_eq!(goaway.error_code(), Some(0xb));
        let reset = read_frame(&mut reader).unwrap().unwrap();
        assert_eq!((reset.stream, reset.error_code()), (5, Some(7)));
        let headers = read_frame(&mut reader).unwrap().unwrap();
        assert_eq!(
            headers,
            Frame {
                kind: HEADERS,
                flags: END_HEADERS,
                stream: 1,
                payload: b"abc".to_vec()
            }
        );
        assert_eq!(headers.error_code(), None);
        assert_eq!(read_frame(&mut reader).unwrap(), None, "the end");
    }

    #[test]
    fn a_frame_cut_short_is_an_error() {
        let wire = frame(PING, 0, 0, &[1; 8]);
        assert!(read_frame(&mut &wire[..12]).is_err());
    }
}
