"""replicate refuses a module compiled with torch.compile, word for word, and nothing else
(issue 18's error, found untested by mutation testing, issue 20)."""

from __future__ import annotations

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit

WHY = (
    " was compiled with torch.compile, and its replicas would all run the original module's "
    "compiled forward, not their own copies; pass the plain module (model._orig_mod, or the "
    "model before torch.compile). DataParallel makes new replicas on every forward, which "
    "torch.compile cannot follow; for compiled data parallelism, compile each rank's model "
    "under DistributedDataParallel (dpkit.ddp)"
)


def test_a_compiled_module_or_submodule_is_refused_naming_which():
    compiled = torch.compile(nn.Linear(2, 2))  # compiles on its first call: never here
    with pytest.raises(TypeError) as error:
        dpkit.replicate(compiled, lanes(2))
    assert str(error.value) == "module" + WHY
    with pytest.raises(TypeError) as error:
        dpkit.replicate(nn.Sequential(nn.Linear(2, 2), compiled), lanes(2))
    assert str(error.value) == "a submodule of module" + WHY


def test_a_plain_module_with_an_orig_mod_attribute_replicates():
    module = nn.Linear(2, 2)
    module._orig_mod = nn.Linear(2, 2)  # a name, not a compiled wrapper
    replicas = dpkit.replicate(module, lanes(2))
    assert len(replicas) == 2
