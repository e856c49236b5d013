//! A seeded xorshift and byte mutations for the binary's property tests (`flag_props`,
//! `view_props`): the fuzz workspace cannot link the binary, and proptest is not a dependency of
//! this crate, so these keep every run the same without one.

/// xorshift64: reproducible without a dependency.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(crate) fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// One to `max_edits + 1` byte edits of `text` (replace, insert or delete), each byte drawn from
/// `alphabet`.
pub(crate) fn mutate(rng: &mut Rng, text: &str, alphabet: &[u8], max_edits: usize) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..=rng.below(max_edits) {
        let at = rng.below(bytes.len() + 1);
        let byte = alphabet[rng.below(alphabet.len())];
        match rng.below(3) {
            0 if at < bytes.len() => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            _ if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => {}
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}
