"""Cutting a model layer-wise into stages, one per device: model parallelism's first step.

The surprise first: model parallelism copies nothing of the model. Data parallelism puts a
*whole* replica on every device and splits the batch; a model split puts a *part* of the
one model on each device (stage 0 the first layers, stage 1 the next, ...) and sends the
whole batch through them in turn: what crosses between devices is activations (forward)
and their gradients (backward), never parameters or parameter gradients.

The stages are the model's own layers (no copies): a split model trains the model you gave
it, so its gradients are the model's gradients, and a test compares them with the unsplit
model's. Moving a stage onto its device is ``module.to(device)`` in place, as
hand-written model-parallel code does (``self.seq1.to("cuda:0")``); on CPU lanes that is a
no-op, since every lane's memory is the CPU's.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from dpkit.device import Device


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def split_points(sizes: Sequence[int], stages: int) -> list[int]:
    """Where to cut a list of layer ``sizes`` into ``stages`` contiguous, non-empty groups so
    that the largest group is as small as possible: the index each stage after the first
    starts at. (Exact, by dynamic programming; a model has tens of layers, not thousands.)"""
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    infinity = float("inf")
    # best[k][i]: the smallest possible largest group when the first i layers make k groups.
    best = [[infinity] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                largest = max(best[k - 1][j], prefix[i] - prefix[j])
                if largest < best[k][i]:
                    best[k][i], cut[k][i] = largest, j
    points, i = [], n
    for k in range(stages, 1, -1):
        i = cut[k][i]
        points.append(i)
    return sorted(points)


def split_model(model: nn.Module, stages: int) -> list[nn.Sequential]:
    """``model`` (an ``nn.Sequential``) cut into ``stages`` contiguous groups of its layers,
    balanced by parameter count (a layer's FLOPs per row are about twice its parameters for
    the Linear layers of an MLP). The groups hold the model's own layer objects."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"model must be an nn.Sequential (its layers are cut in order), got "
            f"{type(model).__name__}; wrap the layers: nn.Sequential(layer1, layer2, ...)"
        )
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a whole number of at least 1, got {stages!r}")
    layers = list(model)
    if len(layers) < stages:
        raise ValueError(
            f"stages={stages} but the model has {len(layers)} layers: every stage needs at "
            f"least one; use stages<={len(layers)}"
        )
    points = [0, *split_points([parameter_count(layer) for layer in layers], stages), len(layers)]
    return [nn.Sequential(*layers[a:b]) for a, b in zip(points, points[1:])]


def place_stages(stages: Sequence[nn.Module], lanes: Sequence[Device]) -> None:
    """Move stage ``s`` onto ``lanes[s]`` (in place)."""
    if len(stages) != len(lanes):
        raise ValueError(
            f"{len(stages)} stages but {len(lanes)} devices: a model split needs one device "
            "per stage; pass as many devices as stages"
        )
    for stage, lane in zip(stages, lanes):
        stage.to(lane.torch_device)


def mlp_blocks(width: int = 512, blocks: int = 4, seed: int = 0) -> nn.Sequential:
    """A model that cuts into equal stages: ``blocks`` x (Linear(width, width), ReLU), the
    last without its ReLU (its output is the logits of ``width`` classes)."""
    import torch

    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for block in range(blocks):
        layers.append(nn.Linear(width, width))
        if block < blocks - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
