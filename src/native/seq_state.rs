//! What a sequence state claims of a recurrent memory, read before llama.cpp
//! sees it.
//!
//! llama.cpp writes one sequence's state (`llama_state_seq_get_data`) as its
//! magic and the sequence id, then each memory in turn: a hybrid model's
//! attention cache (one part, or two for interleaved sliding-window
//! attention) and then its recurrent memory; a recurrent model's recurrent
//! memory alone. A sequence holds at most one recurrent cell, but the reader
//! (`llama_memory_recurrent::state_read_meta`) trusts the count it is given:
//! in a context of two or more sequences, a state claiming two cells reaches
//! `GGML_ASSERT(cells[head].pos == ubatch.pos[0])` and aborts the process.
//! [`check_recurrent_cells`] walks the layout as the pinned llama.cpp's
//! readers do (llama-context.cpp, llama-kv-cache.cpp,
//! llama-memory-recurrent.cpp) far enough to count those cells.

use super::ContextKind;

/// `io_magic` of llama-context.cpp: the first four bytes of a sequence state.
const SEQ_STATE_MAGIC: u32 = 0xaf14_3cd8;
/// `sizeof(llama_kv_cell_ext)`: the 2D position and the token of a cell,
/// written after each cell's position by caches of M-RoPE (and PLE) models.
const CELL_EXT_BYTES: u64 = 12;
/// The most streams an attention cache has (`LLAMA_MAX_SEQ`).
const MAX_STREAMS: u32 = 256;

/// Which memories a context of this model and kind writes, as
/// [`check_recurrent_cells`] needs to know them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Memories {
    /// The model is recurrent (Mamba, RWKV, ...): a recurrent memory alone.
    pub recurrent: bool,
    /// The model is hybrid: attention cache(s), then a recurrent memory.
    pub hybrid: bool,
    /// The context's kind: an MTP context of a hybrid model may hold an
    /// attention cache alone.
    pub kind: ContextKind,
}

/// A cursor over the state's bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader of a sequence state past its magic and sequence id (`None`: not a sequence state).
    fn past_header(bytes: &'a [u8]) -> Option<Self> {
        let mut reader = Self { bytes, at: 0 };
        if reader.u32()? != SEQ_STATE_MAGIC {
            return None;
        }
        let _seq_id = reader.u32()?;
        Some(reader)
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let end = self.at.checked_add(N)?;
        let bytes = self.bytes.get(self.at..end)?.try_into().ok()?;
        self.at = end;
        Some(bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    fn skip(&mut self, count: u64) -> Option<()> {
        let end = self.at.checked_add(usize::try_from(count).ok()?)?;
        (end <= self.bytes.len()).then(|| self.at = end)
    }

    fn skip_product(&mut self, factors: &[u64]) -> Option<()> {
        let count = factors.iter().try_fold(1_u64, |n, f| n.checked_mul(*f))?;
        self.skip(count)
    }

    fn at_end(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// One attention cache's part (`llama_kv_cache::state_write` of one
/// sequence), with or without the cell extension: the byte range of each
/// stream (its cell count, then its cells and their data).
fn attention_part(reader: &mut Reader<'_>, ext: bool) -> Option<Vec<std::ops::Range<usize>>> {
    let n_stream = reader.u32()?;
    if n_stream == 0 || n_stream > MAX_STREAMS {
        return None;
    }
    let mut streams = Vec::with_capacity(n_stream as usize);
    for _ in 0..n_stream {
        let start = reader.at;
        attention_stream(reader, ext)?;
        streams.push(start..reader.at);
    }
    Some(streams)
}

/// One stream of an attention cache's part.
fn attention_stream(reader: &mut Reader<'_>, ext: bool) -> Option<()> {
    let cells = u64::from(reader.u32()?);
    if cells == 0 {
        return Some(());
    }
    for _ in 0..cells {
        let _pos = reader.u32()?;
        // One sequence's cells name exactly that sequence.
        if reader.u32()? != 1 {
            return None;
        }
        let ext_bytes = if ext { CELL_EXT_BYTES } else { 0 };
        reader.skip(ext_bytes + 4)?;
    }
    let v_trans = reader.u32()?;
    let n_layer = u64::from(reader.u32()?);
    let _n_rot = (reader.u32()?, reader.u32()?);
    if v_trans > 1 {
        return None;
    }
    // Keys: type, row size, rows; values likewise, or transposed: type,
    // element size, width, then width columns of `cells` elements.
    for _ in 0..n_layer {
        let _type = reader.u32()?;
        let row = reader.u64()?;
        reader.skip_product(&[cells, row])?;
    }
    for _ in 0..n_layer {
        let _type = reader.u32()?;
        if v_trans == 0 {
            let row = reader.u64()?;
            reader.skip_product(&[cells, row])?;
        } else {
            let element = u64::from(reader.u32()?);
            let width = u64::from(reader.u32()?);
            reader.skip_product(&[cells, element, width])?;
        }
    }
    Some(())
}

/// An attention-only model's sequence state (one or two attention parts),
/// laid out again for sequence `seq_id` of a context of `n_stream` KV streams
/// (`kv_unified` false: sequence `seq_id` is stream `seq_id`). The cells
/// and their data are the same bytes: only the streams around them change,
/// so a sequence moves between a context of its own and a batch's.
pub(crate) fn restream(state: &[u8], n_stream: u32, seq_id: u32) -> Result<Vec<u8>, String> {
    if seq_id >= n_stream || n_stream > MAX_STREAMS {
        return Err(format!(
            "sequence {seq_id} is not one of {n_stream} streams"
        ));
    }
    [(1, false), (2, false), (1, true), (2, true)]
        .into_iter()
        .find_map(|(parts, ext)| restreamed(state, parts, ext, n_stream, seq_id))
        .ok_or_else(|| "the sequence state is not an attention cache's of one sequence".into())
}

fn restreamed(
    state: &[u8],
    parts: usize,
    ext: bool,
    n_stream: u32,
    seq_id: u32,
) -> Option<Vec<u8>> {
    let mut reader = Reader::past_header(state)?;
    let mut out = Vec::with_capacity(state.len() + 4 * n_stream as usize);
    out.extend(SEQ_STATE_MAGIC.to_le_bytes());
    out.extend(seq_id.to_le_bytes());
    for _ in 0..parts {
        let streams = attention_part(&mut reader, ext)?;
        let mut filled = streams.into_iter().filter(|range| range.len() > 4);
        let cells = filled.next();
        if filled.next().is_some() {
            return None;
        }
        out.extend(n_stream.to_le_bytes());
        for stream in 0..n_stream {
            match &cells {
                Some(range) if stream == seq_id => out.extend_from_slice(&state[range.clone()]),
                _ => out.extend(0_u32.to_le_bytes()),
            }
        }
    }
    reader.at_end().then_some(out)
}

/// The cells a recurrent memory's part claims, as its reader would act on
/// them: the count when every cell is sequence-agnostic (the reader then
/// places them all), else 0 (the reader refuses the first other cell).
fn recurrent_cells(reader: &mut Reader<'_>) -> Option<u64> {
    let cells = u64::from(reader.u32()?);
    let mut placed = true;
    for _ in 0..cells {
        let _pos = reader.u32()?;
        placed &= reader.u32()? == 0;
    }
    Some(if placed { cells } else { 0 })
}

/// The recurrent cells claimed by `state` read with `parts` attention parts
/// (each with or without the cell extension) before the recurrent memory,
/// or, without `recurrent`, `Some(0)` when the attention parts are the whole
/// state; `None` when the state is not laid out so.
fn claimed(state: &[u8], parts: usize, ext: bool, recurrent: bool) -> Option<u64> {
    let mut reader = Reader::past_header(state)?;
    for _ in 0..parts {
        attention_part(&mut reader, ext)?;
    }
    if recurrent {
        recurrent_cells(&mut reader)
    } else {
        reader.at_end().then_some(0)
    }
}

/// Refuse a sequence state whose recurrent memory claims more than the one
/// cell a sequence holds, or that is not laid out as a sequence state of a
/// context with these memories (llama.cpp's layouts are tried in turn; a
/// state that fits none is refused, since its recurrent cells cannot be
/// counted). `Err` says why.
pub(crate) fn check_recurrent_cells(state: &[u8], memories: Memories) -> Result<(), String> {
    // (attention parts, cell extension, recurrent memory follows)
    let mut layouts: Vec<(usize, bool, bool)> = Vec::new();
    if memories.recurrent {
        layouts.push((0, false, true));
    }
    if memories.hybrid {
        for parts in [1, 2] {
            for ext in [false, true] {
                layouts.push((parts, ext, true));
                if memories.kind == ContextKind::Mtp {
                    layouts.push((parts, ext, false));
                }
            }
        }
    }
    let counts: Vec<u64> = layouts
        .iter()
        .filter_map(|&(parts, ext, recurrent)| claimed(state, parts, ext, recurrent))
        .collect();
    match counts.iter().max() {
        Some(&cells) if cells > 1 => Err(format!(
            "the {}-byte state's recurrent part holds {cells} cells, but a sequence holds one at most",
            state.len()
        )),
        Some(_) => Ok(()),
        None => Err(format!(
            "the {}-byte state is not laid out as a sequence state of this {} model",
            state.len(),
            if memories.recurrent { "recurrent" } else { "hybrid" }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32s(values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A recurrent memory's part: `cells` sequence-agnostic cells, then a
    /// layer of one 4-byte row per cell for r and for s.
    fn recurrent(cells: u32) -> Vec<u8> {
        let mut bytes = u32s(&[cells]);
        for pos in 0..cells {
            bytes.extend(u32s(&[pos, 0]));
        }
        bytes.extend(u32s(&[0, 1])); // s_trans, n_layer
        for _ in 0..2 {
            bytes.extend(u32s(&[0]));
            bytes.extend(4_u64.to_le_bytes());
            bytes.extend(vec![0; 4 * cells as usize]);
        }
        bytes
    }

    /// One attention part of one stream: `cells` cells of one layer, 2-byte rows.
    fn attention(cells: u32, ext: bool) -> Vec<u8> {
        let mut bytes = u32s(&[1, cells]);
        for pos in 0..cells {
            bytes.extend(u32s(&[pos, 1]));
            if ext {
                bytes.extend(u32s(&[0, 0, 7]));
            }
            bytes.extend(u32s(&[0]));
        }
        bytes.extend(u32s(&[0, 1, 8, 8]));
        for _ in 0..2 {
            bytes.extend(u32s(&[1]));
            bytes.extend(2_u64.to_le_bytes());
            bytes.extend(vec![0; 2 * cells as usize]);
        }
        bytes
    }

    fn state(parts: &[Vec<u8>]) -> Vec<u8> {
        let mut bytes = u32s(&[SEQ_STATE_MAGIC, 0]);
        parts.iter().for_each(|part| bytes.extend(part));
        bytes
    }

    const HYBRID: Memories = Memories {
        recurrent: false,
        hybrid: true,
        kind: ContextKind::Default,
    };
    const RECURRENT: Memories = Memories {
        recurrent: true,
        hybrid: false,
        kind: ContextKind::Default,
    };

    #[test]
    fn one_recurrent_cell_passes_and_two_are_refused() {
        for ext in [false, true] {
            let one = state(&[attention(3, ext), recurrent(1)]);
            assert_eq!(check_recurrent_cells(&one, HYBRID), Ok(()));
            let two = state(&[attention(3, ext), recurrent(2)]);
            let error = check_recurrent_cells(&two, HYBRID).unwrap_err();
            assert!(error.contains("holds 2 cells"), "{error}");
        }
        let sliding = state(&[attention(3, false), attention(2, false), recurrent(2)]);
        assert!(check_recurrent_cells(&sliding, HYBRID).is_err());
        assert_eq!(
            check_recurrent_cells(&state(&[recurrent(0)]), RECURRENT),
            Ok(())
        );
        assert!(check_recurrent_cells(&state(&[recurrent(3)]), RECURRENT).is_err());
    }

    #[test]
    fn an_mtp_context_of_a_hybrid_model_may_hold_attention_alone() {
        let mtp = Memories {
            kind: ContextKind::Mtp,
            ..HYBRID
        };
        let only = state(&[attention(3, true)]);
        assert_eq!(check_recurrent_cells(&only, mtp), Ok(()));
        assert!(check_recurrent_cells(&only, HYBRID).is_err());
    }

    #[test]
    fn states_of_another_layout_are_refused() {
        let mut wrong_magic = state(&[attention(1, false), recurrent(1)]);
        wrong_magic[0] ^= 1;
        let truncated = state(&[attention(4, false)]);
        for bytes in [wrong_magic, truncated, Vec::new()] {
            let error = check_recurrent_cells(&bytes, HYBRID).unwrap_err();
            assert!(error.contains("not laid out"), "{error}");
        }
        // Cells naming a sequence are the reader's to refuse: not counted.
        let mut named = state(&[recurrent(2)]);
        named[16] = 1;
        assert_eq!(check_recurrent_cells(&named, RECURRENT), Ok(()));
    }

    /// A sequence state of `parts` attention parts (one stream each) for sequence `seq_id`.
    fn attention_state(seq_id: u32, parts: usize, cells: u32) -> Vec<u8> {
        let mut state = u32s(&[SEQ_STATE_MAGIC, seq_id]);
        for _ in 0..parts {
            state.extend(attention(cells, false));
        }
        state
    }

    #[test]
    fn restream_moves_the_cells_between_stream_layouts_and_back() {
        for parts in [1, 2] {
            let alone = attention_state(0, parts, 3);
            let batched = restream(&alone, 4, 2).unwrap();
            // Four streams, the cells in the third, the others empty.
            assert_eq!(batched.len(), alone.len() + parts * 3 * 4);
            assert_eq!(&batched[4..8], &2_u32.to_le_bytes());
            assert_eq!(&batched[8..24], &u32s(&[4, 0, 0, 3])[..]);
            assert_eq!(restream(&batched, 1, 0).unwrap(), alone);
        }
    }

    #[test]
    fn restream_refuses_what_is_not_one_sequence_of_attention() {
        let alone = attention_state(0, 1, 2);
        assert!(restream(&alone[..alone.len() - 1], 2, 0).is_err());
        assert!(restream(&alone, 2, 2).is_err());
        let mut two_streams = u32s(&[SEQ_STATE_MAGIC, 0, 2]);
        two_streams.extend(&attention(1, false)[4..]);
        two_streams.extend(&attention(1, false)[4..]);
        assert!(restream(&two_streams, 2, 0).is_err());
        let mut recurrent_state = u32s(&[SEQ_STATE_MAGIC, 0]);
        recurrent_state.extend(recurrent(1));
        assert!(restream(&recurrent_state, 2, 0).is_err());
    }
}
