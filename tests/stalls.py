"""Modules that stall a CUDA stream, to widen races between streams (the GPU tests and
``scripts/gpu_check.py``'s stages share them)."""

import torch
from torch import nn

# torch.cuda._sleep spins for this many GPU clock cycles: about 25 ms at 2 GHz, longer at a
# lower clock. Long enough for the host to do what a test checks while a stream still waits.
STALL_CYCLES = 50_000_000


class Stall(torch.autograd.Function):
    """Identity that stalls the current stream in forward and again in backward."""

    @staticmethod
    def forward(ctx, x):
        torch.cuda._sleep(STALL_CYCLES)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(STALL_CYCLES)
        return grad.clone()


class StalledNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))

    def forward(self, x):
        return Stall.apply(self.net(Stall.apply(x)))
