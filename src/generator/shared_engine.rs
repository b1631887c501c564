//! A target context shared by generators used from several threads: each
//! `Generator` attached to a [`SharedEngine`] runs its rounds as before
//! (`take`, on its own thread), and the rounds of every attached generator
//! that asks for one at about the same time are decoded together.
//!
//! A round submits its plan's rows and waits. The rows of all waiting rounds
//! are decoded in one decode (at most [`crate::limits::MAX_EXACT_ROWS`] rows;
//! more wait for the next) as soon as every generator that ran a round
//! lately has submitted, or [`GATHER_WINDOW`] after the first submission,
//! whichever comes first. Whoever finds the rows ready decodes them; then
//! each round judges its own rows (the next decode waits for all of them).
//! What a round plans, decodes and judges is what it would alone (see
//! [`crate::batch_engine`]), so an attached generator's text is its text alone.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::multi_sequence::{
    decode_groups, history_engine, place_state, push_rows, undo_failed_decode, EngineShape,
};
use super::Member;
use crate::engine::{Plan, Round};
use crate::limits::MAX_EXACT_ROWS;
use crate::native::{restream_seq_state, Batch, Context, Model};
use crate::settings::RuntimeOptions;
use crate::{Error, Result};

/// How long the first round submitted for a decode waits for the others.
pub const GATHER_WINDOW: Duration = Duration::from_millis(2);
/// A generator whose last round ended this recently is waited for (within the window).
const RECENT: Duration = Duration::from_millis(50);
/// The longest reuse key a generation may have (bytes): a server's tenant
/// is a digest, far shorter.
pub const MAX_REUSE_KEY_BYTES: usize = 1024;

/// Counters of the shared decodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Decodes that held rounds' rows.
    pub decodes: u64,
    /// Rounds' rows those decodes held.
    pub rows: u64,
    /// Rounds those decodes held (a sequence per round).
    pub sequences: u64,
    /// Prompt tokens not decoded: kept from an earlier generation's exact cells.
    pub reused: u64,
    /// Microseconds every shared decode took (prompt chunks' included).
    pub micros: u64,
}

/// The cells a free sequence still holds: an earlier generation's tokens,
/// exact (decoded in chunks of at most [`MAX_EXACT_ROWS`] rows), kept for a
/// prompt of the same reuse key that starts the same way.
#[derive(Clone, Debug, Default)]
struct Kept {
    tokens: Vec<i32>,
    /// The reuse key they were kept under (None: nothing ever kept; with
    /// no tokens, it matters to no prompt).
    key: Option<Arc<str>>,
    /// When it was given back (the engine's count of releases): the free
    /// sequence given back longest ago is taken first.
    released: u64,
}

/// A given-back sequence's exact cells, kept in memory after its place is
/// taken: its tokens, its state in a lone context's layout, and the reuse
/// key they were kept under.
struct Saved {
    tokens: Vec<i32>,
    state: Vec<u8>,
    key: Arc<str>,
}

/// Rows of a sequence waiting for a decode.
struct Submission {
    seq: i32,
    rows: Rows,
}

/// What the rows are.
enum Rows {
    /// A round's plan: its last token and draft, every row an output.
    Round(Plan),
    /// A chunk of a prompt at positions `start..`: only the last row is an output.
    Prompt { tokens: Vec<i32>, start: usize },
}

impl Rows {
    fn len(&self) -> usize {
        match self {
            Self::Round(plan) => plan.draft.tokens.len() + 1,
            Self::Prompt { tokens, .. } => tokens.len(),
        }
    }

    fn push_into(&self, step: &mut Batch, seq: i32) -> Result<()> {
        match self {
            Self::Round(plan) => push_rows(step, seq, plan),
            Self::Prompt { tokens, start } => {
                let start = crate::engine::position(*start)?;
                for (offset, &token) in tokens.iter().enumerate() {
                    let last = offset + 1 == tokens.len();
                    step.push(token, start + offset as i32, seq, last)?;
                }
                Ok(())
            }
        }
    }
}

/// The decode whose output rows the rounds in it may read now.
struct Published {
    /// Each submission's sequence and first row (its index in the decode's
    /// batch, which is what llama.cpp's logits are asked by), until read.
    rows: Vec<(i32, i32)>,
    micros: u64,
    failed: Option<String>,
}

/// Everything behind the engine's lock.
pub(crate) struct Shared {
    pub(crate) target: Context,
    step: Batch,
    taken: Vec<bool>,
    pending: Vec<Submission>,
    window_end: Option<Instant>,
    published: Option<Published>,
    last_round: Vec<Option<Instant>>,
    kept: Vec<Kept>,
    /// States of sequences given back, newest last, up to `saved_limit` bytes.
    saved: std::collections::VecDeque<Saved>,
    saved_limit: usize,
    releases: u64,
    /// The engine is being dropped: the decoder thread ends.
    stopping: bool,
    stats: SharedStats,
}

/// The lock, and a signal for each side: the decoder waits on `work` (rows
/// submitted, a decode's rows all read, the engine dropped), the generators'
/// threads on `rounds` (a decode done, a decode's rows all read). A submission
/// wakes the decoder only: a generator's thread woken while a decode's threads
/// hold the CPUs waits for a CPU, and once it gets one it holds a decode
/// thread up (docs/measured.md, "Shared engine").
struct Core {
    shared: Mutex<Shared>,
    work: Condvar,
    rounds: Condvar,
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait on `signal` until notified or `until`.
    fn wait<'a>(
        &self,
        signal: &Condvar,
        guard: MutexGuard<'a, Shared>,
        until: Option<Instant>,
    ) -> MutexGuard<'a, Shared> {
        let timeout = until.map(|end| end.saturating_duration_since(Instant::now()));
        match timeout {
            Some(timeout) => {
                signal
                    .wait_timeout(guard, timeout)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => signal.wait(guard).unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// `seq` has read its rows of the published decode: once all are read,
    /// the decoder and whoever waits for an idle engine may go on.
    fn read(&self, shared: &mut Shared, seq: i32) {
        shared.read(seq);
        if shared.published.is_none() {
            self.work.notify_one();
            self.rounds.notify_all();
        }
    }

    /// The decoder's loop: decode the pending rows whenever they are ready,
    /// until the engine is dropped. Every shared decode runs on this one
    /// thread: rounds only plan, submit, wait and judge, so a decode's threads
    /// are never a round's thread that other work descheduled (docs/measured.md,
    /// "Shared engine").
    fn decode_until_stopped(&self) {
        let mut shared = self.lock();
        while !shared.stopping {
            if shared.ready(Instant::now()) {
                shared.decode_next();
                self.rounds.notify_all();
                continue;
            }
            let until = shared.window_end.filter(|_| shared.published.is_none());
            shared = self.wait(&self.work, shared, until);
        }
    }
}

/// A target context of `n_seq` sequences shared by attached generators.
pub struct SharedEngine {
    model: Arc<Model>,
    config: EngineShape,
    core: Arc<Core>,
    decoder: Option<std::thread::JoinHandle<()>>,
}

impl SharedEngine {
    /// An engine of `config.n_seq` sequences of `config.n_ctx` tokens over `model`.
    pub fn new(
        model: Arc<Model>,
        config: EngineShape,
        runtime: RuntimeOptions,
    ) -> Result<Arc<Self>> {
        let (target, config) = super::multi_sequence::batch_target(&model, config, runtime)?;
        let n_seq = config.n_seq as usize;
        let shared = Shared {
            target,
            step: Batch::new(MAX_EXACT_ROWS.max(config.n_batch as usize))?,
            taken: vec![false; n_seq],
            pending: Vec::new(),
            window_end: None,
            published: None,
            last_round: vec![None; n_seq],
            kept: vec![Kept::default(); n_seq],
            saved: std::collections::VecDeque::new(),
            saved_limit: 0,
            releases: 0,
            stopping: false,
            stats: SharedStats::default(),
        };
        let core = Arc::new(Core {
            shared: Mutex::new(shared),
            work: Condvar::new(),
            rounds: Condvar::new(),
        });
        let decoding = Arc::clone(&core);
        let decoder = std::thread::Builder::new()
            .name("specstate-decoder".into())
            .spawn(move || decoding.decode_until_stopped())
            .map_err(|error| {
                Error::Usage(format!("cannot start the engine's decoder thread: {error}"))
            })?;
        Ok(Arc::new(Self {
            model,
            config,
            core,
            decoder: Some(decoder),
        }))
    }

    /// The engine's shape (`n_ctx` resolved).
    pub fn config(&self) -> EngineShape {
        self.config
    }

    /// The target model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The threads the target decodes with.
    pub fn n_threads(&self) -> i32 {
        self.lock().target.n_threads()
    }

    /// Keep the states of given-back sequences in memory, up to `bytes` in
    /// all (0: none; the least recently used go first), so that a prompt
    /// that starts like one of them decodes only the rest even after its
    /// sequence was taken by another generation.
    pub fn set_prompt_cache_bytes(&self, bytes: usize) {
        let mut shared = self.lock();
        shared.saved_limit = bytes;
        shared.evict_saved();
    }

    /// The counters so far.
    pub fn stats(&self) -> SharedStats {
        self.lock().stats
    }

    /// Sequences attached.
    pub fn attached(&self) -> usize {
        self.lock().taken.iter().filter(|taken| **taken).count()
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.core.lock()
    }

    /// Wait, on a generator's thread, for the decoder or another reader.
    fn wait<'a>(&self, guard: MutexGuard<'a, Shared>) -> MutexGuard<'a, Shared> {
        self.core.wait(&self.core.rounds, guard, None)
    }

    /// The lock, once no decode's rows wait to be read (so that a prompt's
    /// decode or a state change cannot overwrite them).
    pub(crate) fn idle(&self) -> MutexGuard<'_, Shared> {
        let mut shared = self.lock();
        while shared.published.is_some() {
            shared = self.wait(shared);
        }
        shared
    }

    /// A free sequence for a generator, holding `state` (a lone context's
    /// layout) if given. Without a state, the sequence given back longest ago
    /// is taken, its kept cells left for [`Attached::reuse`] (any other use
    /// empties it first: [`Attached::settle`]).
    pub(crate) fn attach(self: &Arc<Self>, state: Option<&[u8]>) -> Result<Attached> {
        let mut shared = self.idle();
        let seq = (0..shared.taken.len())
            .filter(|&seq| !shared.taken[seq])
            .min_by_key(|&seq| shared.kept[seq].released)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "the engine's {} sequences are all attached",
                    shared.taken.len()
                ))
            })?;
        let seq_id = crate::engine::position(seq)?;
        if state.is_some() {
            shared.kept[seq].tokens.clear();
            place_state(&mut shared.target, self.config.n_seq, seq_id, state)?;
        }
        shared.taken[seq] = true;
        shared.last_round[seq] = None;
        Ok(Attached {
            engine: Arc::clone(self),
            seq: seq_id,
            exact: state.is_none(),
            keep: None,
        })
    }

    /// One round of `member` on sequence `seq`, decoded with the other
    /// attached generators' rounds submitted about now.
    pub(crate) fn round(
        &self,
        seq: i32,
        member: &mut Member,
        batch: &mut Batch,
        max_commit: usize,
    ) -> Result<Round> {
        let mut shared = self.lock();
        let plan = history_engine(&mut shared.target, member, batch, seq, |engine, at| {
            engine.plan_round(&at, max_commit)
        })?;
        let Some(plan) = plan else {
            return Ok(Round::default());
        };
        let (mut shared, (first_row, micros, failed)) =
            self.decoded(shared, seq, Rows::Round(plan.clone()));
        let outcome = match failed {
            None => history_engine(&mut shared.target, member, batch, seq, |engine, at| {
                engine.finish_round(&at, plan, first_row, micros)
            }),
            Some(message) => Err(undo_failed_decode(
                &mut shared.target,
                seq,
                plan.n_past,
                &message,
            )),
        };
        self.core.read(&mut shared, seq);
        outcome
    }

    /// Submit `rows` of sequence `seq` to the decoder and wait until they are
    /// decoded: the lock, held while they are published, and their first
    /// row, the decode's time and its failure ([`Shared::published_for`]).
    fn decoded<'a>(
        &self,
        mut shared: MutexGuard<'a, Shared>,
        seq: i32,
        rows: Rows,
    ) -> (MutexGuard<'a, Shared>, (i32, u64, Option<String>)) {
        shared.submit(seq, rows);
        self.core.work.notify_one();
        loop {
            if let Some(published) = shared.published_for(seq) {
                return (shared, published);
            }
            shared = self.wait(shared);
        }
    }

    /// Decode `tokens`, a chunk of sequence `seq`'s prompt at positions
    /// `start..`, on the decoder (beside other sequences' rows when all fit
    /// in exact rows: each row's bits are its single decode's either way).
    /// Returns the lock, held while the chunk's output row (its last token's)
    /// is published, and that row: the caller reads it, then calls
    /// [`SharedEngine::done_reading`]. A failed decode's rows are removed.
    pub(crate) fn decode_prompt_chunk(
        &self,
        seq: i32,
        tokens: &[i32],
        start: usize,
    ) -> Result<(MutexGuard<'_, Shared>, i32)> {
        let rows = Rows::Prompt {
            tokens: tokens.to_vec(),
            start,
        };
        let (mut shared, (first_row, _, failed)) = self.decoded(self.lock(), seq, rows);
        let Some(message) = failed else {
            let last_row = first_row + tokens.len() as i32 - 1;
            return Ok((shared, last_row));
        };
        let error = undo_failed_decode(&mut shared.target, seq, start, &message);
        self.done_reading(&mut shared, seq);
        Err(error)
    }

    /// `seq` has read its rows of the published decode.
    pub(crate) fn done_reading(&self, shared: &mut Shared, seq: i32) {
        self.core.read(shared, seq);
    }
}

impl Drop for SharedEngine {
    fn drop(&mut self) {
        self.lock().stopping = true;
        self.core.work.notify_one();
        if let Some(decoder) = self.decoder.take() {
            // A decoder that panicked has nothing left to give back.
            let _ = decoder.join();
        }
    }
}

impl Shared {
    /// Empty `seq`'s cells if they are an earlier generation's, kept.
    fn settle(&mut self, seq: i32) {
        let Some(kept) = usize::try_from(seq).ok().and_then(|s| self.kept.get_mut(s)) else {
            return;
        };
        if !kept.tokens.is_empty() {
            kept.tokens.clear();
            self.target.seq_rm(seq, -1, -1);
        }
    }

    /// Keep sequence `seq`'s state (its cells: `tokens`, kept under `key`)
    /// in memory, when there is room for it; entries of the same key it
    /// extends are dropped.
    fn save(&mut self, seq: i32, tokens: &[i32], key: &Arc<str>) {
        if self.saved_limit == 0 {
            return;
        }
        let Ok(state) = self
            .target
            .seq_state(seq)
            .and_then(|state| restream_seq_state(&state, 1, 0))
        else {
            return;
        };
        if state.len() > self.saved_limit {
            return;
        }
        self.saved
            .retain(|saved| saved.key != *key || !tokens.starts_with(&saved.tokens));
        self.saved.push_back(Saved {
            tokens: tokens.to_vec(),
            state,
            key: Arc::clone(key),
        });
        self.evict_saved();
    }

    /// Drop the least recently used states until they fit the limit.
    fn evict_saved(&mut self) {
        let mut total: usize = self.saved.iter().map(|saved| saved.state.len()).sum();
        while total > self.saved_limit {
            let Some(oldest) = self.saved.pop_front() else {
                break;
            };
            total -= oldest.state.len();
        }
    }

    /// The saved state of reuse key `key` sharing the longest prefix with
    /// `prompt` (at most all but its last token): its index and that
    /// prefix's length.
    fn longest_saved(&self, prompt: &[i32], key: &str) -> Option<(usize, usize)> {
        let most = prompt.len().saturating_sub(1);
        self.saved
            .iter()
            .enumerate()
            .filter(|(_, saved)| *saved.key == *key)
            .map(|(index, saved)| (index, common_prefix(&saved.tokens, prompt).min(most)))
            .max_by_key(|&(index, n)| (n, index))
    }

    /// The sequence, `seq` or a free one, whose tokens kept under reuse key
    /// `key` share the longest prefix with `prompt`, and that prefix's
    /// length (at most all but the prompt's last token; 0 for cells kept
    /// under another key).
    fn longest_kept(&self, seq: usize, prompt: &[i32], key: &str) -> (usize, usize) {
        let most = prompt.len().saturating_sub(1);
        let shared = |kept: &Kept| match kept.key.as_deref() {
            Some(kept_key) if kept_key == key => common_prefix(&kept.tokens, prompt).min(most),
            _ => 0,
        };
        (0..self.kept.len())
            .filter(|&s| s == seq || !self.taken[s])
            .map(|s| (s, shared(&self.kept[s])))
            .max_by_key(|&(s, n)| (n, s == seq))
            .unwrap_or((seq, 0))
    }

    fn submit(&mut self, seq: i32, rows: Rows) {
        self.pending.push(Submission { seq, rows });
        self.window_end
            .get_or_insert_with(|| Instant::now() + GATHER_WINDOW);
    }

    /// The first row of `seq`'s rows in the published decode, its time, its failure.
    fn published_for(&self, seq: i32) -> Option<(i32, u64, Option<String>)> {
        let published = self.published.as_ref()?;
        let (_, first_row) = published.rows.iter().find(|(s, _)| *s == seq)?;
        Some((*first_row, published.micros, published.failed.clone()))
    }

    /// `seq` has read its rows of the published decode: once every round in
    /// it has, the next decode may run.
    fn read(&mut self, seq: i32) {
        if let Some(published) = self.published.as_mut() {
            published.rows.retain(|(s, _)| *s != seq);
            if published.rows.is_empty() {
                self.published = None;
            }
        }
        if let Some(last) = usize::try_from(seq)
            .ok()
            .and_then(|s| self.last_round.get_mut(s))
        {
            *last = Some(Instant::now());
        }
    }

    /// Whether the pending rows should be decoded now: nothing published is
    /// still read, and every generator that ran a round lately has submitted,
    /// or the window has passed.
    fn ready(&self, now: Instant) -> bool {
        if self.pending.is_empty() || self.published.is_some() {
            return false;
        }
        if self.window_end.is_some_and(|end| now >= end) {
            return true;
        }
        self.last_round.iter().enumerate().all(|(seq, last)| {
            let recent = last.is_some_and(|at| now.duration_since(at) < RECENT);
            !recent || self.pending.iter().any(|s| s.seq as usize == seq)
        })
    }

    /// Decode the first group of pending rows and publish it.
    fn decode_next(&mut self) {
        let rows = self.pending.iter().map(|s| s.rows.len());
        let Some(range) = decode_groups(rows).into_iter().next() else {
            return;
        };
        let mut group: Vec<Submission> = self.pending.drain(range).collect();
        // In the order of their sequences: llama.cpp computes a batch over
        // several KV streams in one pass only where its sequences are
        // consecutive ids in increasing order (`split_equal`), and otherwise
        // in one pass per run of them.
        group.sort_by_key(|submission| submission.seq);
        if self.pending.is_empty() {
            self.window_end = None;
        }
        let started = Instant::now();
        let decoded = self.decode_group(&group);
        let micros = crate::engine::micros_since(started);
        let mut first_row = 0;
        let rows = group
            .iter()
            .map(|s| {
                let row = (s.seq, first_row);
                first_row += s.rows.len() as i32;
                row
            })
            .collect();
        self.count(&group, micros);
        self.published = Some(Published {
            rows,
            micros,
            failed: decoded.err().map(|e| e.to_string()),
        });
    }

    /// Count a decode of `group` in the stats (rounds' decodes, rows and sequences).
    fn count(&mut self, group: &[Submission], micros: u64) {
        self.stats.micros += micros;
        let rounds = group.iter().filter(|s| matches!(s.rows, Rows::Round(_)));
        let (sequences, rows) =
            rounds.fold((0, 0), |(n, rows), s| (n + 1, rows + s.rows.len() as u64));
        if sequences > 0 {
            self.stats.decodes += 1;
            self.stats.rows += rows;
            self.stats.sequences += sequences;
        }
    }

    fn decode_group(&mut self, group: &[Submission]) -> Result<()> {
        self.step.clear();
        for submission in group {
            submission.rows.push_into(&mut self.step, submission.seq)?;
        }
        Ok(self.target.decode(&self.step)?)
    }
}

/// The length of the common prefix of `a` and `b`.
fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

/// A generator's sequence of a [`SharedEngine`]; dropping it frees the sequence.
pub(crate) struct Attached {
    engine: Arc<SharedEngine>,
    seq: i32,
    /// Whether every cell of the sequence was decoded in exact rows (it
    /// began empty or on kept cells; a state placed from elsewhere is not).
    exact: bool,
    /// The tokens whose cells stay for a later prompt when it is dropped,
    /// and the reuse key they stay under.
    keep: Option<(Vec<i32>, Arc<str>)>,
}

impl Attached {
    /// The engine.
    pub(crate) fn engine(&self) -> &Arc<SharedEngine> {
        &self.engine
    }

    /// The sequence id.
    pub(crate) fn seq(&self) -> i32 {
        self.seq
    }

    /// The engine's lock, the sequence emptied of cells kept from an earlier
    /// generation (what every use of it but [`Attached::reuse`] needs first).
    pub(crate) fn settle(&self) -> MutexGuard<'_, Shared> {
        let mut shared = self.engine.idle();
        shared.settle(self.seq);
        shared
    }

    /// Before a prompt: move onto the free sequence (this one included)
    /// whose cells kept under reuse key `key` share the longest prefix with
    /// `prompt`, keep that prefix's cells and empty the rest; returns its
    /// length (0: the sequence is empty). Only for a generation whose own
    /// decodes are exact. Cells kept under another key are never reused.
    pub(crate) fn reuse(&mut self, prompt: &[i32], key: &str) -> Result<usize> {
        let mut shared = self.engine.idle();
        let own = usize::try_from(self.seq).unwrap_or(0);
        let (best, n) = shared.longest_kept(own, prompt, key);
        let saved = shared.longest_saved(prompt, key);
        if let Some((index, saved_n)) = saved.filter(|&(_, m)| m > n) {
            return self.restore_saved(&mut shared, index, saved_n);
        }
        if best != own {
            // A free sequence's cells are its kept tokens, or none.
            if shared.kept[own].tokens.is_empty() {
                shared.target.seq_rm(self.seq, -1, -1);
            }
            shared.taken[own] = false;
            shared.taken[best] = true;
            shared.last_round[best] = None;
            self.seq = crate::engine::position(best)?;
        }
        shared.kept[best].tokens.clear();
        shared
            .target
            .seq_rm(self.seq, crate::engine::position(n)?, -1);
        shared.stats.reused += n as u64;
        Ok(n)
    }

    /// [`Attached::reuse`] from the saved state at `index`: placed on this
    /// sequence (its own kept cells given up), cut to its first `n` tokens.
    fn restore_saved(&self, shared: &mut Shared, index: usize, n: usize) -> Result<usize> {
        let own = usize::try_from(self.seq).unwrap_or(0);
        shared.kept[own].tokens.clear();
        let Some(saved) = shared.saved.remove(index) else {
            return Ok(0);
        };
        let n_seq = self.engine.config.n_seq;
        let placed = place_state(&mut shared.target, n_seq, self.seq, Some(&saved.state));
        shared.saved.push_back(saved);
        if placed.is_err() {
            return Ok(0); // the sequence is empty again: the whole prompt is decoded
        }
        shared
            .target
            .seq_rm(self.seq, crate::engine::position(n)?, -1);
        shared.stats.reused += n as u64;
        Ok(n)
    }

    /// Keep the cells of `tokens` (the sequence's tokens, in order) for a
    /// later prompt of reuse key `key` once this is dropped, if they are exact.
    pub(crate) fn keep_when_dropped(&mut self, tokens: &[i32], key: &Arc<str>) {
        if self.exact {
            self.keep = Some((tokens.to_vec(), Arc::clone(key)));
        }
    }

    /// The sequence's state in a lone context's layout.
    pub(crate) fn state(&self) -> Result<Vec<u8>> {
        let mut shared = self.settle();
        let state = shared.target.seq_state(self.seq)?;
        Ok(restream_seq_state(&state, 1, 0)?)
    }

    /// Replace the sequence's state with `state` (a lone context's layout).
    pub(crate) fn set_state(&mut self, state: &[u8]) -> Result<()> {
        self.exact = false;
        let mut shared = self.settle();
        place_state(
            &mut shared.target,
            self.engine.config.n_seq,
            self.seq,
            Some(state),
        )
    }

    /// Empty the sequence.
    pub(crate) fn clear(&mut self) {
        self.exact = true;
        self.settle().target.seq_rm(self.seq, -1, -1);
    }

    /// The lowest and highest positions of the sequence (`-1` when empty).
    pub(crate) fn positions(&self) -> crate::native::NativeResult<(i32, i32)> {
        self.settle().target.seq_positions(self.seq)
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let mut shared = self.engine.idle();
        let Ok(seq) = usize::try_from(self.seq) else {
            return;
        };
        let (tokens, key) = self.keep.take().unzip();
        let tokens = tokens.unwrap_or_default();
        let kept = !tokens.is_empty()
            && crate::engine::position(tokens.len())
                .is_ok_and(|n| shared.target.seq_rm(self.seq, n, -1));
        if let (true, Some(key)) = (kept, key) {
            shared.save(self.seq, &tokens, &key);
            shared.releases += 1;
            shared.kept[seq] = Kept {
                tokens,
                key: Some(key),
                released: shared.releases,
            };
        } else {
            shared.target.seq_rm(self.seq, -1, -1);
            shared.kept[seq] = Kept::default();
        }
        shared.taken[seq] = false;
        shared.last_round[seq] = None;
    }
}
