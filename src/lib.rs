//! specstate: speculative decoding on llama.cpp with exact, checkpointable state.
//!
//! Layout: [`limits`] is a leaf of bounds and of the rules over bare numbers
//! (threads, context lengths, rows, grammar sizes) that both the native layer
//! and the settings read; [`speculative`] is the speculative-session contract (bounds,
//! errors, validators and the capture/restore protocol over the
//! `mtp_session_*` shim's state calls);
//! [`native`] is the safe layer of RAII owners over llama.cpp's handles,
//! the only module that calls llama.cpp (its `info` describes the native
//! build); [`settings`] holds every default of a generation (one
//! `DEFAULT` per settings type) and the one validating rule for each
//! generation setting; [`engine`] is the one
//! speculative round engine with a drafter per mode; [`generator`] (five
//! modes) and [`greedy_generation`] (a session over caller-built contexts,
//! Python's `GreedyGeneration`) drive it;
//! [`chat`] renders conversations with llama.cpp's chat templates and
//! continues them turn by turn; [`checkpoint`] is the byte format and the
//! capture/restore operations; [`Error`] is the one error of the core, which
//! every layer's error converts into; and
//! `bindings` (feature `python`) is the thin PyO3 layer that exposes all of it
//! to Python as `specstate._native`.

pub mod batch_engine;
#[cfg(feature = "python")]
mod bindings;
pub mod chat;
pub mod checkpoint;
pub mod engine;
mod error;
pub mod generator;
pub mod greedy_generation;
#[cfg(test)]
mod layout_tests;
pub mod limits;
mod messages;
pub mod native;
pub mod sampling;
pub mod session;
pub mod settings;
#[cfg(test)]
mod signature_tests;
pub mod speculative;

pub use error::{Error, Result};
