//! A generator's target: a context of its own, or a sequence of a
//! [`SharedEngine`] whose rounds are decoded with other generators'.

use std::sync::Arc;

use super::shared_engine::{Attached, SharedEngine};
use crate::native::{Context, Model, NativeResult};
use crate::{Error, Result};

/// Where a generator's target memory is.
pub(crate) enum Target {
    /// A context of its own (sequence 0).
    Own(Context),
    /// A sequence of a shared engine (modes `none` and `ngram`).
    Shared(Attached),
    /// A sequence given back to its engine ([`Target::release`]): the
    /// generation's record stays, its memory is gone.
    Released(Released),
}

/// What a released target still answers.
pub(crate) struct Released {
    model: Arc<Model>,
    n_threads: i32,
    n_ctx: u32,
}

/// The refusal of a released target's memory.
pub(crate) fn released_error() -> Error {
    Error::Usage(
        "this generation gave its sequence back to the shared engine; restore its checkpoint to go on".into(),
    )
}

impl Target {
    /// The target model.
    pub fn model(&self) -> &Arc<Model> {
        match self {
            Self::Own(context) => context.model(),
            Self::Shared(attached) => attached.engine().model(),
            Self::Released(released) => &released.model,
        }
    }

    /// The threads decodes run with.
    pub fn n_threads(&self) -> i32 {
        match self {
            Self::Own(context) => context.n_threads(),
            Self::Shared(attached) => attached.engine().n_threads(),
            Self::Released(released) => released.n_threads,
        }
    }

    /// The sequence's context length.
    pub fn n_ctx(&self) -> u32 {
        match self {
            Self::Own(context) => context.n_ctx(),
            Self::Shared(attached) => attached.engine().config().n_ctx,
            Self::Released(released) => released.n_ctx,
        }
    }

    /// The context of its own, if it has one (draft parts are built over it).
    pub fn own(&mut self) -> Option<&mut Context> {
        match self {
            Self::Own(context) => Some(context),
            Self::Shared(_) | Self::Released(_) => None,
        }
    }

    /// The engine it shares, if attached.
    pub fn engine(&self) -> Option<&Arc<SharedEngine>> {
        match self {
            Self::Own(_) | Self::Released(_) => None,
            Self::Shared(attached) => Some(attached.engine()),
        }
    }

    /// The sequence's state, laid out as a context of its own holds it.
    pub fn state(&mut self) -> Result<Vec<u8>> {
        match self {
            Self::Own(context) => Ok(context.seq_state(0)?),
            Self::Shared(attached) => attached.state(),
            Self::Released(_) => Err(released_error()),
        }
    }

    /// Replace the sequence's state (laid out as a context of its own holds it).
    pub fn set_state(&mut self, state: &[u8]) -> Result<()> {
        match self {
            Self::Own(context) => Ok(context.set_seq_state(0, state)?),
            Self::Shared(attached) => attached.set_state(state),
            Self::Released(_) => Err(released_error()),
        }
    }

    /// Empty the memory (a context of its own entirely; a shared sequence its cells).
    pub fn clear(&mut self) {
        match self {
            Self::Own(context) => context.clear(),
            Self::Shared(attached) => attached.clear(),
            Self::Released(_) => {}
        }
    }

    /// The lowest and highest positions of the sequence (`-1` when empty).
    pub fn positions(&self) -> NativeResult<(i32, i32)> {
        match self {
            Self::Own(context) => context.seq_positions(0),
            Self::Shared(attached) => attached.positions(),
            Self::Released(_) => Ok((-1, -1)),
        }
    }

    /// Give a shared sequence back to its engine (its place free for another
    /// generator; its cells kept, under a reuse key, for a later prompt if
    /// `keep` holds their tokens and that key and they are exact, else
    /// freed); nothing for any other target.
    pub fn release(&mut self, keep: Option<(&[i32], &Arc<str>)>) {
        if let Self::Shared(attached) = self {
            if let Some((tokens, key)) = keep {
                attached.keep_when_dropped(tokens, key);
            }
            let engine = attached.engine();
            let released = Released {
                model: Arc::clone(engine.model()),
                n_threads: engine.n_threads(),
                n_ctx: engine.config().n_ctx,
            };
            *self = Self::Released(released);
        }
    }
}
