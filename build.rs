//! specstate's own C++ (`src/native/grammar_guard.cpp`: llama.cpp's grammar calls with every C++ exception caught),
//! and the final-link settings of the `cuda` feature: the pinned sys crate builds ggml's CUDA backend as a static
//! archive and leaves the CUDA libraries it calls to whoever links it; without the feature that part does nothing.

use std::env;
use std::path::PathBuf;

/// Where the wheel's `nvidia-cublas` dependency puts its libraries, relative to the extension module
/// (`site-packages/specstate/_native.abi3.so` → `site-packages/nvidia/cu13/lib`).
const CUBLAS_RPATH: &str = "$ORIGIN/../nvidia/cu13/lib";

/// specstate's own C++ sources, compiled into one static archive linked before the sys crate's.
const GUARD_SOURCE: &str = "src/native/grammar_guard.cpp";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={GUARD_SOURCE}");
    // The sys crate links the C++ runtime (libstdc++, or the toolchain's libc++); the archive only needs it too.
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .cpp_link_stdlib(None)
        .file(GUARD_SOURCE)
        .compile("specstate_grammar_guard");
    println!("cargo:rerun-if-env-changed=CUDAToolkit_ROOT");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    let linux = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() || !linux {
        return;
    }
    let root = env::var_os("CUDAToolkit_ROOT")
        .or_else(|| env::var_os("CUDA_PATH"))
        .map_or_else(|| PathBuf::from("/usr/local/cuda"), PathBuf::from);
    let lib = ["lib64", "lib"]
        .iter()
        .map(|dir| root.join(dir))
        .find(|dir| dir.join("libcudart_static.a").is_file())
        .unwrap_or_else(|| root.join("lib"));
    // Link arguments come after every archive on rustc's command line, so these resolve the references of the
    // ggml-cuda objects even under --as-needed. The runtime is linked statically (NVIDIA's default for nvcc; it
    // loads the driver, libcuda.so.1, only when CUDA is first used); cuBLAS has no static library in the wheels.
    println!("cargo:rustc-link-arg=-L{}", lib.display());
    for arg in [
        "-l:libcudart_static.a",
        "-lcublas",
        "-lcublasLt",
        "-ldl",
        "-lrt",
        "-lpthread",
    ] {
        println!("cargo:rustc-link-arg={arg}");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{CUBLAS_RPATH}");
}
