"""replicate refuses a module compiled with torch.compile, naming which and the fix, and
nothing else (issue 18's error, found untested by mutation testing, issue 20). Its whole text
is docs/bad_input.md's row (tests/test_bad_input_table.py, on a stand-in for torch.compile)."""

from __future__ import annotations

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit


def says_compiled(error: pytest.ExceptionInfo, which: str) -> None:
    """``which`` was compiled, the plain module to pass instead, and DDP for compiling."""
    message = str(error.value)
    assert message.startswith(which + " was compiled with torch.compile, ")
    assert "pass the plain module (model._orig_mod" in message
    assert "DistributedDataParallel (dpkit.ddp)" in message


def test_a_compiled_module_or_submodule_is_refused_naming_which():
    compiled = torch.compile(nn.Linear(2, 2))  # compiles on its first call: never here
    with pytest.raises(TypeError) as error:
        dpkit.replicate(compiled, lanes(2))
    says_compiled(error, "module")
    with pytest.raises(TypeError) as error:
        dpkit.replicate(nn.Sequential(nn.Linear(2, 2), compiled), lanes(2))
    says_compiled(error, "a submodule of module")


def test_a_plain_module_with_an_orig_mod_attribute_replicates():
    module = nn.Linear(2, 2)
    module._orig_mod = nn.Linear(2, 2)  # a name, not a compiled wrapper
    replicas = dpkit.replicate(module, lanes(2))
    assert len(replicas) == 2
