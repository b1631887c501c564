//! An owned llama.cpp model (`llama_model_load_from_file`/`llama_model_free`).

use std::ffi::{c_char, CString};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use llama_cpp_sys_4 as sys;

use super::{ensure_backend, NativeError, NativeResult};

/// GGUF files start with these four bytes.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Longest metadata key or value copied out (values beyond are truncated by llama.cpp).
const METADATA_BUFFER: usize = 64 * 1024;

/// A loaded GGUF model. Immutable after loading and shareable between threads.
pub struct Model {
    raw: NonNull<sys::llama_model>,
    path: PathBuf,
    /// SHA-256 (hex) and size of the file loaded.
    digest: (String, u64),
    /// Loaded with `use_mmap`: the file llama.cpp maps (held open, so it
    /// is the mapped file whatever later happens to the path) and its stamp
    /// as loaded. `None` when the weights were copied into memory.
    mapped: Option<(File, FileStamp)>,
    /// The tokens whose text is one printable ASCII character or a
    /// whitespace byte (the first such token of each byte), found once.
    byte_tokens: std::sync::OnceLock<Vec<(i32, u8)>>,
}

/// What a write to a file changes, read without reading the file: its
/// identity (device, inode), size, and modification and status-change times
/// in nanoseconds (and its link count). Any write through the file system
/// changes the status-change time (ctime), which no process can set back
/// (`touch` sets the modification time only), so an equal stamp means
/// unchanged bytes, up to the file system's timestamp granularity (a write
/// in the same clock tick as the write before the stamp was taken).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    device: u64,
    inode: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    links: u64,
}

impl FileStamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let ns =
                |seconds: i64, nanos: i64| i128::from(seconds) * 1_000_000_000 + i128::from(nanos);
            Self {
                device: metadata.dev(),
                inode: metadata.ino(),
                size: metadata.len(),
                mtime_ns: ns(metadata.mtime(), metadata.mtime_nsec()),
                ctime_ns: ns(metadata.ctime(), metadata.ctime_nsec()),
                links: metadata.nlink(),
            }
        }
        #[cfg(not(unix))]
        {
            let ns = metadata
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos() as i128);
            Self {
                device: 0,
                inode: 0,
                size: metadata.len(),
                mtime_ns: ns,
                ctime_ns: ns,
                links: 1,
            }
        }
    }

    /// What differs from `then` that may have changed the bytes, in words
    /// (`None`: nothing). A new status-change time that comes with a new link
    /// count is the file being renamed over, removed or linked, not written:
    /// its bytes are the same.
    fn changes_since(&self, then: &Self) -> Option<String> {
        let mut changes = Vec::new();
        if (self.device, self.inode) != (then.device, then.inode) {
            changes.push("another file is at the path".to_owned());
        }
        if self.size != then.size {
            changes.push(format!("size {} -> {} bytes", then.size, self.size));
        }
        if self.mtime_ns != then.mtime_ns {
            changes.push("modification time".to_owned());
        }
        if self.ctime_ns != then.ctime_ns && self.links == then.links {
            changes.push("status-change time".to_owned());
        }
        (!changes.is_empty()).then(|| changes.join(", "))
    }
}

// SAFETY: a `llama_model` is read-only once loaded; llama.cpp creates contexts
// from one model on several threads, and every method here only reads it.
unsafe impl Send for Model {}
// SAFETY: see `Send`: no method mutates the model.
unsafe impl Sync for Model {}

fn load_error(path: &Path, reason: impl Into<String>) -> NativeError {
    NativeError::ModelLoad {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Open `path` and refuse, before llama.cpp sees it, anything that is not a
/// regular GGUF file. The type is checked before opening and the file is
/// opened without blocking, so a FIFO or a device can never hang the caller.
fn open_gguf_file(path: &Path) -> NativeResult<File> {
    let io_error = |error: std::io::Error| load_error(path, error.to_string());
    if !std::fs::metadata(path).map_err(io_error)?.is_file() {
        return Err(load_error(path, "not a regular file"));
    }
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let mut file = options.open(path).map_err(io_error)?;
    if !file.metadata().map_err(io_error)?.is_file() {
        return Err(load_error(path, "not a regular file"));
    }
    let mut magic = [0_u8; 4];
    match file.read_exact(&mut magic) {
        Ok(()) if &magic == GGUF_MAGIC => Ok(file),
        Ok(()) => Err(load_error(path, "not a GGUF file (bad magic)")),
        Err(_) => Err(load_error(path, "not a GGUF file (too short)")),
    }
}

/// SHA-256 (hex) and size of everything in `file`, read from its start.
fn file_digest(path: &Path, file: &mut File) -> NativeResult<(String, u64)> {
    use sha2::Digest;
    let io_error = |error: std::io::Error| load_error(path, error.to_string());
    file.seek(SeekFrom::Start(0)).map_err(io_error)?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0_u8; 1 << 20];
    let mut size = 0_u64;
    loop {
        let n = file.read(&mut buffer).map_err(io_error)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        size += n as u64;
    }
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((hex, size))
}

/// How the file at `path` and the file `file` has open differ from `stamp`
/// (`None`: both are the file stamped, unchanged).
fn change_since(path: &Path, file: &File, stamp: &FileStamp) -> Option<String> {
    let now = |metadata: std::io::Result<std::fs::Metadata>| match metadata {
        Ok(metadata) => FileStamp::of(&metadata).changes_since(stamp),
        Err(error) => Some(error.to_string()),
    };
    now(file.metadata()).or_else(|| now(std::fs::metadata(path)))
}

impl Model {
    /// Load `path` with its weights copied into memory (see [`Model::load_with`]).
    pub fn load(path: &Path, n_gpu_layers: i32) -> NativeResult<Self> {
        Self::load_with(path, n_gpu_layers, false)
    }

    /// Load `path`, offloading `n_gpu_layers` layers to a GPU backend if one is built in
    /// (`-1`: all of them, llama.cpp's own convention; a build or machine without a GPU keeps
    /// every layer on the CPU whatever the number). Below `-1` is an invalid argument.
    ///
    /// Without `use_mmap` llama.cpp reads the weights into memory, so later
    /// writes to the file change nothing. With it llama.cpp maps the file
    /// and computes from the mapping: a write into the file changes the live
    /// weights (and a truncation kills the process with SIGBUS at the next
    /// decode); [`Model::check_unchanged`] tells whether that happened.
    ///
    /// The file's fingerprint (SHA-256 and size) is of the bytes loaded: it
    /// is read from the handle opened here, and a file replaced or written
    /// while llama.cpp loads it (another stamp after the load than before the
    /// fingerprint) is refused.
    pub fn load_with(path: &Path, n_gpu_layers: i32, use_mmap: bool) -> NativeResult<Self> {
        if n_gpu_layers < -1 {
            return Err(NativeError::InvalidArgument(format!(
                "n_gpu_layers must be -1 (all layers) or at least 0, not {n_gpu_layers}"
            )));
        }
        let mut file = open_gguf_file(path)?;
        let stamp = FileStamp::of(
            &file
                .metadata()
                .map_err(|error| load_error(path, error.to_string()))?,
        );
        let digest = file_digest(path, &mut file)?;
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| load_error(path, "the path contains a NUL byte"))?;
        ensure_backend();
        // SAFETY: returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.n_gpu_layers = n_gpu_layers;
        if !use_mmap {
            // Read every tensor up front (lazy reading maps the file too).
            // With `use_mmap`, llama.cpp's defaults: map where the devices allow.
            params.load_mode = sys::LLAMA_LOAD_MODE_NONE;
            params.lazy_mode = sys::LLAMA_LAZY_MODE_OFF;
        }
        // Load MTP (nextn) heads where the model has them: an MTP draft
        // context over a model loaded without them aborts inside llama.cpp.
        params.load_mtp = true;
        // SAFETY: `c_path` is NUL-terminated and outlives the call; on failure
        // llama.cpp returns null and owns nothing.
        let raw = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), params) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            load_error(
                path,
                "llama.cpp could not load it (truncated, corrupt or unsupported architecture)",
            )
        })?;
        let mut model = Self {
            raw,
            path: path.to_path_buf(),
            digest,
            mapped: None,
            byte_tokens: std::sync::OnceLock::new(),
        };
        if let Some(change) = change_since(path, &file, &stamp) {
            return Err(load_error(
                path,
                format!("the file changed while it was being loaded ({change})"),
            ));
        }
        model.mapped = use_mmap.then_some((file, stamp));
        Ok(model)
    }

    /// Whether the weights are computed from a mapping of the file (`use_mmap`).
    pub fn use_mmap(&self) -> bool {
        self.mapped.is_some()
    }

    /// Refuse a mapped model whose file has been written since it was loaded
    /// (its weights may no longer be the bytes its fingerprint names), with
    /// [`NativeError::ModelChanged`]. A model loaded into memory always passes;
    /// so does a mapped one whose path now names another file (the mapping
    /// keeps the file loaded).
    pub fn check_unchanged(&self) -> NativeResult<()> {
        let Some((file, stamp)) = &self.mapped else {
            return Ok(());
        };
        let change = match file.metadata() {
            Ok(metadata) => FileStamp::of(&metadata).changes_since(stamp),
            Err(error) => Some(error.to_string()),
        };
        match change {
            None => Ok(()),
            Some(change) => Err(NativeError::ModelChanged {
                path: self.path.clone(),
                change,
            }),
        }
    }

    /// SHA-256 (hex) and size of the model file, as it was when loaded.
    pub fn file_digest(&self) -> &(String, u64) {
        &self.digest
    }

    /// The path the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn raw(&self) -> *mut sys::llama_model {
        self.raw.as_ptr()
    }

    pub(super) fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is live; the vocabulary lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.raw.as_ptr()) }
    }

    /// Tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: the vocabulary is live (see `vocab`).
        let n = unsafe { sys::llama_vocab_n_tokens(self.vocab()) };
        usize::try_from(n).unwrap_or(0)
    }

    /// Embedding width.
    pub fn n_embd(&self) -> i32 {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_n_embd(self.raw.as_ptr()) }
    }

    /// The context length the model was trained with (0 if unknown).
    pub fn n_ctx_train(&self) -> u32 {
        // SAFETY: the model is live.
        let n = unsafe { sys::llama_model_n_ctx_train(self.raw.as_ptr()) };
        u32::try_from(n).unwrap_or(0)
    }

    /// Layer count (MTP/nextn layers included, as llama.cpp counts them).
    pub fn n_layer(&self) -> i32 {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_n_layer(self.raw.as_ptr()) }
    }

    /// Number of MTP (nextn) layers.
    pub fn n_layer_nextn(&self) -> i32 {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_n_layer_nextn(self.raw.as_ptr()) }
    }

    /// Whether every layer is recurrent (Mamba, RWKV, ...).
    pub fn is_recurrent(&self) -> bool {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_is_recurrent(self.raw.as_ptr()) }
    }

    /// Whether the model mixes recurrent and attention layers.
    pub fn is_hybrid(&self) -> bool {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_is_hybrid(self.raw.as_ptr()) }
    }

    /// Size of the model's tensors in bytes.
    pub fn size_bytes(&self) -> u64 {
        // SAFETY: the model is live.
        unsafe { sys::llama_model_size(self.raw.as_ptr()) }
    }

    /// End-of-sequence token id.
    pub fn eos(&self) -> i32 {
        // SAFETY: the vocabulary is live.
        unsafe { sys::llama_vocab_eos(self.vocab()) }
    }

    /// Beginning-of-sequence token id.
    pub fn bos(&self) -> i32 {
        // SAFETY: the vocabulary is live.
        unsafe { sys::llama_vocab_bos(self.vocab()) }
    }

    /// Whether `token` ends generation (EOS, EOT, ...).
    pub fn is_eog(&self, token: i32) -> bool {
        // SAFETY: the vocabulary is live; out-of-range ids return false.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// Refuse the first of `tokens` outside this vocabulary.
    pub fn check_tokens(&self, tokens: &[i32]) -> Result<(), super::OutOfVocabulary> {
        super::check_vocabulary(tokens, self.n_vocab())
    }

    /// Every GGUF metadata entry as text, in file order.
    pub fn metadata(&self) -> Vec<(String, String)> {
        // SAFETY: the model is live.
        let count = unsafe { sys::llama_model_meta_count(self.raw.as_ptr()) };
        (0..count)
            .filter_map(|i| {
                let key = read_c_string(|buf, len| {
                    // SAFETY: `buf` has `len` writable bytes; `i < count`.
                    unsafe { sys::llama_model_meta_key_by_index(self.raw.as_ptr(), i, buf, len) }
                })?;
                let value = read_c_string(|buf, len| {
                    // SAFETY: as above.
                    unsafe {
                        sys::llama_model_meta_val_str_by_index(self.raw.as_ptr(), i, buf, len)
                    }
                })?;
                Some((key, value))
            })
            .collect()
    }

    /// One metadata value by key.
    pub fn metadata_value(&self, key: &str) -> Option<String> {
        let key = CString::new(key).ok()?;
        read_c_string(|buf, len| {
            // SAFETY: `key` is NUL-terminated; `buf` has `len` writable bytes.
            unsafe { sys::llama_model_meta_val_str(self.raw.as_ptr(), key.as_ptr(), buf, len) }
        })
    }

    /// The model's own chat template (`tokenizer.chat_template`), if it has one.
    pub fn chat_template(&self) -> Option<String> {
        // SAFETY: the model is live; a NULL name asks for the default template.
        let raw = unsafe { sys::llama_model_chat_template(self.raw.as_ptr(), std::ptr::null()) };
        if raw.is_null() {
            return None;
        }
        // SAFETY: llama.cpp returns a NUL-terminated string owned by the model,
        // which outlives this borrow; it is copied at once.
        let text = unsafe { std::ffi::CStr::from_ptr(raw) };
        Some(text.to_string_lossy().into_owned())
    }

    /// Whether tokenizing with `add_special` adds BOS (the model's metadata says).
    pub fn add_bos(&self) -> bool {
        // SAFETY: the vocabulary belongs to the live model.
        unsafe { sys::llama_vocab_get_add_bos(self.vocab()) }
    }

    /// The architecture name (`general.architecture`).
    pub fn architecture(&self) -> String {
        self.metadata_value("general.architecture")
            .unwrap_or_default()
    }

    /// Tokenize `text`; `add_special` adds BOS/EOS as the model is configured to.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> NativeResult<Vec<i32>> {
        let text_len = i32::try_from(text.len())
            .map_err(|_| NativeError::InvalidArgument("text is too long to tokenize".into()))?;
        // A token covers at least one byte, plus BOS/EOS.
        let mut tokens = vec![0_i32; text.len() + 2];
        // SAFETY: `text` is valid for `text_len` bytes; `tokens` has
        // `tokens.len()` writable slots (≤ text_len + 2, fits in i32 after the
        // check above unless text is within 2 of i32::MAX, which saturates).
        let n = unsafe {
            sys::llama_tokenize(
                self.vocab(),
                text.as_ptr().cast::<c_char>(),
                text_len,
                tokens.as_mut_ptr(),
                i32::try_from(tokens.len()).unwrap_or(i32::MAX),
                add_special,
                parse_special,
            )
        };
        let n = usize::try_from(n)
            .map_err(|_| NativeError::InvalidArgument("tokenization failed".into()))?;
        tokens.truncate(n);
        Ok(tokens)
    }

    /// The bytes of one token (special tokens rendered when `special`).
    pub fn token_to_piece(&self, token: i32, special: bool) -> NativeResult<Vec<u8>> {
        self.check_tokens(&[token])?;
        let mut piece = vec![0_u8; 64];
        loop {
            let len = i32::try_from(piece.len()).unwrap_or(i32::MAX);
            // SAFETY: `piece` has `len` writable bytes; `token` is in range.
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
                    token,
                    piece.as_mut_ptr().cast(),
                    len,
                    0,
                    special,
                )
            };
            if n >= 0 {
                piece.truncate(n as usize);
                return Ok(piece);
            }
            let needed = n.unsigned_abs() as usize;
            if needed <= piece.len() || needed > METADATA_BUFFER {
                return Err(NativeError::InvalidArgument(format!(
                    "token {token} has no text"
                )));
            }
            piece.resize(needed, 0);
        }
    }

    /// The tokens whose whole text is one printable ASCII character, a space,
    /// a tab, a newline or a carriage return, as `(token, byte)` in byte
    /// order (the lowest id of each byte): a grammar's next character is
    /// probed with them. Found by one pass over the vocabulary, on first use.
    pub fn byte_tokens(&self) -> &[(i32, u8)] {
        self.byte_tokens.get_or_init(|| {
            let mut found: [Option<i32>; 128] = [None; 128];
            for id in 0..i32::try_from(self.n_vocab()).unwrap_or(i32::MAX) {
                let Ok(piece) = self.token_to_piece(id, false) else {
                    continue;
                };
                if let [byte] = piece[..] {
                    let probed = byte.is_ascii_graphic() || b" \t\n\r".contains(&byte);
                    if probed && found[usize::from(byte)].is_none() {
                        found[usize::from(byte)] = Some(id);
                    }
                }
            }
            (0_u8..128)
                .filter_map(|byte| found[usize::from(byte)].map(|id| (id, byte)))
                .collect()
        })
    }

    /// The bytes of a token sequence, specials rendered when `special`.
    pub fn detokenize(&self, tokens: &[i32], special: bool) -> NativeResult<Vec<u8>> {
        let mut text = Vec::new();
        for &token in tokens {
            text.extend(self.token_to_piece(token, special)?);
        }
        Ok(text)
    }
}

/// Read a NUL-terminated string from a llama.cpp "copy into buffer" call that
/// returns the full length (or a negative value when absent).
fn read_c_string(mut call: impl FnMut(*mut c_char, usize) -> i32) -> Option<String> {
    let mut buffer = vec![0_u8; 256];
    loop {
        let n = usize::try_from(call(buffer.as_mut_ptr().cast(), buffer.len())).ok()?;
        if n < buffer.len() {
            buffer.truncate(n);
            return Some(String::from_utf8_lossy(&buffer).into_owned());
        }
        if buffer.len() >= METADATA_BUFFER {
            buffer.truncate(buffer.len() - 1);
            return Some(String::from_utf8_lossy(&buffer).into_owned());
        }
        buffer.resize((n + 1).min(METADATA_BUFFER), 0);
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `llama_model_load_from_file` and is freed
        // once; contexts hold an `Arc<Model>`, so none outlives it.
        unsafe { sys::llama_model_free(self.raw.as_ptr()) };
    }
}
