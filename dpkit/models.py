"""The course's models by name, all on 1x28x28 images (random MNIST-shaped data): the one
place that builds them, for ``dpkit demo``, ``dpkit.ddp``, the cost model and the notebooks.

=================  ================================================================
``"mlp"``          784 -> 256 -> 128 -> 10; the demo's default (0.9 MB of parameters)
``"cnn"``          two 3x3 convolutions with max-pooling, then a linear head
``"transformer"``  :class:`RowTransformer`: each of the 28 rows is a token
``"wide"``         :func:`wide_mlp`: 20 MB, so that DDP's default buckets cut it in two
``"wide-mlp"``     :func:`resnet_sized_mlp`: 24.2 M parameters, about ResNet-50's, zeros
=================  ================================================================

The first three (:data:`COURSE_MODELS`) are tiny, so on GPUs their steps are all host
overhead; they are what calibration and the benchmarks measure on CPU lanes. The two wide
ones move as many gradient bytes as real models do, so that buckets (``"wide"``, for DDP)
and links (``"wide-mlp"``, for predictions) show.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils import skip_init

IMAGE_SHAPE = (1, 28, 28)
CLASSES = 10

COURSE_MODELS = ("mlp", "cnn", "transformer")  # dpkit demo's; calibrated and benchmarked
DDP_MODELS = (*COURSE_MODELS, "wide")  # what dpkit ddp trains
PREDICTION_MODELS = (*DDP_MODELS, "wide-mlp")  # what dpkit predict and plan take


def mlp() -> nn.Sequential:
    """784 -> 256 -> 128 -> 10 with ReLUs."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 256),
        nn.ReLU(),
        nn.Linear(256, 128),
        nn.ReLU(),
        nn.Linear(128, CLASSES),
    )


def cnn() -> nn.Sequential:
    """Two 3x3 convolutions (8 and 16 channels), each with ReLU and 2x2 max-pooling, then a
    linear head."""
    return nn.Sequential(
        nn.Conv2d(1, 8, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, CLASSES),
    )


class RowTransformer(nn.Module):
    """A tiny transformer encoder for 1x28x28 images: each of the 28 rows is a token.

    Rows are embedded, given a learned position, run through two encoder layers (no
    dropout, so every device computes the same numbers) and mean-pooled into class scores.
    """

    def __init__(self, width: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        rows, columns = IMAGE_SHAPE[1:]
        self.embed = nn.Linear(columns, width)
        self.position = nn.Parameter(torch.zeros(rows, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        # enable_nested_tensor only matters for padded batches in eval; off, torch does not warn
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(images.flatten(1, 2)) + self.position  # (batch, 28 rows, width)
        return self.head(self.encoder(tokens).mean(dim=1))


def wide_mlp(width: int = 1024, hidden: int = 4) -> nn.Sequential:
    """An MLP on 1x28x28 images with ``hidden`` square layers of ``width``: 20 MB of
    parameters at the defaults, so that torch's default buckets (the first 1 MiB, then 25
    MiB) cut it in two and the first bucket's all-reduce overlaps most of backward (the
    demo's MLP, 0.9 MB, fits in one bucket, which can only start after backward)."""
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(28 * 28, width), nn.ReLU()]
    for _ in range(hidden):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def resnet_sized_mlp() -> nn.Sequential:
    """784 -> 4096 -> 4096 -> 1024 -> 10 with ReLUs: 24.2 M parameters (ResNet-50 has 25.6 M)
    with far fewer FLOPs. Its weights are zeros (a random initialisation takes a second): a
    prediction needs its shapes, never its values."""
    widths = (28 * 28, 4096, 4096, 1024, CLASSES)
    layers: list[nn.Module] = [nn.Flatten()]
    for width_in, width_out in zip(widths, widths[1:]):
        layer = skip_init(nn.Linear, width_in, width_out)
        for tensor in (layer.weight, layer.bias):
            nn.init.zeros_(tensor)
        layers += [layer, nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # no ReLU after the last layer


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "mlp": mlp,
    "cnn": cnn,
    "transformer": RowTransformer,
    "wide": wide_mlp,
    "wide-mlp": resnet_sized_mlp,
}


def build_model(name: str, seed: int | None = None) -> nn.Module:
    """The course model ``name`` (a key of :data:`BUILDERS`), on the CPU. With ``seed``,
    torch is seeded first, so the weights are the same on every call; without, they come
    from torch's generator as it stands (the demo and the DDP ranks seed it themselves)."""
    if name not in BUILDERS:
        raise ValueError(
            f"model={name!r} is not one of the course's models; use one of {', '.join(BUILDERS)}"
        )
    if seed is not None:
        torch.manual_seed(seed)
    return BUILDERS[name]()


def sample_input(rows: int = 1) -> torch.Tensor:
    """``rows`` random MNIST-shaped images, the input every course model takes."""
    return torch.randn(rows, *IMAGE_SHAPE)


class WithUnusedLayer(nn.Module):
    """The demo's MLP and a layer its forward never uses: DDP then waits forever for that
    layer's gradient unless ``find_unused_parameters=True`` or ``static_graph=True`` (torch
    raises at the next step)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = mlp()
        self.unused = nn.Linear(CLASSES, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.used(images)
