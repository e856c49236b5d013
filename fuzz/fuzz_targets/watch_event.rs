//! What a role reads from the control plane's watch streams and lists: bytes split into lines
//! by `sluice_watch_client::LineDecoder` (bounded) and each line decoded by `decode_event`
//! (whose ERROR events go through the shared `Status` decoder), and each line as an error
//! body through that decoder (`sluice_kube_status::Status::decode`) directly. A hostile or
//! broken server gets errors, never a panic or an unbounded buffer.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_kube_status::Status;
use sluice_watch_client::{decode_event, LineDecoder};

const MAX_LINE: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let cut = usize::from(split).min(stream.len());
    let mut lines = LineDecoder::new(MAX_LINE);
    for chunk in [&stream[..cut], &stream[cut..]] {
        match lines.push(chunk) {
            Ok(complete) => {
                for line in complete {
                    assert!(line.len() <= MAX_LINE);
                    let _ = decode_event(&line);
                    if let Ok(status) = Status::decode(&line) {
                        // What decodes re-encodes to a document that decodes the same.
                        assert_eq!(Status::decode(&status.to_vec()).ok(), Some(status));
                    }
                }
            }
            Err(_) => return,
        }
        assert!(lines.pending() <= MAX_LINE);
    }
});
