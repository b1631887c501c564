//! Shared exact-state contracts for speculative draft sessions.
//!
//! A leaf but for the message tables (`crate::messages`): the capture and
//! restore protocol runs over [`SessionState`], the shim's three state calls,
//! which `native::SessionHandle` implements, so this contract imports nothing
//! of the native layer.

/// Maximum speculative continuation bytes copied through the safe API.
pub const MAX_SPECULATIVE_STATE_BYTES: usize = 64 * 1024 * 1024;
/// Maximum concurrent sequence slots allocated by one speculative session.
pub const MAX_SPECULATIVE_SEQUENCES: u32 = 4_096;
/// Maximum tokens requested from one speculative draft boundary.
pub const MAX_SPECULATIVE_DRAFT_TOKENS: i32 = 4_096;
/// Maximum prompt tokens copied into one speculative session.
pub const MAX_SPECULATIVE_PROMPT_TOKENS: usize = 1_048_576;

/// Failure while capturing or restoring versioned speculative state.
///
/// Each variant's message is written once, in [`SpeculativeStateError::MESSAGES`]:
/// `Display` fills it in here, and the Python exceptions of `specstate.errors`
/// read the same templates from `specstate._native`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpeculativeStateError {
    /// A required native session or output pointer was null.
    Null,
    /// The sequence id is outside the configured session range.
    BadSequence,
    /// A draft proposal has not yet been completed with `accept`.
    NotQuiescent,
    /// Native state changed size between the size and copy calls.
    SizeChanged {
        /// Size returned by the initial query.
        expected: usize,
        /// Size required or written by the copy call.
        actual: usize,
    },
    /// Native reported that the supplied buffer was too small without a size.
    BufferTooSmall,
    /// The active native implementation did not expose complete state.
    Unavailable,
    /// The supplied state failed its exact version/configuration checks.
    Invalid,
    /// Native state size arithmetic overflowed.
    Overflow,
    /// A C++ exception was contained by the speculative-state shim.
    Exception,
    /// State exceeded the safe allocation/input bound.
    Excessive {
        /// Requested or supplied byte count.
        size: usize,
        /// Inclusive safe bound.
        maximum: usize,
    },
    /// Native returned a status unknown to this binding revision.
    Unknown(u32),
}

impl SpeculativeStateError {
    /// Each variant's message by variant name, the one place it is written:
    /// `{name}` stands for the variant's field `name` (`{status}` for
    /// `Unknown`'s), as in Python's `str.format`.
    pub const MESSAGES: [(&'static str, &'static str); 11] = [
        (
            "Null",
            "speculative state operation received a null native value",
        ),
        (
            "BadSequence",
            "speculative state sequence id is outside the configured range",
        ),
        (
            "NotQuiescent",
            "speculative state is available only at a quiescent boundary",
        ),
        (
            "SizeChanged",
            "speculative state size changed from {expected} to {actual} bytes",
        ),
        (
            "BufferTooSmall",
            "the speculative state buffer was too small",
        ),
        (
            "Unavailable",
            "the active speculative implementation did not expose complete state",
        ),
        ("Invalid", "speculative state is invalid for this session"),
        ("Overflow", "speculative state size overflowed"),
        (
            "Exception",
            "the native speculative-state operation raised an exception",
        ),
        (
            "Excessive",
            "speculative state is {size} bytes, exceeding the {maximum}-byte bound",
        ),
        ("Unknown", "unknown speculative state status {status}"),
    ];

    /// The variant's name, as in [`SpeculativeStateError::MESSAGES`].
    pub fn variant(&self) -> &'static str {
        match self {
            Self::Null => "Null",
            Self::BadSequence => "BadSequence",
            Self::NotQuiescent => "NotQuiescent",
            Self::SizeChanged { .. } => "SizeChanged",
            Self::BufferTooSmall => "BufferTooSmall",
            Self::Unavailable => "Unavailable",
            Self::Invalid => "Invalid",
            Self::Overflow => "Overflow",
            Self::Exception => "Exception",
            Self::Excessive { .. } => "Excessive",
            Self::Unknown(_) => "Unknown",
        }
    }

    /// The variant's message template.
    pub fn template(&self) -> &'static str {
        crate::messages::template(&Self::MESSAGES, self.variant())
    }

    /// The variant's fields by name, as its template names them.
    fn fields(&self) -> Vec<(&'static str, u64)> {
        match *self {
            Self::SizeChanged { expected, actual } => {
                vec![("expected", expected as u64), ("actual", actual as u64)]
            }
            Self::Excessive { size, maximum } => {
                vec![("size", size as u64), ("maximum", maximum as u64)]
            }
            Self::Unknown(status) => vec![("status", u64::from(status))],
            _ => Vec::new(),
        }
    }
}

impl std::fmt::Display for SpeculativeStateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields = self.fields();
        let values: Vec<(&str, &dyn std::fmt::Display)> = fields
            .iter()
            .map(|(name, value)| (*name, value as &dyn std::fmt::Display))
            .collect();
        f.write_str(&crate::messages::fill(self.template(), &values))
    }
}

impl std::error::Error for SpeculativeStateError {}

/// The shim's state calls on one live session, as the protocol below makes
/// them (`mtp_session_state_size`, `_get` and `_set`; `native::SessionHandle`
/// implements them over its own session).
pub trait SessionState {
    /// `mtp_session_state_size`: the status, and the bytes of `seq_id`'s state.
    fn state_size(&self, seq_id: i32) -> (llama_cpp_sys_4::mtp_state_status, usize);

    /// `mtp_session_state_get` into `out`: the status, and the bytes written
    /// (on `MTP_STATE_STATUS_BUFFER_SMALL`: the bytes needed).
    fn state_get(&self, seq_id: i32, out: &mut [u8]) -> (llama_cpp_sys_4::mtp_state_status, usize);

    /// `mtp_session_state_set`: restore `seq_id`'s state from `state`.
    fn state_set(&mut self, seq_id: i32, state: &[u8]) -> llama_cpp_sys_4::mtp_state_status;
}

pub(crate) fn capture_state(
    session: &impl SessionState,
    seq_id: i32,
) -> Result<Vec<u8>, SpeculativeStateError> {
    let (status, size) = session.state_size(seq_id);
    status_result(status)?;
    validate_size(size)?;

    let mut state = vec![0_u8; size];
    let (status, written) = session.state_get(seq_id, &mut state);
    if status == llama_cpp_sys_4::MTP_STATE_STATUS_BUFFER_SMALL {
        return Err(SpeculativeStateError::SizeChanged {
            expected: size,
            actual: written,
        });
    }
    status_result(status)?;
    if written != size {
        return Err(SpeculativeStateError::SizeChanged {
            expected: size,
            actual: written,
        });
    }
    Ok(state)
}

pub(crate) fn restore_state(
    session: &mut impl SessionState,
    seq_id: i32,
    state: &[u8],
) -> Result<(), SpeculativeStateError> {
    validate_size(state.len())?;
    if state.is_empty() {
        return Err(SpeculativeStateError::Invalid);
    }
    status_result(session.state_set(seq_id, state))
}

pub(crate) fn validate_size(size: usize) -> Result<(), SpeculativeStateError> {
    if size > MAX_SPECULATIVE_STATE_BYTES {
        return Err(SpeculativeStateError::Excessive {
            size,
            maximum: MAX_SPECULATIVE_STATE_BYTES,
        });
    }
    Ok(())
}

pub(crate) fn status_result(
    status: llama_cpp_sys_4::mtp_state_status,
) -> Result<(), SpeculativeStateError> {
    match status {
        llama_cpp_sys_4::MTP_STATE_STATUS_OK => Ok(()),
        llama_cpp_sys_4::MTP_STATE_STATUS_NULL => Err(SpeculativeStateError::Null),
        llama_cpp_sys_4::MTP_STATE_STATUS_BAD_SEQUENCE => Err(SpeculativeStateError::BadSequence),
        llama_cpp_sys_4::MTP_STATE_STATUS_NOT_QUIESCENT => Err(SpeculativeStateError::NotQuiescent),
        llama_cpp_sys_4::MTP_STATE_STATUS_BUFFER_SMALL => {
            Err(SpeculativeStateError::BufferTooSmall)
        }
        llama_cpp_sys_4::MTP_STATE_STATUS_UNAVAILABLE => Err(SpeculativeStateError::Unavailable),
        llama_cpp_sys_4::MTP_STATE_STATUS_INVALID => Err(SpeculativeStateError::Invalid),
        llama_cpp_sys_4::MTP_STATE_STATUS_OVERFLOW => Err(SpeculativeStateError::Overflow),
        llama_cpp_sys_4::MTP_STATE_STATUS_EXCEPTION => Err(SpeculativeStateError::Exception),
        // `mtp_state_status` is `u32` on Unix but `i32` on MSVC; `as _` coerces
        // the unknown value to the `u32` error field on every target.
        unknown => Err(SpeculativeStateError::Unknown(unknown as _)),
    }
}

pub(crate) fn validate_config(
    n_seq: u32,
    n_draft_max: i32,
    n_min: i32,
    p_min: f32,
) -> Result<(), &'static str> {
    if n_seq == 0 || n_seq > MAX_SPECULATIVE_SEQUENCES {
        return Err("n_seq is outside the supported bound");
    }
    if !(1..=MAX_SPECULATIVE_DRAFT_TOKENS).contains(&n_draft_max) {
        return Err("n_draft_max is outside the supported bound");
    }
    if n_min < 0 || n_min > n_draft_max {
        return Err("n_min must be between zero and n_draft_max");
    }
    if !p_min.is_finite() || !(0.0..=1.0).contains(&p_min) {
        return Err("p_min must be finite and between zero and one");
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SpeculativeContextCapacity {
    pub(crate) batch: u32,
    pub(crate) micro_batch: u32,
    pub(crate) recurrent_slots: u32,
    pub(crate) recurrent_or_hybrid: bool,
}

pub(crate) fn validate_context_capacities(
    target: SpeculativeContextCapacity,
    draft: SpeculativeContextCapacity,
    maximum_draft_tokens: u32,
) -> Result<(), &'static str> {
    let required_rows = maximum_draft_tokens
        .checked_add(1)
        .ok_or("n_draft_max plus one exceeds u32")?;
    if target.batch < required_rows || draft.batch < required_rows {
        return Err("target or draft batch capacity is smaller than n_draft_max plus one");
    }
    if (target.recurrent_or_hybrid && target.micro_batch < required_rows)
        || (draft.recurrent_or_hybrid && draft.micro_batch < required_rows)
    {
        return Err("recurrent micro-batch capacity is smaller than n_draft_max plus one");
    }
    if (target.recurrent_or_hybrid && target.recurrent_slots < maximum_draft_tokens)
        || (draft.recurrent_or_hybrid && draft.recurrent_slots < maximum_draft_tokens)
    {
        return Err("recurrent context capacity is smaller than n_draft_max");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_state_is_bounded_before_native_access() {
        assert!(validate_size(MAX_SPECULATIVE_STATE_BYTES).is_ok());
        assert_eq!(
            validate_size(MAX_SPECULATIVE_STATE_BYTES + 1),
            Err(SpeculativeStateError::Excessive {
                size: MAX_SPECULATIVE_STATE_BYTES + 1,
                maximum: MAX_SPECULATIVE_STATE_BYTES,
            })
        );
    }

    #[test]
    fn speculative_configuration_is_bounded_before_allocation() {
        assert!(validate_config(1, 4, 0, 0.0).is_ok());
        assert!(validate_config(0, 4, 0, 0.0).is_err());
        assert!(validate_config(MAX_SPECULATIVE_SEQUENCES + 1, 4, 0, 0.0).is_err());
        assert!(validate_config(1, MAX_SPECULATIVE_DRAFT_TOKENS + 1, 0, 0.0).is_err());
        assert!(validate_config(1, 4, 5, 0.0).is_err());
        assert!(validate_config(1, 4, 0, f32::NAN).is_err());
        assert!(validate_config(1, 4, 0, 1.1).is_err());
    }

    #[test]
    fn prompt_and_state_bounds_are_consistent() {
        let maximum_prompt_bytes = MAX_SPECULATIVE_PROMPT_TOKENS
            .checked_mul(std::mem::size_of::<i32>())
            .unwrap();
        assert!(maximum_prompt_bytes < MAX_SPECULATIVE_STATE_BYTES);
    }

    /// A transformer context that holds a 3-token draft, and a recurrent one.
    const TRANSFORMER: SpeculativeContextCapacity = SpeculativeContextCapacity {
        batch: 4,
        micro_batch: 1,
        recurrent_slots: 0,
        recurrent_or_hybrid: false,
    };
    const RECURRENT: SpeculativeContextCapacity = SpeculativeContextCapacity {
        batch: 4,
        micro_batch: 4,
        recurrent_slots: 3,
        recurrent_or_hybrid: true,
    };

    #[test]
    fn speculative_decode_capacity_is_checked_before_native_allocation() {
        let (transformer, recurrent) = (TRANSFORMER, RECURRENT);
        let with = |base: SpeculativeContextCapacity,
                    change: fn(&mut SpeculativeContextCapacity)| {
            let mut changed = base;
            change(&mut changed);
            changed
        };
        // (target, draft, maximum draft tokens, accepted)
        let cases = [
            (transformer, transformer, 3, true),
            (with(transformer, |c| c.batch = 3), transformer, 3, false),
            (recurrent, recurrent, 3, true),
            (with(recurrent, |c| c.micro_batch = 3), recurrent, 3, false),
            (
                with(recurrent, |c| c.recurrent_slots = 2),
                recurrent,
                3,
                false,
            ),
            (transformer, transformer, u32::MAX, false),
        ];
        for (target, draft, maximum, accepted) in cases {
            let result = validate_context_capacities(target, draft, maximum);
            assert_eq!(result.is_ok(), accepted, "{target:?} {draft:?} {maximum}");
        }
    }

    #[test]
    fn config_checks_run_in_the_seed_order() {
        assert_eq!(
            validate_config(0, 0, -1, f32::NAN),
            Err("n_seq is outside the supported bound")
        );
        assert_eq!(
            validate_config(1, 0, -1, f32::NAN),
            Err("n_draft_max is outside the supported bound")
        );
        assert_eq!(
            validate_config(1, 1, -1, f32::NAN),
            Err("n_min must be between zero and n_draft_max")
        );
        assert_eq!(
            validate_config(1, 1, 1, f32::NAN),
            Err("p_min must be finite and between zero and one")
        );
        assert_eq!(validate_config(1, 1, 1, 1.0), Ok(()));
    }

    #[test]
    fn config_bounds_are_inclusive() {
        assert!(validate_config(
            MAX_SPECULATIVE_SEQUENCES,
            MAX_SPECULATIVE_DRAFT_TOKENS,
            0,
            0.0
        )
        .is_ok());
        assert!(validate_config(
            1,
            MAX_SPECULATIVE_DRAFT_TOKENS,
            MAX_SPECULATIVE_DRAFT_TOKENS,
            1.0
        )
        .is_ok());
        assert!(validate_config(1, i32::MIN, 0, 0.0).is_err());
        assert!(validate_config(1, i32::MAX, 0, 0.0).is_err());
        assert!(validate_config(u32::MAX, 1, 0, 0.0).is_err());
        assert!(validate_config(1, 1, 0, -0.0).is_ok());
        assert!(validate_config(1, 1, 0, f32::INFINITY).is_err());
        assert!(validate_config(1, 1, 0, f32::NEG_INFINITY).is_err());
        assert!(validate_config(1, 1, 0, -f32::MIN_POSITIVE).is_err());
        assert!(validate_config(1, 1, 0, 1.0 + f32::EPSILON).is_err());
    }

    #[test]
    fn capacity_messages_name_the_failing_rule() {
        let (transformer, recurrent) = (TRANSFORMER, RECURRENT);
        assert_eq!(
            validate_context_capacities(transformer, transformer, u32::MAX),
            Err("n_draft_max plus one exceeds u32")
        );
        assert_eq!(
            validate_context_capacities(
                transformer,
                SpeculativeContextCapacity {
                    batch: 3,
                    ..transformer
                },
                3
            ),
            Err("target or draft batch capacity is smaller than n_draft_max plus one")
        );
        assert_eq!(
            validate_context_capacities(
                transformer,
                SpeculativeContextCapacity {
                    micro_batch: 3,
                    ..recurrent
                },
                3
            ),
            Err("recurrent micro-batch capacity is smaller than n_draft_max plus one")
        );
        assert_eq!(
            validate_context_capacities(
                SpeculativeContextCapacity {
                    recurrent_slots: 2,
                    ..recurrent
                },
                transformer,
                3
            ),
            Err("recurrent context capacity is smaller than n_draft_max")
        );
        // A transformer context ignores micro-batch and recurrent slots.
        assert_eq!(
            validate_context_capacities(transformer, transformer, 0),
            Ok(())
        );
        assert_eq!(
            validate_context_capacities(
                SpeculativeContextCapacity {
                    batch: u32::MAX,
                    ..transformer
                },
                SpeculativeContextCapacity {
                    batch: u32::MAX,
                    ..transformer
                },
                u32::MAX - 1,
            ),
            Ok(())
        );
    }

    #[test]
    fn every_native_status_maps_to_its_variant() {
        use llama_cpp_sys_4 as sys;
        assert_eq!(status_result(sys::MTP_STATE_STATUS_OK), Ok(()));
        let expected = [
            (sys::MTP_STATE_STATUS_NULL, SpeculativeStateError::Null),
            (
                sys::MTP_STATE_STATUS_BAD_SEQUENCE,
                SpeculativeStateError::BadSequence,
            ),
            (
                sys::MTP_STATE_STATUS_NOT_QUIESCENT,
                SpeculativeStateError::NotQuiescent,
            ),
            (
                sys::MTP_STATE_STATUS_BUFFER_SMALL,
                SpeculativeStateError::BufferTooSmall,
            ),
            (
                sys::MTP_STATE_STATUS_UNAVAILABLE,
                SpeculativeStateError::Unavailable,
            ),
            (
                sys::MTP_STATE_STATUS_INVALID,
                SpeculativeStateError::Invalid,
            ),
            (
                sys::MTP_STATE_STATUS_OVERFLOW,
                SpeculativeStateError::Overflow,
            ),
            (
                sys::MTP_STATE_STATUS_EXCEPTION,
                SpeculativeStateError::Exception,
            ),
            (9, SpeculativeStateError::Unknown(9)),
        ];
        for (status, error) in expected {
            assert_eq!(status_result(status), Err(error));
        }
    }

    #[test]
    fn error_texts_are_the_seed_display_texts() {
        assert_eq!(
            SpeculativeStateError::SizeChanged {
                expected: 3,
                actual: 5
            }
            .to_string(),
            "speculative state size changed from 3 to 5 bytes"
        );
        assert_eq!(
            SpeculativeStateError::Excessive {
                size: 7,
                maximum: 6
            }
            .to_string(),
            "speculative state is 7 bytes, exceeding the 6-byte bound"
        );
        assert_eq!(
            SpeculativeStateError::Unknown(u32::MAX).to_string(),
            "unknown speculative state status 4294967295"
        );
        assert_eq!(
            SpeculativeStateError::NotQuiescent.to_string(),
            "speculative state is available only at a quiescent boundary"
        );
    }

    #[test]
    fn every_variant_has_one_message_and_fills_every_placeholder() {
        use SpeculativeStateError as E;
        let all = [
            E::Null,
            E::BadSequence,
            E::NotQuiescent,
            E::SizeChanged {
                expected: 1,
                actual: 2,
            },
            E::BufferTooSmall,
            E::Unavailable,
            E::Invalid,
            E::Overflow,
            E::Exception,
            E::Excessive {
                size: 3,
                maximum: 4,
            },
            E::Unknown(5),
        ];
        let names: Vec<&str> = E::MESSAGES.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, all.iter().map(E::variant).collect::<Vec<_>>());
        for error in all {
            let text = error.to_string();
            assert!(!text.is_empty() && !text.contains('{'), "{text}");
        }
    }

    #[test]
    fn size_bound_accepts_zero_and_rejects_usize_max() {
        assert_eq!(validate_size(0), Ok(()));
        assert_eq!(
            validate_size(usize::MAX),
            Err(SpeculativeStateError::Excessive {
                size: usize::MAX,
                maximum: MAX_SPECULATIVE_STATE_BYTES,
            })
        );
    }
}
