"""Small modules that show one pitfall each, in a broken and a fixed form side by side.

Each takes a flag that switches between the form users write first and the fix, so the
notebook and the tests run the same code and a diff of the two forms is one line.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class PackedEncoder(nn.Module):
    """pack -> GRU -> unpack, as in torch's FAQ. Unpacking pads to the longest sequence *in
    this replica's chunk*, unless ``total_length`` pads every replica to the input's length.

    ``lengths`` must be sorted longest first (``pack_padded_sequence``'s default).
    """

    def __init__(self, features: int = 2, hidden: int = 3, total_length: bool = False) -> None:
        super().__init__()
        self.rnn = nn.GRU(features, hidden, batch_first=True)
        self.total_length = total_length

    def forward(self, padded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(padded, lengths.cpu(), batch_first=True)
        output, _ = self.rnn(packed)
        total = padded.shape[1] if self.total_length else None
        output, _ = pad_packed_sequence(output, batch_first=True, total_length=total)
        return output


class RemembersFeatures(nn.Module):
    """Keeps its hidden features for later (to plot them, say): on ``self`` in forward (lost
    with the replicas), or returned next to the output (``return_features=True``)."""

    def __init__(self, features: int = 4, hidden: int = 3, return_features: bool = False) -> None:
        super().__init__()
        self.encode = nn.Linear(features, hidden)
        self.head = nn.Linear(hidden, 1)
        self.return_features = return_features

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        hidden = self.encode(x).relu()
        if self.return_features:
            return self.head(hidden), hidden
        self.last_features = hidden  # set on whichever replica ran this
        return self.head(hidden)


class LabelledOutput(nn.Module):
    """Returns its scores with a label: a string, a Python number, or (the fix) only tensors."""

    def __init__(self, label: str = "tensor") -> None:
        super().__init__()
        if label not in ("string", "number", "tensor"):
            raise ValueError(f"label must be 'string', 'number' or 'tensor', got {label!r}")
        self.label = label
        self.score = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        scores = self.score(x)
        if self.label == "string":
            return {"scores": scores, "model": "v1"}
        if self.label == "number":
            return {"scores": scores, "rows": len(x)}
        return {"scores": scores, "rows": torch.tensor([len(x)], device=x.device)}


class ChunkLoss(nn.Module):
    """A model with its loss inside forward: each replica returns its chunk's loss, either
    the mean (a 0-dim tensor) or the sum as a 1-element vector (``reduction="sum"``)."""

    def __init__(self, model: nn.Module, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.model = model
        self.reduction = reduction

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(self.model(inputs), targets, reduction=self.reduction)
        return loss if self.reduction == "mean" else loss.reshape(1)


class Classifier(nn.Module):
    """A classifier with a ``predict`` method besides forward; ``forward(x, mode="predict")``
    routes to it, so that DataParallel (which only ever calls forward) splits it too."""

    def __init__(self, features: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor, mode: str = "logits") -> torch.Tensor:
        if mode == "predict":
            return self.predict(x)
        return self.linear(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).softmax(dim=-1)
