//! gRPC length-prefixed message framing: `sluice_grpc::FrameDecoder` fed the input in chunks
//! (sizes chosen by the first byte), checked against a one-chunk decode of the same bytes and
//! against `encode_message` (the re-encoded messages are exactly the consumed input).
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sluice_grpc::{encode_message, FrameDecoder, FrameError, GrpcMessage};

const LIMIT: usize = 4096;

fn decode(chunks: &[Bytes]) -> (Vec<GrpcMessage>, Option<FrameError>, usize) {
    let mut decoder = FrameDecoder::new(LIMIT);
    let mut messages = Vec::new();
    for chunk in chunks {
        decoder.push(chunk.clone());
        loop {
            match decoder.next_message() {
                Ok(Some(message)) => {
                    assert!(message.data.len() <= LIMIT);
                    messages.push(message);
                }
                Ok(None) => break,
                Err(error) => return (messages, Some(error), decoder.buffered()),
            }
        }
    }
    let buffered = decoder.buffered();
    assert_eq!(decoder.finish().is_ok(), buffered == 0);
    (messages, None, buffered)
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let input = Bytes::copy_from_slice(rest);
    let step = usize::from(split % 16) + 1;
    let chunks: Vec<Bytes> = (0..input.len())
        .step_by(step)
        .map(|at| input.slice(at..(at + step).min(input.len())))
        .collect();
    let (messages, error, buffered) = decode(&chunks);
    let whole = decode(std::slice::from_ref(&input));
    assert_eq!(messages, whole.0, "chunking changed the messages");
    assert_eq!(error, whole.1, "chunking changed the error");

    let mut reencoded = Vec::new();
    for message in &messages {
        reencoded.extend_from_slice(&encode_message(message.compressed, &message.data));
    }
    assert_eq!(&input[..reencoded.len()], &reencoded[..]);
    if error.is_none() {
        assert_eq!(reencoded.len() + buffered, input.len());
    }
});
