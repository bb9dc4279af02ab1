"""Modules whose replicas act by the lane they run on (``dpkit.current_device()``): the
hardening tests' and the error table's cases share them."""

import threading

from torch import nn

import dpkit


class StuckOn(nn.Module):
    """Doubles its input, except on the lanes listed, where it waits for ``release``."""

    def __init__(self, release: threading.Event, stuck: set[int]) -> None:
        super().__init__()
        self.release, self.stuck = release, stuck

    def forward(self, x):
        if dpkit.current_device().index in self.stuck:
            self.release.wait()
        return x * 2


class Returns(nn.Module):
    """Each replica returns what ``make(index, x)`` gives for its lane."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def forward(self, x):
        return self.make(dpkit.current_device().index, x)


class Raises(nn.Module):
    """Returns its input, except on lane 2, where it raises ``exception``."""

    def __init__(self, exception: BaseException) -> None:
        super().__init__()
        self.exception = exception

    def forward(self, x):
        if dpkit.current_device().index == 2:
            raise self.exception
        return x
