#[cfg(fuzzing)]
pub mod fuzz_logic {
    use crate::hpack;
    use bytes::BytesMut;
    use http::header::HeaderName;
    use std::io::Cursor;
    use std::ops::ControlFlow;

    pub fn fuzz_hpack(data_: &[u8]) {
        let mut decoder_ = hpack::Decoder::new(0);
        let mut buf = BytesMut::new();
        buf.extend(data_);
        let _dec_res = decoder_.decode(&mut Cursor::new(&mut buf), |_h| ControlFlow::Continue(()));

        if let Ok(s) = std::str::from_utf8(data_) {
            if let Ok(h) = http::Method::from_bytes(s.as_bytes()) {
                let m_ = hpack::Header::Method(h);
                let mut encoder = hpack::Encoder::new(0, 0);
                let _res = encode(&mut encoder, vec![m_]);
            }
        }
    }

    /// Sluice patch: decodes `blocks` in order on two decoders, one with the memo of the last
    /// unindexed literal (`hpack::decoder::LiteralMemo`) and one without it, and returns both
    /// outcomes per block (the fields, or the error): they must be equal. `settle[i]` drops the
    /// memo before block `i`, as a settled quiet moment does.
    pub fn hpack_memo_outcomes(
        blocks: &[&[u8]],
        settle: &[bool],
        table_size: usize,
    ) -> Vec<(HpackOutcome, HpackOutcome)> {
        let mut with_memo = hpack::Decoder::new(table_size);
        let mut without = hpack::Decoder::new(table_size);
        without.set_memo(false);
        let mut outcomes = Vec::new();
        for (index, block) in blocks.iter().enumerate() {
            if settle.get(index).copied().unwrap_or(false) {
                with_memo.release_settled();
            }
            let a = decode_block(&mut with_memo, block);
            let b = decode_block(&mut without, block);
            let failed = a.is_err() || b.is_err();
            outcomes.push((a, b));
            if failed {
                // A connection ends at a decoding error; what follows would not be decoded.
                break;
            }
        }
        outcomes
    }

    /// One header block's fields, or why it did not decode.
    pub type HpackOutcome = Result<Vec<String>, String>;

    fn decode_block(decoder: &mut hpack::Decoder, block: &[u8]) -> HpackOutcome {
        let mut buf = BytesMut::from(block);
        let mut fields = Vec::new();
        decoder
            .decode(&mut Cursor::new(&mut buf), |header| {
                fields.push(format!("{header:?}"));
                ControlFlow::Continue(())
            })
            .map_err(|error| format!("{error:?}"))?;
        Ok(fields)
    }

    fn encode(e: &mut hpack::Encoder, hdrs: Vec<hpack::Header<Option<HeaderName>>>) -> BytesMut {
        let mut dst = BytesMut::with_capacity(1024);
        e.encode(&mut hdrs.into_iter(), &mut dst);
        dst
    }
}
