//! A generator's target: a context of its own, or a sequence of a
//! [`SharedEngine`] whose rounds are decoded with other generators'.

use std::sync::Arc;

use super::shared::{Attached, SharedEngine};
use crate::native::{Context, Model, NativeResult};
use crate::Result;

/// Where a generator's target memory is.
pub(crate) enum Target {
    /// A context of its own (sequence 0).
    Own(Context),
    /// A sequence of a shared engine (modes `none` and `ngram`).
    Shared(Attached),
}

impl Target {
    /// The target model.
    pub fn model(&self) -> &Arc<Model> {
        match self {
            Self::Own(context) => context.model(),
            Self::Shared(attached) => attached.engine().model(),
        }
    }

    /// The threads decodes run with.
    pub fn n_threads(&self) -> i32 {
        match self {
            Self::Own(context) => context.n_threads(),
            Self::Shared(attached) => attached.engine().n_threads(),
        }
    }

    /// The sequence's context length.
    pub fn n_ctx(&self) -> u32 {
        match self {
            Self::Own(context) => context.n_ctx(),
            Self::Shared(attached) => attached.engine().config().n_ctx,
        }
    }

    /// The context of its own, if it has one (draft parts are built over it).
    pub fn own(&mut self) -> Option<&mut Context> {
        match self {
            Self::Own(context) => Some(context),
            Self::Shared(_) => None,
        }
    }

    /// The engine it shares, if attached.
    pub fn engine(&self) -> Option<&Arc<SharedEngine>> {
        match self {
            Self::Own(_) => None,
            Self::Shared(attached) => Some(attached.engine()),
        }
    }

    /// The sequence's state, laid out as a context of its own holds it.
    pub fn state(&mut self) -> Result<Vec<u8>> {
        match self {
            Self::Own(context) => Ok(context.seq_state(0)?),
            Self::Shared(attached) => attached.state(),
        }
    }

    /// Replace the sequence's state (laid out as a context of its own holds it).
    pub fn set_state(&mut self, state: &[u8]) -> Result<()> {
        match self {
            Self::Own(context) => Ok(context.set_seq_state(0, state)?),
            Self::Shared(attached) => attached.set_state(state),
        }
    }

    /// Empty the memory (a context of its own entirely; a shared sequence its cells).
    pub fn clear(&mut self) {
        match self {
            Self::Own(context) => context.clear(),
            Self::Shared(attached) => attached.clear(),
        }
    }

    /// The lowest and highest positions of the sequence (`-1` when empty).
    pub fn positions(&self) -> NativeResult<(i32, i32)> {
        match self {
            Self::Own(context) => context.seq_positions(0),
            Self::Shared(attached) => attached.positions(),
        }
    }
}
