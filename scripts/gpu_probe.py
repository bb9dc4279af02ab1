"""Probes for suspected bugs in dpkit's CUDA paths, on virtual lanes of one GPU.

    PYTHONPATH=$PWD python scripts/gpu_probe.py [CHECK ...]     # writes $OUT/probe.json

Each check prints one line: OK, CONFIRMED (the suspected bug shows up), NOTE, or FAIL/ERROR;
a check that raises is reported as ERROR and the next one runs. The exit status is 0 when the
probe ran to the end, whatever the checks found: ``scripts/gpu_check.py`` reads probe.json.
Copied, trimmed, from ``shared/tools/gpu_probe.py`` (written outside the project): its timing
and demo checks are the gpu_check's benchmark and demo stages. Needs CUDA; under a minute.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
import warnings
from pathlib import Path

import torch
from torch import nn

import dpkit

# The stalling modules the GPU tests use (tests/stalls.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from stalls import STALL_CYCLES  # noqa: E402

OUT = os.environ.get("OUT") or "build/gpu_check/probe"
RESULTS: dict = {}
CHECKS = []


def report(name, status, detail=""):
    RESULTS[name] = {"status": status, "detail": detail}
    print(f"[{status}] {name}: {detail}", flush=True)


def check(fn):
    CHECKS.append(fn)
    return fn


def run(fn):
    try:
        fn()
    except Exception as error:  # noqa: BLE001 - a probe reports, never stops
        first = (str(error).splitlines() or [""])[0]
        report(fn.__name__, "ERROR", f"{type(error).__name__}: {first}")
        traceback.print_exc()


@check
def cpu_tensor_in_replica_output():
    """parallel_apply once called record_stream on every output tensor, CPU ones too."""
    lanes = dpkit.virtual_devices(2, on="cuda")

    class CpuExtra(nn.Module):
        def forward(self, x):
            return x * 2, torch.tensor(float(x.shape[0]))  # a CPU scalar

    replicas = dpkit.replicate(CpuExtra().cuda(), lanes, detach=True)
    chunks = dpkit.scatter(torch.randn(4, 3, device="cuda"), lanes)
    try:
        dpkit.parallel_apply(replicas, chunks, devices=lanes)
    except NotImplementedError as error:
        report("cpu_tensor_in_replica_output", "CONFIRMED", str(error).splitlines()[0][:120])
        return
    report("cpu_tensor_in_replica_output", "OK", "no error (record_stream skipped CPU tensors)")


@check
def lane_copy_without_record_stream_can_be_reused():
    """Synthetic: a lane-1 scatter copy (allocated on the caller's stream) used on the lane's
    stream, freed before that use ran, then reallocated on the caller's stream."""
    from dpkit.devices import stream_of  # internal: imported here so a rename fails one check

    lanes = dpkit.virtual_devices(2, on="cuda")
    x = torch.randn(1 << 20, device="cuda")
    chunks = dpkit.scatter(x, lanes)
    expected = chunks[1].clone()
    lane = stream_of(lanes[1])
    lane.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(lane):
        torch.cuda._sleep(5 * STALL_CYCLES)
        out = chunks[1] * 1
    del chunks
    junk = torch.full((1 << 19,), 7.0, device="cuda")  # likely reuses the freed block
    torch.cuda.synchronize()
    same = torch.equal(out, expected)
    report(
        "lane_copy_without_record_stream_can_be_reused",
        "OK" if same else "CONFIRMED",
        "lane read intact" if same else "lane read the caller's later write (use after free)",
    )
    del junk


@check
def hook_only_tracing_leaves_nan_and_pending():
    from dpkit.tracing import clock

    pending = clock._pending  # the CUDA events a trace would resolve
    lanes = dpkit.virtual_devices(2, on="cuda")
    model = nn.Linear(64, 64).cuda()
    seen = []
    before = len(pending)
    handle = dpkit.register_phase_hook(seen.append)
    for _ in range(3):
        dpkit.DataParallel(model, device_ids=lanes)(torch.randn(32, 64, device="cuda"))
    handle.remove()
    nan = sum(math.isnan(e.start) for e in seen)
    grew = len(pending) - before
    status = "CONFIRMED" if nan or grew else "OK"
    detail = f"{nan}/{len(seen)} events NaN in hooks; _pending grew by {grew}"
    report("hook_only_tracing_leaves_nan_and_pending", status, detail)
    pending.clear()


@check
def accumulate_grad_or_stream_warnings():
    lanes = dpkit.virtual_devices(4, on="cuda")
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU()).cuda()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            x = torch.randn(64, 64, device="cuda")
            dpkit.DataParallel(model, device_ids=lanes)(x).sum().backward()
    torch.cuda.synchronize()
    texts = sorted({str(w.message)[:100] for w in caught})
    report("accumulate_grad_or_stream_warnings", "OK" if not texts else "NOTE", str(texts))


def main(only: list[str]) -> int:
    print(
        sys.version.split()[0],
        torch.__version__,
        torch.cuda.is_available() and torch.cuda.get_device_name(0),
        torch.cuda.device_count(),
        flush=True,
    )
    if not torch.cuda.is_available():
        print("no GPU: the probe needs CUDA; nothing ran")
        return 0
    os.makedirs(OUT, exist_ok=True)
    for fn in CHECKS:
        if not only or fn.__name__ in only:
            run(fn)
            with open(os.path.join(OUT, "probe.json"), "w") as handle:  # after every check
                json.dump(RESULTS, handle, indent=1, default=str)
    print("wrote", os.path.join(OUT, "probe.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
