//! The h2 patch's memo of the last unindexed literal (vendor/README.md): any sequence of HPACK
//! header blocks on one connection decodes to the same fields, and fails at the same block with
//! the same error, with the memo as without it, whatever settled quiet moments drop it between
//! blocks. Input: a table size byte (0: 4,096), then blocks, each a flags byte (bit 0: a settled quiet
//! moment before it), a length byte and that many bytes.
#![no_main]
use h2::fuzz_bridge::fuzz_logic::hpack_memo_outcomes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&size, mut rest)) = data.split_first() else {
        return;
    };
    let (mut blocks, mut settle) = (Vec::new(), Vec::new());
    while let [flags, length, tail @ ..] = rest {
        let length = usize::from(*length).min(tail.len());
        blocks.push(&tail[..length]);
        settle.push(flags & 1 == 1);
        rest = &tail[length..];
    }
    // 4,096 (the default) down to 16 in steps of 16: a small table evicts, so indices shift
    // under the memo.
    let table_size = 4096 - usize::from(size) * 16;
    for (index, (with_memo, without)) in hpack_memo_outcomes(&blocks, &settle, table_size)
        .into_iter()
        .enumerate()
    {
        assert_eq!(with_memo, without, "block {index}");
    }
});
