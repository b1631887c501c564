"""``python -m specstate``: describe the native build and show the seed contract at work."""

from __future__ import annotations

import specstate


def main() -> None:
    """Print the native build's description and a few validator verdicts."""
    info = specstate.native_info()
    print(f"specstate {info['specstate_version']} over llama-cpp-sys-4 {info['llama_cpp_sys_version']} "
          f"(llama.cpp {info['llama_cpp_build']}, {info['llama_cpp_commit']})")
    print(f"backends: {', '.join(info['backends'])}; CPU baseline {info['cpu_baseline']} "
          f"({', '.join(info['simd_features'])})")
    print(f"llama.cpp: {info['system_info']}")
    print()
    print("seed contract:")
    examples: list[tuple[str, tuple[object, ...]]] = [
        ("validate_config", (1, 3, 0, 0.0)),
        ("validate_config", (1, 5000, 0, 0.0)),
        ("validate_config", (1, 3, 0, float("nan"))),
        ("validate_state_size", (2**70,)),
    ]
    for name, args in examples:
        call = f"{name}{args}"
        try:
            getattr(specstate, name)(*args)
        except (specstate.ConfigError, specstate.SpeculativeStateError) as error:
            print(f"  {call} -> {type(error).__name__}: {error}")
        else:
            print(f"  {call} -> ok")


if __name__ == "__main__":
    main()
