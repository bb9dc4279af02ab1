"""The fraction of their peak that tensor cores reach in a training step, read off NVIDIA's
published ResNeXt-101 32x4d throughput: a model that no other check of ``dpkit.cost`` uses.

    .venv/bin/python benchmarks/tensor_core_efficiency.py [--profile-cache PATH]  # ~5 min

NVIDIA's DeepLearningExamples tables (ResNeXt-101 32x4d for PyTorch, pytorch-21.03 NGC
container, batch sizes from the repository's ``configs.yml``; the rows ``rnx101_*`` of
``benchmarks/published_measurements.py``, with their quotes) give one GPU's training
throughput in each precision: A100 80GB TF32 456 img/s (batch 128) and AMP 1211 (128); V100
16GB FP32 147 (64) and AMP 587 (128). For each, this script finds the fraction ``e`` of the
unit's peak at which ``dpkit.cost`` predicts exactly that throughput (bisection on
``tensor_core_efficiency={unit: e}``, or ``matmul_efficiency`` for the CUDA cores), the step
being forward + backward (``step_time``) plus the SGD-with-momentum step that
``cost_published.py`` estimates. The presets take the tensor-core fractions
(``dpkit/cost/catalog.py``, [dle-rnx101]); ResNet-50's rows in ``cost_published.py`` then
check them on a model they were not read from.

Why not a matmul microbenchmark: a large GEMM reaches 80-90 % of a tensor core's peak, the
convolutions of a ResNet under half of it (small channel counts, 1x1 and strided layers,
layout changes): a step's achieved fraction is what the model needs, and it depends on the
kind of network. These fractions are for convolutional networks; a transformer's large
matmuls reach more.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from cost_published import optimizer_seconds, prepared  # noqa: E402
from published_measurements import MEASUREMENTS  # noqa: E402
from published_models import resnext101_32x4d  # noqa: E402

import dpkit.cost as cost  # noqa: E402
from dpkit.cost import Hardware  # noqa: E402
from dpkit.cost.profiling import Profile  # noqa: E402

RESULTS = HERE / "results"
PRESETS = {"a100": "8xA100-SXM-NVLink", "v100": "8xV100-NVLink"}
UNITS = {"tf32": ("tfloat32", None), "amp": ("float16", torch.float16), "fp32": ("float32", None)}
ROWS = [m for m in MEASUREMENTS if m.key.startswith("rnx101_")]


def profiles(cache: Path | None) -> dict[str, Profile]:
    """ResNeXt-101's profile in float32 and under float16 autocast (cached in ``cache``)."""
    key = f"torch {torch.__version__}, resnext101_32x4d"
    if cache is not None and cache.exists():
        stored = pickle.loads(cache.read_bytes())
        if stored.get("key") == key:
            return stored["profiles"]
    torch.manual_seed(0)
    model, image = resnext101_32x4d(), torch.randn(1, 3, 224, 224)
    found = {}
    for name, amp in (("fp32", None), ("fp16", torch.float16)):
        started = time.perf_counter()
        found[name] = cost.profile(model, image, amp=amp)
        print(f"profiled {name} in {time.perf_counter() - started:.0f} s", flush=True)
    if cache is not None:
        cache.write_bytes(pickle.dumps({"key": key, "profiles": found}))
    return found


_STAND_IN = torch.nn.Identity()  # what cost.predict is given; prepared() swaps in the profile


def throughput(model: Profile, hardware: Hardware, batch: int) -> float:
    """Predicted img/s of one GPU: forward + backward, plus the optimizer's step estimate."""
    with prepared({(id(_STAND_IN), None): model}):
        seconds = cost.predict(_STAND_IN, torch.zeros(1), batch, 1, hardware).step_time
    return batch / (seconds + optimizer_seconds(hardware, model, "sgd_momentum"))


def with_efficiency(hardware: Hardware, unit: str, fraction: float) -> Hardware:
    if unit == "float32":
        return dataclasses.replace(hardware, matmul_efficiency=fraction)
    return dataclasses.replace(
        hardware, tensor_core_efficiency={**hardware.tensor_core_efficiency, unit: fraction}
    )


def implied(model: Profile, hardware: Hardware, unit: str, batch: int, published: float) -> float:
    """The fraction at which the predicted throughput is the published one (bisection: the
    throughput grows with the fraction); 1.0 if even the full peak is too slow."""
    low, high = 1e-3, 1.0
    if throughput(model, with_efficiency(hardware, unit, high), batch) < published:
        return high
    for _ in range(40):
        middle = (low + high) / 2
        if throughput(model, with_efficiency(hardware, unit, middle), batch) < published:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile-cache", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    found = profiles(args.profile_cache)
    result = {}
    for row in ROWS:
        _, gpu, _, precision = row.key.split("_")
        unit, amp = UNITS[precision]
        name, batch = PRESETS[gpu], row.conditions["batch_per_gpu"]
        model = found["fp16" if amp is not None else "fp32"]
        fraction = implied(model, cost.preset(name), unit, batch, row.value)
        result[row.key] = {
            "preset": name, "unit": unit, "batch": batch, "published img/s": row.value,
            "implied fraction of peak": round(fraction, 3), "source": row.url,
        }  # fmt: skip
        print(f"{row.key:22} {unit:9} batch {batch:3}: {row.value:6.0f} img/s -> {fraction:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tensor_core_efficiency.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
