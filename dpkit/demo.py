"""``dpkit demo``: a few traced DataParallel training steps: a summary per phase and per
device's memory, a timeline, a memory figure and a Chrome trace.

The surprise first: on a machine without a GPU the demo still splits the batch for real,
across virtual lanes on the CPU (a thread and real tensor copies each); the output says
so, and so does every figure. The data are random MNIST-shaped images (1x28x28) with
random labels: the demo shows where time and bytes go, not how well a model learns. The
models are the course's own (:mod:`dpkit.models`).

    dpkit demo                                 4 devices, batch 256, MLP, 3 steps, files in .
    dpkit demo --devices 8 --model cnn --out /tmp/dp
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import dpkit
from dpkit.cli_types import plural
from dpkit.environment import describe_choice
from dpkit.models import CLASSES, IMAGE_SHAPE, build_model


@dataclass
class DemoResult:
    trace: dpkit.Trace
    devices: list[dpkit.Device]
    trace_path: Path
    timeline_path: Path | None  # None where matplotlib is not installed
    memory_path: Path | None


def output_folder(out: str | Path) -> Path:
    """``out`` as an absolute folder, made if missing; a clear error, before any training,
    when it is a file or cannot be written."""
    folder = Path(out).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"out={str(out)!r} (--out) is a file, not a folder; pass a folder for the figures "
            "and trace.json, e.g. --out demo-output"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(
            f"out={str(out)!r} (--out) cannot be written to ({error.strerror or error}); pass "
            "a folder you can write to, e.g. --out demo-output"
        ) from None
    return folder


def _names(devices: list[dpkit.Device]) -> str:
    """Device names, the middle left out of a long list."""
    names = [d.name for d in devices]
    if len(names) > 8:
        names = [*names[:3], "...", names[-1]]
    return ", ".join(names)


def run_demo(
    devices: int = 4, batch: int = 256, model: str = "mlp", steps: int = 3, out: str | Path = "."
) -> DemoResult:
    """Train ``model`` for ``steps`` SGD steps on ``devices`` devices, traced; write the files.

    Writes ``trace.json`` (Chrome trace), ``timeline.png`` and ``memory.png`` (the last step)
    into ``out``.
    """
    for argument, value in (("devices", devices), ("batch", batch), ("steps", steps)):
        if value < 1:
            raise ValueError(f"{argument} must be at least 1, got {value}")
    out = output_folder(out)
    torch.manual_seed(0)
    chosen = dpkit.devices(devices)
    # Made on the CPU (the same numbers on every machine), then put on device_ids[0].
    module = dpkit.to_device(build_model(model), chosen[0])
    parallel = dpkit.DataParallel(module, device_ids=chosen)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    images, labels = dpkit.to_device(
        (torch.randn(batch, *IMAGE_SHAPE), torch.randint(0, CLASSES, (batch,))), chosen[0]
    )

    with dpkit.trace() as recorded:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(parallel(images), labels)
            loss.backward()
            optimizer.step()

    trace_path = recorded.to_chrome_trace(out / "trace.json")
    try:
        from dpkit import viz
    except ImportError:
        return DemoResult(recorded, chosen, trace_path, None, None)
    timeline_path, memory_path = out / "timeline.png", out / "memory.png"
    viz.timeline(recorded).savefig(timeline_path, dpi=120)
    viz.memory_per_device(recorded).savefig(memory_path, dpi=120)
    return DemoResult(recorded, chosen, trace_path, timeline_path, memory_path)


def report(result: DemoResult, devices: int, batch: int, model: str, steps: int) -> str:
    """What ``dpkit demo`` prints: the devices, the per-phase summary and where the files are."""
    kinds = sorted({d.kind for d in result.devices})
    # DataParallel gives a replica only to the devices that get a chunk (torch.chunk's sizes).
    used = result.devices[: len(dpkit.plan_chunks(batch, len(result.devices)))]
    idle = len(result.devices) - len(used)
    lines = [
        describe_choice(devices),
        f"devices used: {_names(used)} ({', '.join(kinds)})"
        + (f"; {len(used)} of {len(result.devices)} got a chunk of the batch" if idle else ""),
        f"model {model}, batch {batch} (random 1x28x28 images), {plural(steps, 'SGD step')}, "
        "traced",
        "",
        f"per phase, mean per step — {result.trace.hardware}:",
        str(result.trace.summary()),
        "",
        "memory per device in the last step (counted: the sum of the categories):",
        str(result.trace.memory_summary()),
        "",
    ]
    if result.timeline_path is None:
        lines.append("figures: skipped, matplotlib is not installed (pip install matplotlib)")
    else:
        lines.append(f"timeline (last step): {result.timeline_path}")
        lines.append(f"memory (last step):   {result.memory_path}")
    lines += [
        f"Chrome trace:         {result.trace_path}",
        "  open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing (Load);",
        "  one track per device, phases as slices; click a slice for its bytes and shapes.",
    ]
    return "\n".join(lines)
