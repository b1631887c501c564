"""The device check of the CUDA wheel, run by ``scripts/gpu-check.sh``: exactness, resume and speed on a GPU.

Builds the tests' tiny models (every mode) and a SmolLM2-135M-shaped llama model with random Q4_1 weights
(30 layers, n_embd 576, 9 heads, 3 KV heads, n_ff 1536, vocabulary 49152; the real file is too large to travel)
and writes one JSON file:

* ``native_info``: the build and the devices llama.cpp sees;
* ``exactness``: per mode, tokens of the offloaded model against plain greedy decoding (the tests' rule:
  equal up to a near-tie), acceptance;
* ``resume``: per mode, a checkpoint taken on the GPU restored on the GPU (token for token against an
  uninterrupted run) and on the CPU (restores and runs; whether its tokens are equal is recorded);
* ``speed``: plain decode tokens/s, the time to verify 1, 2, 4, 8, 16 rows, and ``none`` against ``ngram``
  (8 tokens a round, and the adaptive policy with its cost curve) and ``draft`` (the draft is the target
  itself), greedy and with seeded sampling, with the acceptance rates
  (a random-weight model repeats itself, so acceptance is high: the figures are near speculation's upper bound).

A mode that fails on the device is recorded with its error and the rest goes on. ``--dry-run`` shrinks the
sizes so that the same steps finish in a minute or two on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import gguf
import numpy as np

import specstate
from specstate import Context, Generator, Model
from specstate.generator import Mode
from specstate_testkit import models
from specstate_testkit.generator_support import MODES, TINY_CTX, sampling
from specstate_testkit.reference import agreement, plain_greedy

SMOLLM2_SHAPE = {"n_layer": 30, "n_embd": 576, "n_head": 9, "n_head_kv": 3, "n_ff": 1536, "n_vocab": 49152}
DRY_SHAPE = {"n_layer": 4, "n_embd": 128, "n_head": 4, "n_head_kv": 2, "n_ff": 256, "n_vocab": 2048}
VERIFY_ROWS = (1, 2, 4, 8, 16)


def guarded(step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one step; an exception becomes an ``error`` entry instead of ending the check."""
    try:
        return step()
    except Exception as error:
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"}


# --- models -------------------------------------------------------------------------------------------------------


def tiny_models(directory: Path) -> dict[str, Path]:
    llama, eagle3 = models.build_eagle3_pair(directory / "llama.gguf", directory / "eagle3.gguf", seed=0)
    qwen35 = models.build_qwen35_mtp(directory / "qwen35.gguf", seed=0)
    return {"qwen35": qwen35, "llama": llama, "eagle3_draft": eagle3}


def _quantized(writer: gguf.GGUFWriter, name: str, array: np.ndarray) -> None:
    writer.add_tensor(
        name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q4_1), raw_dtype=gguf.GGMLQuantizationType.Q4_1
    )


def _smollm2_metadata(writer: gguf.GGUFWriter, shape: dict[str, int]) -> None:
    arch = "llama"
    writer.add_context_length(8192)
    writer.add_embedding_length(shape["n_embd"])
    writer.add_block_count(shape["n_layer"])
    writer.add_feed_forward_length(shape["n_ff"])
    writer.add_head_count(shape["n_head"])
    writer.add_head_count_kv(shape["n_head_kv"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)
    writer.add_rope_dimension_count(shape["n_embd"] // shape["n_head"])
    writer.add_uint32(f"{arch}.vocab_size", shape["n_vocab"])
    vocab = models.VOCAB
    filler = [f"<|unused{i}|>" for i in range(shape["n_vocab"] - len(vocab.tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([*vocab.tokens, *filler])
    writer.add_token_types([*vocab.token_types, *[int(gguf.TokenType.UNUSED)] * len(filler)])
    writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(False)


def smollm2_shaped(path: Path, shape: dict[str, int]) -> Path:
    """A llama model of SmolLM2-135M's shapes with random Q4_1 weights (tied output, like SmolLM2)."""
    rng = np.random.default_rng(0)
    embd, n_ff, head_dim = shape["n_embd"], shape["n_ff"], shape["n_embd"] // shape["n_head"]
    kv = head_dim * shape["n_head_kv"]

    def dense(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    with models.gguf_writer(path, "llama") as writer:
        _smollm2_metadata(writer, shape)
        _quantized(writer, "token_embd.weight", dense(shape["n_vocab"], embd) * 4)
        writer.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
        for il in range(shape["n_layer"]):
            writer.add_tensor(f"blk.{il}.attn_norm.weight", np.ones(embd, dtype=np.float32))
            writer.add_tensor(f"blk.{il}.ffn_norm.weight", np.ones(embd, dtype=np.float32))
            for name, n_out, n_in in (
                ("attn_q", embd, embd),
                ("attn_k", kv, embd),
                ("attn_v", kv, embd),
                ("attn_output", embd, embd),
                ("ffn_gate", n_ff, embd),
                ("ffn_up", n_ff, embd),
                ("ffn_down", embd, n_ff),
            ):
                _quantized(writer, f"blk.{il}.{name}.weight", dense(n_out, n_in))
    return path


# --- exactness and resume -----------------------------------------------------------------------------------------


class Tiny:
    """The tiny models, loaded with ``n_gpu_layers`` (cached: loading is the slow part)."""

    def __init__(self, paths: dict[str, Path], n_gpu_layers: int) -> None:
        self.paths, self.n_gpu_layers = paths, n_gpu_layers
        self._loaded: dict[tuple[str, int], Model] = {}

    def model(self, name: str, n_gpu_layers: int | None = None) -> Model:
        layers = self.n_gpu_layers if n_gpu_layers is None else n_gpu_layers
        if (name, layers) not in self._loaded:
            self._loaded[name, layers] = Model(self.paths[name], n_gpu_layers=layers)
        return self._loaded[name, layers]

    def draft(self, mode: str, n_gpu_layers: int | None = None) -> Model | None:
        name = {"draft": "llama", "eagle3": "eagle3_draft"}.get(mode)
        return None if name is None else self.model(name, n_gpu_layers)

    def generator(self, mode: str, sampled: bool = False) -> Generator:
        return Generator(
            self.model("qwen35"),
            mode=cast(Mode, mode),
            draft_model=self.draft(mode),
            n_ctx=TINY_CTX,
            n_batch=64,
            n_draft=4,
            n_threads=1,
            **sampling(sampled),
        )


def exactness(tiny: Tiny, mode: str) -> dict[str, Any]:
    generator = tiny.generator(mode)
    prompt = generator.model.tokenize("the same tokens, whatever the mode")
    generator.generate(prompt, max_tokens=100)
    plain, gaps = plain_greedy(generator.model, prompt, 100, n_ctx=TINY_CTX, n_rs_seq=0)
    agreed = agreement(generator.tokens, plain, gaps)  # raises on a parting that is not at a near-tie
    return {"agree": agreed, "of": 100, "drafted": generator.drafted, "accepted": generator.accepted, "ok": True}


def resume(tiny: Tiny, mode: str) -> dict[str, Any]:
    sampled = mode in ("ngram", "mtp")  # one sampled and one greedy case per kind of drafter, as the tests do
    prompt = tiny.model("qwen35").tokenize("another process")
    uninterrupted = tiny.generator(mode, sampled)
    uninterrupted.generate(prompt, max_tokens=80)
    first = tiny.generator(mode, sampled)
    first.generate(prompt, max_tokens=30)
    saved = first.checkpoint()
    on_gpu = Generator.restore(saved, tiny.model("qwen35"), draft_model=tiny.draft(mode), n_threads=1)
    on_gpu.generate(max_tokens=80 - len(on_gpu.tokens))
    on_cpu = Generator.restore(saved, tiny.model("qwen35", 0), draft_model=tiny.draft(mode, 0), n_threads=1)
    on_cpu.generate(max_tokens=80 - len(on_cpu.tokens))
    return {
        "sampled": sampled,
        "checkpoint_bytes": len(saved),
        "gpu_restore_equal": on_gpu.tokens == uninterrupted.tokens,
        "cpu_restore_runs": len(on_cpu.tokens) == 80,
        "cpu_restore_equal": on_cpu.tokens == uninterrupted.tokens,
        "ok": on_gpu.tokens == uninterrupted.tokens and len(on_cpu.tokens) == 80,
    }


# --- speed --------------------------------------------------------------------------------------------------------


def timed_decode(model: Model, n_threads: int) -> Callable[[int], float]:
    """Seconds to decode k rows (all logits, argmax) after a 64-token prefix, rolled back after each."""
    context = Context(model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=n_threads)
    prefix = [(7 * i) % 200 + 1 for i in range(64)]
    context.decode(prefix, 0)

    def decode(rows: int) -> float:
        start = time.perf_counter()
        context.decode(prefix[:rows], len(prefix), all_logits=True)
        context.argmax()
        elapsed = time.perf_counter() - start
        context.seq_rm(0, len(prefix), -1)
        return elapsed

    return decode


def verify_costs(model: Model, n_threads: int, repeats: int) -> dict[str, float]:
    """Median milliseconds to decode k rows, the same k repeated."""
    decode = timed_decode(model, n_threads)
    costs: dict[str, float] = {}
    for rows in VERIFY_ROWS:
        times = [decode(rows) for _ in range(repeats + 2)][2:]  # two warm-up decodes (CUDA graphs, kernels loaded)
        costs[str(rows)] = round(statistics.median(times) * 1000, 3)
    return costs


def verify_costs_between_plain(model: Model, n_threads: int, repeats: int) -> dict[str, float]:
    """As :func:`verify_costs`, but each batch between two one-row decodes, as a draft comes between plain rounds:
    the median of its time plus the one-row decode after it less the one before."""
    decode = timed_decode(model, n_threads)
    costs: dict[str, float] = {}
    for rows in VERIFY_ROWS:
        samples = []
        for _ in range(repeats + 2):
            before, own, after = decode(1), decode(rows), decode(1)
            samples.append(own + after - before)
        costs[str(rows)] = round(statistics.median(samples[2:]) * 1000, 3)
    return costs


def mode_speeds(
    model: Model, draft: Model, n_threads: int, n_tokens: int, repeats: int, sampled: bool
) -> dict[str, Any]:
    """Best-of-``repeats`` tokens/s after the first token of ``none``, ``ngram`` (``n_draft`` 8, and the adaptive
    policy up to 16) and ``draft`` (the same file, loaded again)."""
    prompt = [(3 * i) % 250 + 1 for i in range(48)] * 3  # repeats itself: prompt lookup has something to find
    modes: dict[str, Any] = {}
    settings: dict[str, dict[str, Any]] = {
        "none": {"mode": "none"},
        "ngram": {"mode": "ngram"},
        "ngram adaptive": {"mode": "ngram", "n_draft": 16, "draft_policy": "adaptive"},
        "draft": {"mode": "draft", "draft_model": draft},
    }
    for mode, chosen in settings.items():
        runs = []
        for _ in range(repeats):
            generator = Generator(model, n_ctx=1024, n_threads=n_threads, **chosen, **sampling(sampled))
            generator.generate(prompt, max_tokens=1)  # the prefill (and the adaptive policy's curve) untimed
            started = time.perf_counter()
            generator.generate(max_tokens=n_tokens - 1)
            speed = (len(generator.tokens) - 1) / (time.perf_counter() - started)
            runs.append((speed, generator.acceptance_rate, generator.tokens))
        best = max(runs, key=lambda run: run[0])
        modes[mode] = {"tokens_per_second": round(best[0], 2), "acceptance": round(best[1], 3), "tokens": best[2]}
        if generator.cost_curve is not None:
            modes[mode]["cost_curve_us"] = generator.cost_curve
    for mode in ("ngram", "ngram adaptive", "draft"):
        modes[mode]["speedup_over_none"] = round(
            modes[mode]["tokens_per_second"] / modes["none"]["tokens_per_second"], 3
        )
        modes[mode]["same_tokens_as_none"] = modes[mode]["tokens"] == modes["none"]["tokens"]
        modes[mode]["first_tokens_equal_to_none"] = next(
            (i for i, (a, b) in enumerate(zip(modes[mode]["tokens"], modes["none"]["tokens"])) if a != b),
            min(len(modes[mode]["tokens"]), len(modes["none"]["tokens"])),
        )
    for row in modes.values():
        del row["tokens"]
    return modes


def speed(path: Path, n_gpu_layers: int, n_threads: int, n_tokens: int, repeats: int) -> dict[str, Any]:
    """Decode, verification cost by rows, and the modes greedy and sampled."""
    model, draft = Model(path, n_gpu_layers=n_gpu_layers), Model(path, n_gpu_layers=n_gpu_layers)
    greedy = mode_speeds(model, draft, n_threads, n_tokens, repeats, sampled=False)
    return {
        "decode_tokens_per_second": greedy["none"]["tokens_per_second"],
        "verify_ms_by_rows": verify_costs(model, n_threads, repeats=max(5, 4 * repeats)),
        "verify_ms_between_plain_by_rows": verify_costs_between_plain(model, n_threads, repeats=max(5, 4 * repeats)),
        "modes_greedy": greedy,
        "modes_sampled": mode_speeds(model, draft, n_threads, n_tokens, repeats, sampled=True),
    }


# --- main ---------------------------------------------------------------------------------------------------------


def write(path: Path, results: dict[str, Any]) -> None:
    """The results so far: written after every part, so that a check stopped at its time limit still reports."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="where the results go")
    parser.add_argument("--gpu-layers", type=int, default=-1, help="n_gpu_layers of every model (-1: all)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--dry-run", action="store_true", help="small speed model and runs (a CPU check)")
    args = parser.parse_args()
    started = time.perf_counter()
    info = specstate.native_info()
    print(json.dumps({key: info[key] for key in ("backends", "devices")}, indent=1), flush=True)
    results: dict[str, Any] = {"native_info": info, "n_gpu_layers": args.gpu_layers, "dry_run": args.dry_run}
    with tempfile.TemporaryDirectory() as folder:
        tiny = Tiny(tiny_models(Path(folder)), args.gpu_layers)
        results["exactness"] = {mode: guarded(lambda mode=mode: exactness(tiny, mode)) for mode in MODES}
        print("exactness", json.dumps(results["exactness"]), flush=True)
        write(args.json, results)
        results["resume"] = {mode: guarded(lambda mode=mode: resume(tiny, mode)) for mode in MODES}
        print("resume", json.dumps(results["resume"]), flush=True)
        write(args.json, results)
        shape = DRY_SHAPE if args.dry_run else SMOLLM2_SHAPE
        built = time.perf_counter()
        path = smollm2_shaped(Path(folder) / "smollm2-shaped.gguf", shape)
        results["speed_model"] = {**shape, "type": "Q4_1", "seconds_to_build": round(time.perf_counter() - built, 1)}
        n_tokens, repeats = (64, 1) if args.dry_run else (256, 3)
        results["speed"] = guarded(lambda: speed(path, args.gpu_layers, args.threads, n_tokens, repeats))
        print("speed", json.dumps(results["speed"]), flush=True)
    results["seconds"] = round(time.perf_counter() - started, 1)
    failed = [
        f"{part} {mode}" for part in ("exactness", "resume") for mode, row in results[part].items() if not row.get("ok")
    ]
    results["failed"] = failed + (["speed"] if "error" in results["speed"] else [])
    write(args.json, results)
    print(f"wrote {args.json}; failed: {results['failed'] or 'nothing'}; {results['seconds']} s")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
