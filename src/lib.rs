//! specstate: speculative decoding on llama.cpp with exact, checkpointable state.
//!
//! Layout: [`speculative`] is the seed contract (bounds, errors, validators and
//! the capture/restore protocol over the `mtp_session_*` shim);
//! [`native_info`] describes the native build; `bindings` is the thin PyO3
//! layer that exposes both to Python as `specstate._native`.

mod bindings;
pub mod native_info;
pub mod speculative;
