"""Size and speed of manytask's wire format against safetensors on the same arrays (docs/robustness.md).

    .venv/bin/python scripts/compare_wire_formats.py
"""

import json
import time
from collections.abc import Callable

import numpy as np
from safetensors.numpy import load, save

from manytask.messages import Message, decode, encode

SCALARS = {"n/digit": 12, "loss/digit": 0.5}


def seconds(run: Callable[[], object], repeat: int) -> float:
    run()
    began = time.perf_counter()
    for _ in range(repeat):
        run()
    return (time.perf_counter() - began) / repeat


def as_safetensors(arrays: dict[str, np.ndarray]) -> bytes:
    packed = {k: np.packbits(v) if v.dtype == np.bool_ else v for k, v in arrays.items()}
    return save(packed, metadata={k: json.dumps(v) for k, v in SCALARS.items()})


def main() -> None:
    rng = np.random.default_rng(0)
    shapes = [(64, 64), (64,), (10, 64), (10,), (2, 64), (2,), (10, 64), (10,), (3, 64), (3,)]
    cases = {
        "MLP [64] reply (10 arrays)": ({f"layer{i}": rng.standard_normal(s).astype(np.float32)
                                        for i, s in enumerate(shapes)}, 2000),
        "10 M float32 + 10 M-entry mask": ({"weight": rng.standard_normal(10_000_000).astype(np.float32),
                                            "mask": rng.random(10_000_000) > 0.5}, 5),
    }
    for name, (arrays, repeat) in cases.items():
        compare(name, arrays, repeat)


def compare(name: str, arrays: dict[str, np.ndarray], repeat: int) -> None:
    ours, theirs = encode(Message(arrays, SCALARS)), as_safetensors(arrays)
    replies = iter([encode(Message(arrays, {**SCALARS, "loss/digit": float(i)})) for i in range(repeat + 1)])
    print(f"{name}: bytes {len(ours)} (ours) {len(theirs)} (safetensors)")
    print(f"  encode {seconds(lambda: encode(Message(arrays, SCALARS)), repeat) * 1e6:.0f} us (ours) "
          f"{seconds(lambda: as_safetensors(arrays), repeat) * 1e6:.0f} us (safetensors)")
    print(f"  decode {seconds(lambda: decode(next(replies)), repeat) * 1e6:.0f} us (ours, new header) "
          f"{seconds(lambda: decode(ours), repeat) * 1e6:.0f} us (ours, repeated header) "
          f"{seconds(lambda: load(theirs), repeat) * 1e6:.0f} us (safetensors, mask still packed)")

if __name__ == "__main__":
    main()
