//! `cargo +nightly fuzz run verify`: every entry point of the core on arbitrary
//! batches; see `fuzz/harness.rs` for what is generated and checked.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
