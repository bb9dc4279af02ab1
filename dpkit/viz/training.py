"""Training with DataParallel: the backward path, equivalence, and a short run.

The surprise first: DataParallel's backward is the forward run in reverse. gather's
backward *scatters* the output gradient to the devices (``grad_scatter``), each replica
runs its own backward, and replicate's backward *reduce-adds* every replica's parameter
gradients onto device 0 (``reduce``), where the optimizer steps. So the model is copied to
every device and the gradients copied back on every step, whatever the batch: a small
batch pays those fixed costs for little work, and DataParallel is then slower than one
device. :mod:`dpkit.viz.speedup` measures where that stops on the machine at hand.

Layers: data (:func:`training_trace`, :func:`compare_with_single_device`, :func:`train`),
figures (:func:`backward_timeline`, :func:`loss_curve`) and a widget
(:func:`backward_explorer`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from matplotlib.figure import Figure
from torch import nn

import dpkit
from dpkit.viz.common import (
    FIGURE_DPI,
    FIGURE_WIDTH,
    demo_model,
    hardware_of,
    intra_op_threads,
    notebook_timeline,
    one_device_marker,
)
from dpkit.viz.explorer import Explorer, int_slider
from dpkit.viz.figures import MEASURED_COLOR

# --------------------------------------------------------------------------------------
# The backward path as a timeline


def training_trace(
    devices: int = 4, batch: int = 256, steps: int = 2, threads: int | None = 1
) -> dpkit.Trace:
    """Trace ``steps`` training steps (forward, cross-entropy, backward) of the demo MLP; the
    first warms up the threads. On one device the module's own forward and backward are
    recorded (DataParallel records them so)."""
    lanes = dpkit.devices(devices)
    model = dpkit.to_device(demo_model(), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    inputs, targets = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
    inputs, targets = dpkit.to_device((inputs, targets), lanes[0])
    with intra_op_threads(threads), dpkit.trace() as recorded:
        for _ in range(steps):
            _training_step(model, parallel, inputs, targets)
    return recorded


def _training_step(model: nn.Module, parallel: nn.Module, inputs, targets) -> None:
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(parallel(inputs), targets).backward()


def backward_timeline(recorded: dpkit.Trace) -> Figure:
    """The last training step: forward phases, then grad_scatter, backward and reduce."""
    return notebook_timeline(recorded)


def backward_explorer(devices: int = 4, batch: int = 256, max_devices: int = 8) -> Explorer:
    """Sliders "devices" and "batch" over the timeline of one DataParallel training step.

    Every redraw runs two traced steps and draws the second (:func:`training_trace`), as the
    notebook says: the title's "step 2" is the trace's own number for it.
    """
    return Explorer(
        [int_slider("devices", devices, 1, max_devices), int_slider("batch", batch, 8, 2048, 8)],
        compute=training_trace,
        draw=backward_timeline,
        marker=one_device_marker,
    )


# --------------------------------------------------------------------------------------
# A learnable toy task, and training on it

FEATURES, CLASSES = 32, 4


def toy_batch(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random points labelled by a fixed random linear "teacher": a task an MLP can learn."""
    teacher = torch.Generator().manual_seed(1234)
    weights = torch.randn(FEATURES, CLASSES, generator=teacher)
    inputs = torch.randn(batch, FEATURES, generator=generator)
    return inputs, (inputs @ weights).argmax(dim=1)


def toy_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


@dataclass
class Equivalence:
    """Losses and parameters of the same training, on one device and with DataParallel."""

    devices: list[str]
    single_losses: list[float]
    parallel_losses: list[float]
    max_loss_difference: float
    max_parameter_difference: float  # after the last step, over every parameter entry
    max_parameter_change: float  # how far training moved the parameters, for scale


def compare_with_single_device(
    steps: int = 5, devices: int = 4, batch: int = 30, lr: float = 0.5
) -> Equivalence:
    """Train two identical copies with SGD on the same batches: one plain, one DataParallel.

    The default batch of 30 splits unevenly over 4 devices (8, 8, 8, 6), the harder case.
    """
    lanes = dpkit.devices(devices)
    single = dpkit.to_device(toy_model(), lanes[0])  # "one device" is device_ids[0]
    initial = copy.deepcopy(single)
    replicated = copy.deepcopy(single)
    parallel = dpkit.DataParallel(replicated, device_ids=lanes)
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in (single, replicated)]
    generator = torch.Generator().manual_seed(0)
    losses: list[list[float]] = [[], []]
    # One intra-op thread: how torch splits a matmul over threads changes its rounding, and the
    # threads the machine happens to have would otherwise decide the last bits of the result.
    with intra_op_threads(1):
        for _ in range(steps):
            inputs, targets = dpkit.to_device(toy_batch(batch, generator), lanes[0])
            for index, (net, optimizer) in enumerate(zip((single, parallel), optimizers)):
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(net(inputs), targets)
                loss.backward()
                optimizer.step()
                losses[index].append(loss.item())
    pairs = list(zip(single.parameters(), replicated.parameters()))
    return Equivalence(
        [d.name for d in lanes],
        losses[0],
        losses[1],
        max(abs(a - b) for a, b in zip(*losses)),
        max((a - b).abs().max().item() for a, b in pairs),
        max((a - b).abs().max().item() for a, b in zip(single.parameters(), initial.parameters())),
    )


@dataclass
class TrainingRun:
    devices: list[str]
    hardware: str
    batch: int
    losses: list[float] = field(default_factory=list)
    accuracy: float = 0.0  # on a fresh held-out batch after training


def train(
    steps: int = 60, devices: int = 4, batch: int = 128, lr: float = 0.5, progress: bool = True
) -> TrainingRun:
    """Train the toy MLP with DataParallel and SGD; a tqdm progress bar shows the loss."""
    from tqdm.auto import tqdm

    lanes = dpkit.devices(devices)
    model = dpkit.to_device(toy_model(), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    run = TrainingRun([d.name for d in lanes], hardware_of(lanes), batch)
    with intra_op_threads(1), tqdm(range(steps), desc="training", disable=not progress) as bar:
        for _ in bar:
            inputs, targets = dpkit.to_device(toy_batch(batch, generator), lanes[0])
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(parallel(inputs), targets)
            loss.backward()
            optimizer.step()
            run.losses.append(loss.item())
            bar.set_postfix(loss=f"{run.losses[-1]:.3f}")
        with torch.no_grad():
            inputs, targets = dpkit.to_device(toy_batch(1024, generator), lanes[0])
            run.accuracy = (parallel(inputs).argmax(dim=1) == targets).float().mean().item()
    return run


def loss_curve(run: TrainingRun) -> Figure:
    figure = Figure(figsize=(FIGURE_WIDTH, 2.8), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    axes.plot(range(1, len(run.losses) + 1), run.losses, color=MEASURED_COLOR)
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss")
    axes.grid(alpha=0.3)
    axes.set_title(
        f"DataParallel training on {len(run.devices)} devices, batch {run.batch} — {run.hardware}",
        fontsize=10,
    )
    return figure
