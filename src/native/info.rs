//! What the native build is: pinned versions, backends, CPU kernels compiled in,
//! and the check that this CPU can run them.

use std::ffi::CStr;

use llama_cpp_sys_4 as sys;

/// The exact `llama-cpp-sys-4` release this crate pins in `Cargo.toml`.
pub const LLAMA_CPP_SYS_VERSION: &str = "0.11.0";
/// llama.cpp build vendored by that release (from its README).
pub const LLAMA_CPP_BUILD: &str = "b12032+1";
/// llama.cpp commit vendored by that release (from its README).
pub const LLAMA_CPP_COMMIT: &str = "785322d17f";

/// The documented CPU baseline of the default x86-64 build (`.cargo/config.toml`).
pub const CPU_BASELINE: &str = if cfg!(target_arch = "x86_64") {
    "x86-64-v3"
} else {
    "target default"
};

type Probe = unsafe extern "C" fn() -> std::os::raw::c_int;

/// x86 SIMD features whose kernels ggml may compile in, with ggml's probe for
/// "compiled in" (a compile-time macro test inside ggml-cpu).
#[cfg(target_arch = "x86_64")]
const X86_FEATURES: &[(&str, Probe)] = &[
    ("sse3", sys::ggml_cpu_has_sse3),
    ("ssse3", sys::ggml_cpu_has_ssse3),
    ("avx", sys::ggml_cpu_has_avx),
    ("avx2", sys::ggml_cpu_has_avx2),
    ("fma", sys::ggml_cpu_has_fma),
    ("f16c", sys::ggml_cpu_has_f16c),
    ("bmi2", sys::ggml_cpu_has_bmi2),
    ("avx_vnni", sys::ggml_cpu_has_avx_vnni),
    ("avx512", sys::ggml_cpu_has_avx512),
    ("avx512_vbmi", sys::ggml_cpu_has_avx512_vbmi),
    ("avx512_vnni", sys::ggml_cpu_has_avx512_vnni),
    ("avx512_bf16", sys::ggml_cpu_has_avx512_bf16),
];

#[cfg(not(target_arch = "x86_64"))]
const X86_FEATURES: &[(&str, Probe)] = &[];

/// The SIMD features ggml's CPU kernels were compiled for.
pub fn compiled_simd_features() -> Vec<&'static str> {
    X86_FEATURES
        .iter()
        // SAFETY: each probe is a parameterless ggml function returning a
        // compile-time constant; it touches no state and cannot fail.
        .filter(|(_, probe)| unsafe { probe() } != 0)
        .map(|(name, _)| *name)
        .collect()
}

/// Whether this CPU has `feature` (one of [`X86_FEATURES`]' names).
#[cfg(target_arch = "x86_64")]
fn cpu_has(feature: &str) -> bool {
    match feature {
        "sse3" => std::arch::is_x86_feature_detected!("sse3"),
        "ssse3" => std::arch::is_x86_feature_detected!("ssse3"),
        "avx" => std::arch::is_x86_feature_detected!("avx"),
        "avx2" => std::arch::is_x86_feature_detected!("avx2"),
        "fma" => std::arch::is_x86_feature_detected!("fma"),
        "f16c" => std::arch::is_x86_feature_detected!("f16c"),
        "bmi2" => std::arch::is_x86_feature_detected!("bmi2"),
        "avx_vnni" => std::arch::is_x86_feature_detected!("avxvnni"),
        "avx512" => std::arch::is_x86_feature_detected!("avx512f"),
        "avx512_vbmi" => std::arch::is_x86_feature_detected!("avx512vbmi"),
        "avx512_vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
        "avx512_bf16" => std::arch::is_x86_feature_detected!("avx512bf16"),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has(_feature: &str) -> bool {
    true
}

/// Compiled-in SIMD features this CPU lacks; running any kernel would then
/// raise an illegal instruction, so the module refuses to load instead.
pub fn missing_cpu_features() -> Vec<&'static str> {
    compiled_simd_features()
        .into_iter()
        .filter(|feature| !cpu_has(feature))
        .collect()
}

extern "C" {
    /// specstate's patch 0005 (`ggml-cpu.c`): how the exact multi-column
    /// kernels sum their integer products on this CPU (0 AVX2, 1 AVX-VNNI,
    /// 2 AVX512-VNNI; -1 without such kernels), read once per process.
    fn ggml_cpu_exact_sums() -> std::os::raw::c_int;
    /// specstate's patch 0006 (`ops.cpp`): 1 when the exact attention takes
    /// the queries reading one K/V head together, converting each cell once
    /// for all of them; 0 when each query walks the cells alone.
    fn ggml_cpu_exact_attention() -> std::os::raw::c_int;
    /// specstate's patch 0008 (`ggml-cpu.c`): the registers of the exact
    /// tiles on this CPU (512 or 256 bits; -1 without such kernels), read
    /// once per process.
    fn ggml_cpu_exact_tiles() -> std::os::raw::c_int;
    /// specstate's patch 0011 (`repack.cpp`): 1 when verification's products
    /// of repacked Q4_K weights take the multi-column gemv, 0 when the gemv
    /// runs once per column; -1 without such a kernel.
    fn ggml_cpu_exact_q4_k() -> std::os::raw::c_int;
    /// specstate's patch 0011: chunks of Q4_K products the multi-column gemv
    /// has computed in this process.
    fn ggml_cpu_exact_q4_k_cols_chunks() -> i64;
    /// specstate's patch 0012 (`ggml-cpu.c`): 1 when verification's
    /// products of Q6_K weights take the multi-column kernel, 0 when vec_dot
    /// runs once per column; -1 without such a kernel.
    fn ggml_cpu_exact_q6_k() -> std::os::raw::c_int;
    /// specstate's patch 0012: chunks of Q6_K products the multi-column
    /// kernel has computed in this process.
    fn ggml_cpu_exact_q6_k_cols_chunks() -> i64;
    /// specstate's patch 0013 (`ggml-cpu.c`): for a ggml type whose
    /// multi-column kernel comes with a switch (Q5_0; Q4_0 repacked, patch
    /// 0014; Q5_1 and Q5_K, patch 0015), 1 when verification's
    /// products take it, 0 when the single-column kernel runs once per
    /// column; -1 without such a kernel.
    fn ggml_cpu_exact_type(ty: std::os::raw::c_int) -> std::os::raw::c_int;
    /// specstate's patch 0013: chunks of that type's products its
    /// multi-column kernel has computed in this process.
    fn ggml_cpu_exact_type_cols_chunks(ty: std::os::raw::c_int) -> i64;
}

/// How the exact multi-column kernels of verification sum their integer products on this CPU: `avx2`
/// (maddubs + madd), `avxvnni` or `avx512vnni` (dpbusd: the same sums, fewer instructions), or `none` (no such
/// kernels in this build). Every way gives the same bits; `GGML_CPU_EXACT_SUMS` in the environment chooses one
/// this CPU has.
pub fn exact_sums() -> &'static str {
    // SAFETY: a parameterless function of the patched ggml-cpu (every build
    // applies the patches) that reads the CPU once and returns a constant.
    match unsafe { ggml_cpu_exact_sums() } {
        0 => "avx2",
        1 => "avxvnni",
        2 => "avx512vnni",
        _ => "none",
    }
}

/// How the exact attention of decodes and verified rows runs: `shared` (the queries reading one K/V head, a
/// token's heads and a batch's rows, take each cell's conversion once for all of them) or `rows` (each query alone:
/// `GGML_CPU_EXACT_ATTN=rows` in the environment, or a build without the AVX2 kernel). Both give the same bits.
pub fn exact_attention() -> &'static str {
    // SAFETY: a parameterless function of the patched ggml-cpu (every build
    // applies the patches) that reads the environment once and returns a constant.
    match unsafe { ggml_cpu_exact_attention() } {
        1 => "shared",
        _ => "rows",
    }
}

/// The registers verification's exact tiles (four weight rows against several columns) run in on this CPU:
/// `avx512` (two weight rows per 512-bit register, Q4_1, Q8_0 and Q5_0, where the CPU has AVX512-VNNI and the
/// integer sums are VNNI's; Q4_1's products of 2 to 4 columns keep 256-bit tiles), `avx2` (256-bit, Q4_1 only), or
/// `none` (no such kernels in this build). Both give the same bits.
pub fn exact_tiles() -> &'static str {
    // SAFETY: a parameterless function of the patched ggml-cpu (every build
    // applies the patches) that reads the CPU once and returns a constant.
    match unsafe { ggml_cpu_exact_tiles() } {
        512 => "avx512",
        256 => "avx2",
        _ => "none",
    }
}

/// A multi-column K-quant kernel's answer to whether it runs: 1 `cols`, 0 `rows`, anything else `none`.
fn kernel_way(code: std::os::raw::c_int) -> &'static str {
    match code {
        1 => "cols",
        0 => "rows",
        _ => "none",
    }
}

/// How verification's products of repacked Q4_K weights (the bulk of Q4_K_M files) run: `cols` (every column of
/// a batch of 2 to 17 at once, the weights unpacked once for all of them), `rows` (the single-column gemv once per
/// column: `GGML_CPU_EXACT_Q4_K=rows` in the environment), or `none` (no such kernel in this build: not x86 with
/// AVX2). Both give the same bits.
pub fn exact_q4_k() -> &'static str {
    // SAFETY: a parameterless function of the patched ggml-cpu (every build
    // applies the patches) that reads the environment once and returns a constant.
    kernel_way(unsafe { ggml_cpu_exact_q4_k() })
}

/// How many chunks of Q4_K products the multi-column gemv has computed in this process (0 until a verification of a
/// model with repacked Q4_K weights runs; tests check that the kernel is taken).
pub fn exact_q4_k_cols_chunks() -> i64 {
    // SAFETY: a parameterless function of the patched ggml-cpu that reads an atomic counter.
    unsafe { ggml_cpu_exact_q4_k_cols_chunks() }
}

/// How verification's products of Q6_K weights (the output matrix and some others of Q4_K_M files) run: `cols`
/// (every column of a batch of 2 to 17 at once, each weight row loaded and unpacked once for all of them), `rows`
/// (`vec_dot` once per column: `GGML_CPU_EXACT_Q6_K=rows` in the environment), or `none` (no such kernel in this
/// build: not x86 with AVX2). Both give the same bits.
pub fn exact_q6_k() -> &'static str {
    // SAFETY: a parameterless function of the patched ggml-cpu (every build
    // applies the patches) that reads the environment once and returns a constant.
    kernel_way(unsafe { ggml_cpu_exact_q6_k() })
}

/// How many chunks of Q6_K products the multi-column kernel has computed in this process (0 until a verification of
/// a model with Q6_K weights runs; tests check that the kernel is taken).
pub fn exact_q6_k_cols_chunks() -> i64 {
    // SAFETY: a parameterless function of the patched ggml-cpu that reads an atomic counter.
    unsafe { ggml_cpu_exact_q6_k_cols_chunks() }
}

/// The weight types whose multi-column kernels of patches 0013 to 0015 come with a switch, by the name native info gives
/// them (`exact_<name>` and `exact_<name>_cols_chunks`) and their `ggml_type` (ggml.h).
pub const SWITCHED_KERNELS: [(&str, std::os::raw::c_int); 4] =
    [("q5_0", 6), ("q4_0", 2), ("q5_1", 7), ("q5_k", 13)];

/// How verification's products of one of [`SWITCHED_KERNELS`]' types run: `cols` (every column of a batch of 2 to
/// 17 at once, each weight block loaded and unpacked once for all of them), `rows` (the single-column kernel once
/// per column: `GGML_CPU_EXACT_<TYPE>=rows` in the environment, e.g. `GGML_CPU_EXACT_Q5_0=rows`), or `none` (no
/// such kernel in this build: not x86 with AVX2). Both give the same bits.
pub fn exact_type(ty: std::os::raw::c_int) -> &'static str {
    // SAFETY: a function of the patched ggml-cpu (every build applies the patches) that takes any integer, reads
    // the environment once per type and returns a constant.
    kernel_way(unsafe { ggml_cpu_exact_type(ty) })
}

/// How many chunks of products of that type its multi-column kernel has computed in this process (0 until a
/// verification of a model with such weights runs; tests check that the kernel is taken).
pub fn exact_type_cols_chunks(ty: std::os::raw::c_int) -> i64 {
    // SAFETY: a function of the patched ggml-cpu that takes any integer and reads an atomic counter.
    unsafe { ggml_cpu_exact_type_cols_chunks(ty) }
}

/// The backends compiled into this build.
pub fn compiled_backends() -> Vec<&'static str> {
    let mut backends = vec!["cpu"];
    if cfg!(feature = "cuda") {
        backends.push("cuda");
    }
    if cfg!(feature = "metal") {
        backends.push("metal");
    }
    backends
}

/// One device llama.cpp can place work on, from ggml's backend device registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// ggml's short name (`CPU`, `CUDA0`, ...).
    pub name: String,
    /// A longer description (the CPU's or GPU's model name).
    pub description: String,
    /// `cpu`, `gpu`, `igpu` (integrated GPU), `accel` (accelerator used beside the CPU) or `meta`.
    pub kind: &'static str,
    /// Memory of the device in bytes (system memory for the CPU).
    pub memory_total: usize,
    /// Of which free now, in bytes.
    pub memory_free: usize,
}

/// ggml's device type as a lowercase word.
fn device_kind(kind: sys::ggml_backend_dev_type) -> &'static str {
    match kind {
        sys::GGML_BACKEND_DEVICE_TYPE_CPU => "cpu",
        sys::GGML_BACKEND_DEVICE_TYPE_GPU => "gpu",
        sys::GGML_BACKEND_DEVICE_TYPE_IGPU => "igpu",
        sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => "accel",
        sys::GGML_BACKEND_DEVICE_TYPE_META => "meta",
        _ => "unknown",
    }
}

/// Copy a string ggml owns (null counts as empty).
///
/// # Safety
/// `raw` is null or a NUL-terminated string that stays valid for the call.
unsafe fn owned_string(raw: *const std::os::raw::c_char) -> String {
    if raw.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(raw) }
        .to_string_lossy()
        .into_owned()
}

/// The devices llama.cpp sees, in ggml's registry order (the CPU, then any GPU
/// of a backend compiled in). A CUDA build on a machine without a GPU or driver
/// lists the CPU alone: ggml's CUDA backend then registers no device.
pub fn devices() -> Vec<Device> {
    crate::native::ensure_backend();
    // SAFETY: the registry is initialised on first use, process-wide and
    // thread-safe; counting takes no arguments.
    let count = unsafe { sys::ggml_backend_dev_count() };
    (0..count)
        .filter_map(|index| {
            // SAFETY: `index` is below the count just read; registered devices
            // are never removed, so the handle is valid for the process.
            let device = unsafe { sys::ggml_backend_dev_get(index) };
            if device.is_null() {
                return None;
            }
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: `device` is a valid registered device (above); the name
            // and description are strings it owns, copied out at once, and
            // the memory query writes the two `usize`s it is given.
            let (name, description, kind) = unsafe {
                sys::ggml_backend_dev_memory(device, &mut free, &mut total);
                (
                    owned_string(sys::ggml_backend_dev_name(device)),
                    owned_string(sys::ggml_backend_dev_description(device)),
                    sys::ggml_backend_dev_type(device),
                )
            };
            Some(Device {
                name,
                description,
                kind: device_kind(kind),
                memory_total: total,
                memory_free: free,
            })
        })
        .collect()
}

/// llama.cpp's own description of the build (`llama_print_system_info`).
pub fn system_info() -> String {
    // SAFETY: returns a pointer to a static, NUL-terminated buffer owned by
    // llama.cpp; we copy it out immediately.
    let raw = unsafe { sys::llama_print_system_info() };
    if raw.is_null() {
        return String::new();
    }
    // SAFETY: `raw` is non-null and NUL-terminated (see above).
    unsafe { CStr::from_ptr(raw) }
        .to_string_lossy()
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_sys_version_is_the_one_in_the_manifest() {
        let manifest = include_str!("../../Cargo.toml");
        let pin = format!("llama-cpp-sys-4 = \"={LLAMA_CPP_SYS_VERSION}\"");
        assert!(manifest.contains(&pin), "Cargo.toml must pin {pin}");
    }

    #[test]
    fn the_default_x86_build_compiles_the_x86_64_v3_kernels() {
        if cfg!(target_arch = "x86_64") && !cfg!(feature = "cuda") {
            let compiled = compiled_simd_features();
            for feature in ["avx", "avx2", "fma", "f16c", "bmi2"] {
                assert!(
                    compiled.contains(&feature),
                    "{feature} missing from {compiled:?}"
                );
            }
            assert!(
                !compiled.contains(&"avx512"),
                "the baseline must not need AVX-512"
            );
        }
    }

    #[test]
    fn this_machine_runs_the_compiled_kernels() {
        assert_eq!(missing_cpu_features(), Vec::<&str>::new());
    }

    #[test]
    fn the_cpu_is_a_device() {
        let devices = devices();
        let cpu = devices
            .iter()
            .find(|device| device.kind == "cpu")
            .unwrap_or_else(|| panic!("no CPU device in {devices:?}"));
        assert!(!cpu.name.is_empty());
        assert!(cpu.memory_total > 0 && cpu.memory_free <= cpu.memory_total);
        if !cfg!(any(feature = "cuda", feature = "metal")) {
            assert_eq!(devices.len(), 1, "{devices:?}");
        }
    }

    extern "C" {
        /// specstate's patch 0021 (`ops.cpp`): how many floats with the bit
        /// patterns `first`, `first + step`, ... up to `last` get other bits
        /// from the exact attention's eight-lane expf than from libm's expf
        /// (-1 in builds without that kernel).
        fn ggml_cpu_exact_expf_mismatches(first: u32, last: u32, step: u32) -> i64;
    }

    /// The exact attention's softmax takes expf eight cells at a time with
    /// glibc's operations and computes what libm's expf computes: checked on
    /// every third non-positive float (the attention passes no other) and on
    /// the edges (zero, the underflow thresholds, -inf, NaN). Builds for
    /// AVX-512 (the `native` feature on such a CPU) have no such kernel: -1.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
    fn the_attentions_vector_expf_is_libms() {
        let compiled = compiled_simd_features();
        let kernel = ["avx2", "fma", "f16c"]
            .iter()
            .all(|feature| compiled.contains(feature))
            && !compiled.contains(&"avx512");
        let expected = if kernel { 0 } else { -1 };
        let edges = [
            0.0f32,
            -0.0,
            -88.0,
            -103.28,
            -103.97,
            -104.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for edge in edges {
            let bits = edge.to_bits();
            // SAFETY: a pure function of the patched ggml-cpu over a range of
            // bit patterns; it touches no state.
            let mismatches = unsafe { ggml_cpu_exact_expf_mismatches(bits, bits, 1) };
            assert_eq!(mismatches, expected, "expf({edge}) against libm's");
        }
        // SAFETY: as above.
        let mismatches = unsafe { ggml_cpu_exact_expf_mismatches(0x8000_0000, u32::MAX, 3) };
        assert_eq!(mismatches, expected, "non-positive floats that differ");
    }

    #[test]
    fn system_info_names_the_cpu_backend() {
        assert!(system_info().contains("CPU"), "{}", system_info());
    }
}
