"""Why one FLOP rate per op cannot price this machine's convolutions (issue 27).

    .venv/bin/python -m benchmarks.conv_rates          # from the repository root, ~1 minute

``dpkit.cost.calibrate()`` times each aten op of its probes and prices an op of the model
by its FLOPs on that op's curve (:func:`dpkit.cost.compute.op_time`). This script times
one 3x3 convolution (padding 1) forward and backward at many channel counts and image
sizes, one torch thread, fastest of 7, and sets each beside what the curves of
calibration's probes (no course model, no held-out model) predict for its FLOPs.

glibc is told to keep freed memory (``mallopt``, as ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` would), so that the times are the kernels' and not first
touches of pages handed back between calls (``results/cost_accuracy.md``, the probe
section). Results: ``benchmarks/results/conv_rates.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from benchmarks.machine import machine
from dpkit.cost.calibration import measure_ops, probes
from dpkit.cost.compute import interpolate

RESULTS = Path(__file__).parent / "results" / "conv_rates.json"
# (in channels, out channels, image side, batch): calibration's two probe convolutions at
# two batches, then narrower and wider layers (the held-out deep-cnn's four among them)
SHAPES = [(3, 16, 16, 256), (16, 32, 8, 256), (3, 16, 16, 1024), (16, 32, 8, 1024),
          (1, 4, 28, 1024), (4, 8, 28, 1024), (8, 8, 14, 1024), (8, 12, 14, 1024),
          (1, 8, 28, 256), (8, 16, 14, 256), (1, 32, 28, 256), (3, 64, 32, 64),
          (16, 16, 28, 256), (32, 64, 14, 256), (64, 64, 14, 64)]  # fmt: skip


def keep_freed_memory() -> None:
    """glibc's M_TRIM_THRESHOLD (-1), M_TOP_PAD (-2), M_MMAP_THRESHOLD (-3), as the
    environment variables would set them at start-up."""
    libc = ctypes.CDLL("libc.so.6")
    for option, value in ((-1, 1 << 30), (-2, 1 << 30), (-3, 1 << 30)):
        libc.mallopt(option, value)


def fastest(work: Callable[[], object], repeats: int = 7) -> float:
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def time_conv(cin: int, cout: int, side: int, batch: int) -> dict[str, float]:
    """One convolution's forward and backward seconds, and their FLOPs."""
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, 3, padding=1)
    # an image's 1 or 3 channels come first in a network: no gradient for the input there
    x = torch.randn(batch, cin, side, side, requires_grad=cin > 3)
    wanted = (x, conv.weight, conv.bias) if cin > 3 else (conv.weight, conv.bias)
    grad = torch.randn(batch, cout, side, side)
    forward = fastest(lambda: conv(x))
    both = fastest(lambda: torch.autograd.grad(conv(x), wanted, grad))
    flops = 2 * 9 * cin * cout * side * side * batch
    return {"in": cin, "out": cout, "side": side, "batch": batch,
            "forward_flops": flops, "backward_flops": flops * (2 if cin > 3 else 1),
            "forward_s": forward, "backward_s": both - forward}  # fmt: skip


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    curves = measure_ops(probes(quick=False), (1, 8, 64, 256, 1024), repeats=5)
    rows = []
    for shape in SHAPES:
        row = time_conv(*shape)
        for which, name in (("forward", "aten.convolution"),
                            ("backward", "aten.convolution_backward")):  # fmt: skip
            work, seconds = row[f"{which}_flops"], row[f"{which}_s"]
            row[f"{which}_gflops"] = work / seconds / 1e9
            row[f"{which}_predicted_s"] = interpolate(curves[name], work)
            row[f"{which}_error"] = row[f"{which}_predicted_s"] / seconds - 1
        rows.append(row)
        print(f"{row['in']:3d} -> {row['out']:3d} channels, {row['side']:2d}x{row['side']:<2d} "
              f"x {row['batch']:4d}: forward {row['forward_gflops']:5.1f} GFLOP/s (curve "
              f"{row['forward_error']:+.0%}), backward {row['backward_gflops']:5.1f} (curve "
              f"{row['backward_error']:+.0%})", flush=True)  # fmt: skip
    RESULTS.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
