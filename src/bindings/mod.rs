//! The Python module `specstate._native`: a thin layer over the Rust core.

mod arguments;
mod batch_engine;
mod buffers;
mod chat;
mod context;
mod corpus;
mod embedding;
mod errors;
mod generator;
mod guarded;
mod info;
mod model;
mod session;
mod shared_engine;
mod threads;
mod validators;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::checkpoint::MAX_CHECKPOINT_BYTES;
use crate::limits::{MAX_GRAMMAR_BYTES, MAX_THREADS};
use crate::settings::{Mode, DRAFT_POLICIES};
use crate::speculative::{
    SpeculativeStateError, MAX_SPECULATIVE_DRAFT_TOKENS, MAX_SPECULATIVE_PROMPT_TOKENS,
    MAX_SPECULATIVE_SEQUENCES, MAX_SPECULATIVE_STATE_BYTES,
};

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    info::ensure_cpu_supported()?;
    errors::classes::import_all(module.py())?;
    module.add("MAX_CHECKPOINT_BYTES", MAX_CHECKPOINT_BYTES)?;
    module.add("MAX_GRAMMAR_BYTES", MAX_GRAMMAR_BYTES)?;
    module.add("MAX_THREADS", MAX_THREADS)?;
    module.add("MAX_SEQUENCES", crate::limits::MAX_SEQUENCES)?;
    module.add("EXACT_PROMPT_ROWS", crate::limits::EXACT_PROMPT_ROWS)?;
    module.add("LLAMA_N_BATCH", crate::limits::LLAMA_N_BATCH)?;
    module.add(
        "SPECULATIVE_STATE_MESSAGES",
        std::collections::BTreeMap::from(SpeculativeStateError::MESSAGES),
    )?;
    module.add(
        "NATIVE_MESSAGES",
        std::collections::BTreeMap::from(crate::native::NativeError::MESSAGES),
    )?;
    module.add(
        "GENERATOR_DEFAULTS",
        generator::generator_defaults(module.py())?,
    )?;
    module.add("MODES", PyTuple::new(module.py(), Mode::NAMES)?)?;
    module.add("DRAFT_POLICIES", PyTuple::new(module.py(), DRAFT_POLICIES)?)?;
    module.add("MAX_SPECULATIVE_STATE_BYTES", MAX_SPECULATIVE_STATE_BYTES)?;
    module.add("MAX_SPECULATIVE_SEQUENCES", MAX_SPECULATIVE_SEQUENCES)?;
    module.add("MAX_SPECULATIVE_DRAFT_TOKENS", MAX_SPECULATIVE_DRAFT_TOKENS)?;
    module.add(
        "MAX_SPECULATIVE_PROMPT_TOKENS",
        MAX_SPECULATIVE_PROMPT_TOKENS,
    )?;
    module.add_class::<validators::ContextCapacity>()?;
    module.add_class::<model::PyModel>()?;
    module.add_class::<chat::PyChatTemplate>()?;
    module.add_class::<chat::PyToolRender>()?;
    module.add_class::<context::PyContext>()?;
    module.add_class::<context::PyBatch>()?;
    module.add_class::<session::PySession>()?;
    module.add_class::<session::PyGreedyGeneration>()?;
    module.add_class::<generator::PyGenerator>()?;
    module.add_class::<corpus::PyLookupCorpus>()?;
    module.add_class::<batch_engine::PyBatchEngine>()?;
    module.add_class::<shared_engine::PySharedEngine>()?;
    embedding::register(module)?;
    module.add_function(wrap_pyfunction!(generator::inspect_checkpoint, module)?)?;
    module.add_function(wrap_pyfunction!(generator::model_fingerprint, module)?)?;
    module.add_function(wrap_pyfunction!(generator::check_sampling, module)?)?;
    module.add_function(wrap_pyfunction!(validators::validate_config, module)?)?;
    module.add_function(wrap_pyfunction!(
        validators::validate_context_capacities,
        module
    )?)?;
    module.add_function(wrap_pyfunction!(validators::validate_state_size, module)?)?;
    module.add_function(wrap_pyfunction!(validators::_raise_for_status, module)?)?;
    module.add_function(wrap_pyfunction!(validators::_seed_error_display, module)?)?;
    module.add_function(wrap_pyfunction!(info::native_info, module)?)?;
    module.add_function(wrap_pyfunction!(info::json_schema_to_grammar, module)?)?;
    module.add_function(wrap_pyfunction!(threads::default_threads, module)?)?;
    module.add_function(wrap_pyfunction!(threads::machine_cpus, module)?)?;
    module.add_function(wrap_pyfunction!(threads::threads_for, module)?)?;
    module.add_function(wrap_pyfunction!(threads::threads_now, module)?)?;
    Ok(())
}
