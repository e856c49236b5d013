//! Bounds-checked big-endian reading and writing: every decoder goes through [`Reader`], so a
//! short or garbled message becomes a [`DecodeError`] instead of a panic.

use super::DecodeError;

/// A cursor over received bytes.
#[derive(Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < len {
            return Err(DecodeError::Truncated {
                what: self.what,
                needed: len,
                available: self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    /// The rest of the buffer.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let out = &self.buf[self.pos..];
        self.pos = self.buf.len();
        out
    }

    pub(crate) fn skip(&mut self, len: usize) -> Result<(), DecodeError> {
        self.bytes(len).map(|_| ())
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub(crate) fn u128(&mut self) -> Result<u128, DecodeError> {
        Ok(u128::from_be_bytes(self.array()?))
    }

    /// A sub-reader over the next `len` bytes.
    pub(crate) fn sub(
        &mut self,
        len: usize,
        what: &'static str,
    ) -> Result<Reader<'a>, DecodeError> {
        Ok(Reader::new(self.bytes(len)?, what))
    }
}

/// Appends big-endian values to a buffer the caller reuses.
pub(crate) trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_zeros(&mut self, n: usize);
    /// Writes a big-endian u16 at `at` (to fill in a length once it is known).
    fn set_u16(&mut self, at: usize, v: u16);
    /// Pads with zeros from `start` to a multiple of 8 bytes.
    fn pad_to_8(&mut self, start: usize);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_zeros(&mut self, n: usize) {
        self.resize(self.len() + n, 0);
    }
    fn set_u16(&mut self, at: usize, v: u16) {
        self[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    fn pad_to_8(&mut self, start: usize) {
        let len = self.len() - start;
        self.put_zeros((8 - len % 8) % 8);
    }
}

/// `len` rounded up to a multiple of 8.
pub(crate) fn round_up_8(len: usize) -> usize {
    len.div_ceil(8) * 8
}
