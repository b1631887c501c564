"""What specstate's tests, benchmarks and scripts share: tiny GGUF model builders and helpers over them.

Not part of the specstate package (maturin packages ``python/specstate`` only); importable wherever specstate is
installed for development (``make develop``: maturin's editable install puts ``python/`` on the path, for worker
subprocesses and Ray workers too). ``scripts/gpu-check.sh`` carries it to a machine that has only the wheel.

* :mod:`~specstate_testkit.models` -- deterministic tiny llama, qwen35 (MTP) and EAGLE-3 models.
* :mod:`~specstate_testkit.gguf_files` -- the GGUF writer the builders share.
* :mod:`~specstate_testkit.smollm2_draft` -- a layer-truncated SmolLM2 as a draft model.
* :mod:`~specstate_testkit.requantize` -- SmolLM2 requantized to other weight types.
* :mod:`~specstate_testkit.generator_support` -- generators of every mode over the tiny models.
* :mod:`~specstate_testkit.reference` -- plain greedy reference runs, near-tie checks, thread checks.
* :mod:`~specstate_testkit.gemma3` -- Gemma 3 270M from its PyPI chunk wheels (a real GGUF without a chat template).
"""
