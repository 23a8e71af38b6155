//! Replays the fuzz corpus (`fuzz/corpus/verify`) on stable Rust: every input
//! the fuzzer found interesting, and every past finding, must run without a
//! panic and keep the invariants (see `fuzz/harness.rs`).

#[path = "../fuzz/harness.rs"]
mod harness;

#[test]
fn every_corpus_input_runs_clean() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/verify");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus directory exists") {
        let path = entry.expect("a directory entry").path();
        let data = std::fs::read(&path).expect("a readable corpus file");
        harness::run(&data);
        seen += 1;
    }
    assert!(seen > 0, "the corpus is empty");
}

#[test]
fn arbitrary_bytes_run_clean() {
    // A fixed-seed sweep of inputs, beyond the corpus.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut verified = 0;
    for len in 0..600 {
        let data: Vec<u8> = (0..len * 7 % 5000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        verified += usize::from(harness::run(&data));
    }
    assert!(verified > 0, "the sweep reached the success path");
}
