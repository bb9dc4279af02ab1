"""The models behind ``benchmarks/published_measurements.py``, in plain torch (no torchvision).

- :func:`resnet50`: ResNet-50 v1.5 exactly as torchvision builds it (Bottleneck blocks
  [3, 4, 6, 3], the stride on the 3x3 convolution, BatchNorm, a 1000-way head): the model of
  NVIDIA's DeepLearningExamples tables and of PyTorch's DDP benchmark. 25,557,032 parameters
  (checked by running it: ``sum(p.numel() for p in resnet50().parameters())``).
- :func:`resnext101_32x4d`: ResNeXt-101 32x4d (grouped 3x3 convolutions, cardinality 32), the
  model whose published steps set the presets' tensor-core fractions
  (``benchmarks/tensor_core_efficiency.py``); 44,177,704 parameters.
- :func:`gpt2_small`: GPT-2 small (12 layers, hidden 768, 12 heads, ffn 3072, 1024
  positions, vocabulary 50257, head tied to the token embedding), the model of the Hugging
  Face DP/DDP/NVLink measurement. Built from ``nn.TransformerEncoderLayer`` (pre-norm, GELU,
  causal mask), which holds the same weights as a GPT-2 block: 124,439,808 parameters, as
  Hugging Face's ``gpt2`` (checked by running it).

Weights are created uninitialised (``torch.nn.utils.skip_init``) or left as torch makes them
for the small layers: these models are for counting FLOPs, bytes and parameters and for
timing, not for training to accuracy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils import skip_init


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
    return skip_init(nn.Conv2d, cin, cout, k, stride=stride, padding=k // 2, bias=False)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride: v1.5), 1x1 expand x4, residual add, ReLU."""

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = _conv(cin, width, 1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, cout, 1), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(_conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


def _resnet(stages: tuple, block: Callable[[int, int, int], nn.Module], classes: int) -> nn.Module:
    """torchvision's ResNet layout: the stem (7x7 convolution, BatchNorm, ReLU, max-pool),
    ``stages`` of ``(planes, blocks, stride)`` built by ``block(cin, planes, stride)`` (the
    stride on each stage's first block), global pooling and a ``classes``-way head."""
    layers: list[nn.Module] = [
        _conv(3, 64, 7, 2), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]  # fmt: skip
    cin = 64
    for planes, blocks, stride in stages:
        for i in range(blocks):
            layers.append(block(cin, planes, stride if i == 0 else 1))
            cin = planes * 4
    layers += [
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), skip_init(nn.Linear, cin, classes),
    ]  # fmt: skip
    return nn.Sequential(*layers)


def resnet50(num_classes: int = 1000) -> nn.Module:
    """ResNet-50 v1.5 (torchvision's ``resnet50()``): 25,557,032 parameters at 1000 classes."""
    return _resnet(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), Bottleneck, num_classes)


class GroupedBottleneck(nn.Module):
    """ResNeXt's block: 1x1 reduce to ``groups x width_per_group`` channels, a 3x3 grouped
    convolution (carrying the stride), 1x1 expand to ``4 x planes``, residual add, ReLU."""

    def __init__(self, cin: int, planes: int, stride: int, groups: int, per_group: int) -> None:
        super().__init__()
        width, cout = groups * per_group * planes // 64, planes * 4
        self.conv1, self.bn1 = _conv(cin, width, 1), nn.BatchNorm2d(width)
        self.conv2 = skip_init(nn.Conv2d, width, width, 3, stride=stride, padding=1,
                               groups=groups, bias=False)  # fmt: skip
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, cout, 1), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(_conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    forward = Bottleneck.forward


def resnext101_32x4d(num_classes: int = 1000) -> nn.Module:
    """ResNeXt-101 32x4d as NVIDIA's DeepLearningExamples build it (``--arch
    resnext101-32x4d``: blocks [3, 4, 23, 3], cardinality 32, width 4 per group at the first
    stage): 44,177,704 parameters at 1000 classes (checked by running it)."""

    def block(cin: int, planes: int, stride: int) -> nn.Module:
        return GroupedBottleneck(cin, planes, stride, groups=32, per_group=4)

    return _resnet(((64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 2)), block, num_classes)


class GPT2Small(nn.Module):
    """GPT-2 small: token and position embeddings, 12 pre-norm causal blocks, final norm,
    logits through the (tied) token embedding."""

    def __init__(self, vocab: int = 50257, positions: int = 1024, hidden: int = 768,
                 layers: int = 12, heads: int = 12) -> None:  # fmt: skip
        super().__init__()
        self.wte = skip_init(nn.Embedding, vocab, hidden)
        self.wpe = skip_init(nn.Embedding, positions, hidden)
        block = nn.TransformerEncoderLayer(
            hidden, heads, 4 * hidden, dropout=0.0, activation="gelu", batch_first=True,
            norm_first=True,
        )  # fmt: skip
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(seq, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=ids.device)
        x = self.ln_f(self.blocks(x, mask=mask, is_causal=True))
        return nn.functional.linear(x, self.wte.weight)


def gpt2_small() -> nn.Module:
    """GPT-2 small (Hugging Face ``gpt2``): 124,439,808 parameters; inputs are token ids of
    shape (batch, seq_len <= 1024)."""
    return GPT2Small()
