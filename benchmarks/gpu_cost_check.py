"""The cost model against one real GPU it was never fitted to: step time and memory.

    python3 -m benchmarks.gpu_cost_check --out $OUT          # on a GPU machine, about 1 min
    .venv/bin/python -m benchmarks.gpu_cost_check --rehearse  # tiny sizes on this CPU

For each case (a model, a batch, float32 or bfloat16 autocast) it times training steps on the
GPU (zero_grad, forward, cross-entropy and backward, as ``predict`` defines a step, CUDA
events around each, median of 20 after 5 warm-up steps; SGD with momentum steps untimed
between them, so its state is in the memory) and reads the peak memory one step allocates; then it
asks ``dpkit.cost.predict`` for the same step on a machine built from spec sheets only: the
``8xH100-SXM-NVLink`` preset (an H200 is an H100's chip with HBM3e) with the H200's memory
bandwidth and capacity from NVIDIA's H200 sheet, nothing measured on the machine. It reports
each prediction's error, and the ratios a learner reads (bf16 over float32, a wide model over
a narrow one) measured against predicted. Nothing here is asserted or fitted.

Written to ``--out``: ``gpu_cost_check.json`` (every number) and ``gpu_cost_check.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.machine import machine
from dpkit import cost, models

# NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e, 141 GB; compute as the H100 SXM's (same GH100)
H200_BANDWIDTH = 4.8e12
H200_CAPACITY = 141 * 10**9


def h200() -> cost.Hardware:
    """One H200 from spec sheets: the H100 SXM preset with the H200's memory."""
    return dataclasses.replace(
        cost.preset("8xH100-SXM-NVLink"), name="H200-from-sheets", memory_bandwidth=H200_BANDWIDTH,
        memory_capacity=H200_CAPACITY, description="H100 SXM preset, H200 memory (datasheet)",
    )  # fmt: skip


def mlp(width: int, depth: int = 3, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def convnet(channels: int) -> nn.Module:
    c = channels
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(2 * c, 4 * c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * c * 8 * 8, 10),
    )  # fmt: skip


class Encoder(nn.Module):
    """A transformer encoder over a sequence, mean-pooled to 10 classes."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            width, width // 64, 4 * width, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


# name -> (builder, one row of input, batch); rehearsal sizes after the bar
Case = tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], int]
CASES: dict[str, Case] = {
    "mlp-4096x3 b4096": (lambda: mlp(4096), lambda: torch.randn(1, 4096), 4096),
    "mlp-1024x3 b1024": (lambda: mlp(1024), lambda: torch.randn(1, 1024), 1024),
    "mlp-256x3 b256": (lambda: mlp(256), lambda: torch.randn(1, 256), 256),
    "convnet-64 b256": (lambda: convnet(64), lambda: torch.randn(1, 3, 32, 32), 256),
    "encoder-1024x4 b32": (lambda: Encoder(1024, 4), lambda: torch.randn(1, 256, 1024), 32),
    "course-transformer b256": (
        lambda: models.build_model("transformer", seed=0),
        models.sample_input,
        256,
    ),
}
REHEARSAL: dict[str, Case] = {
    "mlp-64x3 b64": (lambda: mlp(64), lambda: torch.randn(1, 64), 64),
    "convnet-4 b8": (lambda: convnet(4), lambda: torch.randn(1, 3, 32, 32), 8),
    "encoder-128x1 b4": (lambda: Encoder(128, 1), lambda: torch.randn(1, 16, 128), 4),
}
AMP = {"float32": None, "bf16": torch.bfloat16}


def measure(model: nn.Module, row: torch.Tensor, batch: int, amp: torch.dtype | None,
            device: torch.device, steps: int) -> dict[str, Any]:  # fmt: skip
    """Median step seconds (with quartiles) and the peak bytes one step allocates."""
    model = model.to(device)
    inputs = row.expand(batch, *row.shape[1:]).contiguous().to(device)
    labels = torch.randint(0, 10, (batch,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:  # what predict() calls a step: forward and backward
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()

    gpu = device.type == "cuda"
    for _ in range(5):
        step()
        optimizer.step()
    times = []
    for _ in range(steps):
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
            optimizer.step()  # untimed: its state (momentum) is in the memory, not the time
        else:
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
            optimizer.step()
    peak = None
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(device)
    q = statistics.quantiles(times, n=4)
    return {"step_s": statistics.median(times), "q1": q[0], "q3": q[2], "peak_bytes": peak}


def predicted(model: nn.Module, row: torch.Tensor, batch: int, amp: torch.dtype | None,
              hardware: cost.Hardware) -> dict[str, Any]:  # fmt: skip
    trace = cost.predict(model, row, batch, 1, hardware, "dp", amp=amp, optimizer="momentum")
    held = {k: int(v) for k, v in trace.held[0].items()}
    return {"step_s": trace.step_time, "bytes": trace.memory_per_device[0], "held": held}


def probe(device: torch.device) -> dict[str, float]:
    """What the model's GPU terms rest on, measured before anything else uses the GPU: the
    memory torch's first matmuls allocate beyond their tensors (cuBLAS workspaces), and the
    host's seconds per op when ops are too small to keep the GPU busy."""
    found: dict[str, float] = {}
    if device.type != "cuda":
        return found
    a = torch.randn(64, 64, device=device)
    tensors = torch.cuda.memory_allocated(device)
    b = a.mm(a)
    found["workspace_after_float32_mm"] = torch.cuda.memory_allocated(device) - tensors - b.nbytes
    with torch.autocast("cuda", dtype=torch.bfloat16):
        c = a.mm(a)
    found["workspace_after_bf16_mm"] = (
        torch.cuda.memory_allocated(device) - tensors - b.nbytes - c.nbytes - a.nbytes // 2
    )
    w = torch.randn(64, 64, device=device, requires_grad=True)
    a.mm(w).sum().backward()
    torch.cuda.synchronize()
    found["allocated_after_backward"] = torch.cuda.memory_allocated(device)
    tiny = torch.zeros(4, device=device)
    linear = nn.Linear(64, 64).to(device)
    for name, op, count in (("add_", lambda: tiny.add_(1), 2000),
                            ("linear", lambda: linear(a), 2000)):  # fmt: skip
        for _ in range(100):
            op()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            op()
        end.record()
        end.synchronize()
        found[f"seconds_per_{name}"] = start.elapsed_time(end) / 1e3 / count
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/gpu_cost_check"))
    parser.add_argument("--rehearse", action="store_true", help="tiny cases on the CPU")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.rehearse
    device = torch.device("cuda" if gpu else "cpu")
    cases, steps = (CASES, 20) if gpu else (REHEARSAL, 3)
    hardware = h200()
    rows: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    probed = probe(device)
    print(json.dumps(probed), flush=True)
    for name, (build, sample, batch) in cases.items():
        for precision, amp in AMP.items():
            row: dict[str, Any] = {"case": name, "precision": precision, "batch": batch}
            try:
                torch.manual_seed(0)
                model, one = build(), sample()
                row["predicted"] = predicted(model, one, batch, amp, hardware)
                row["measured"] = measure(model, one, batch, amp, device, steps)
                row["time_error"] = row["predicted"]["step_s"] / row["measured"]["step_s"] - 1
                if row["measured"]["peak_bytes"]:
                    peak = row["measured"]["peak_bytes"]
                    row["memory_error"] = row["predicted"]["bytes"] / peak - 1
            except Exception:  # noqa: BLE001 - a case that fails is reported, the rest run
                row["error"] = traceback.format_exc(limit=3)
            rows.append(row)
            print(line(row), flush=True)
            if gpu:
                torch.cuda.empty_cache()
    result = {
        "machine": machine(gpu=torch.cuda.get_device_name() if gpu else None,
                           float32_matmul_precision=torch.get_float32_matmul_precision(),
                           cudnn_allow_tf32=torch.backends.cudnn.allow_tf32),
        "hardware": {"name": hardware.name, "description": hardware.description},
        "probe": probed, "rows": rows, "ratios": ratios(rows),
    }  # fmt: skip
    (args.out / "gpu_cost_check.json").write_text(json.dumps(result, indent=1))
    text = "\n".join([line(r) for r in rows] + [""] + result["ratios"])
    (args.out / "gpu_cost_check.txt").write_text(text + "\n")
    print("\n".join(result["ratios"]))
    return 0


def line(row: dict[str, Any]) -> str:
    head = f"{row['case']:<24} {row['precision']:<8}"
    if "error" in row:
        return f"{head} ERROR {row['error'].strip().splitlines()[-1]}"
    m, p = row["measured"], row["predicted"]
    memory = ""
    if m["peak_bytes"]:
        memory = (f"  memory {m['peak_bytes'] / 2**20:9.1f} MiB measured, "
                  f"{p['bytes'] / 2**20:9.1f} predicted ({row['memory_error']:+.0%})")  # fmt: skip
    return (f"{head} step {m['step_s'] * 1e3:8.3f} ms measured (q1-q3 {m['q1'] * 1e3:.3f}-"
            f"{m['q3'] * 1e3:.3f}), {p['step_s'] * 1e3:8.3f} predicted ({row['time_error']:+.0%})"
            + memory)  # fmt: skip


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """bf16 over float32 per case, measured against predicted."""
    found = {(r["case"], r["precision"]): r for r in rows if "error" not in r}
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        pair = found.get((case, "float32")), found.get((case, "bf16"))
        if all(pair):
            m = pair[0]["measured"]["step_s"] / pair[1]["measured"]["step_s"]
            p = pair[0]["predicted"]["step_s"] / pair[1]["predicted"]["step_s"]
            out.append(f"bf16 speed-up {case:<24} measured {m:6.2f}x, predicted {p:6.2f}x "
                       f"({p / m - 1:+.0%})")  # fmt: skip
    return out


if __name__ == "__main__":
    raise SystemExit(main())
