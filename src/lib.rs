//! specstate: speculative decoding on llama.cpp with exact, checkpointable state.
//!
//! Layout: [`speculative`] is the seed contract (bounds, errors, validators and
//! the capture/restore protocol over the `mtp_session_*` shim);
//! [`native`] is the safe layer of RAII owners over llama.cpp's handles;
//! [`native_info`] describes the native build; `bindings` is the thin PyO3
//! layer that exposes both to Python as `specstate._native`.

mod bindings;
pub mod checkpoint;
pub mod generation;
pub mod generator;
pub mod native;
pub mod native_info;
pub mod sampling;
pub mod session;
pub mod speculative;
