"""The migration recipe (examples/ddp_recipe.py) does what it promises: 4 ranks with a
global batch B train to the parameters one process reaches with batch B, and gradient
accumulation under ``no_sync()`` equals the large batch while all-reducing once per step.

The ranks run the script's ``main`` as torchrun would, from dpkit's preloaded fork server
(``dpkit.ddp.script.run_main``: a second per launch instead of torchrun's seconds per rank),
meeting through a file store; notebook 09 runs the same script under real torchrun.

Tolerance: 8 SGD steps in float32; the ranks' all-reduce sums the gradients in another
order than one process does, which differs in the last bits (measured: at most 1.5e-8 here),
so parameters must agree to 1e-6 absolute (a missing ``/ accumulate`` or a step that saw
other rows differs by 1e-3 or more).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from dpkit.ddp.script import run_main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import ddp_recipe  # noqa: E402  (examples/ is not a package)

COMMON = ["--samples", "256", "--batch", "64", "--epochs", "2", "--init-method", "{store}"]


def trained(folder: Path, nproc: int, *options: str) -> dict[str, torch.Tensor]:
    statuses = run_main(ddp_recipe.main, [*COMMON, "--out", str(folder), *options], nproc)
    assert statuses == [0] * nproc
    checkpoint = torch.load(folder / "checkpoint.pt")
    assert checkpoint["steps"] == 2 * 256 // 64  # epochs x steps per epoch
    return checkpoint["model"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, torch.Tensor]:
    return trained(tmp_path_factory.mktemp("one"), 1)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert not any(key.startswith("module.") for key in a)  # saved from ddp.module
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)


def test_four_ranks_with_global_batch_b_reach_one_process_s_parameters(one_process, tmp_path):
    assert_same(trained(tmp_path, 4), one_process)
    ddp_recipe.build_model().load_state_dict(one_process)  # a plain model loads it


def test_accumulation_under_no_sync_equals_the_large_batch(one_process, tmp_path):
    # 2 ranks x 2 micro-batches of 16 rows = the global batch of 64, per optimizer step
    assert_same(trained(tmp_path, 2, "--accumulate", "2", "--trace"), one_process)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    rank0 = [e for e in events if e.get("ph") == "X" and e["tid"] == 0]
    forwards = Counter(e["args"]["step"] for e in rank0 if e["name"] == "apply")
    allreduces = Counter(e["args"]["step"] for e in rank0 if e["name"] == "allreduce")
    assert set(forwards.values()) == {2}  # two micro-batches per step...
    assert set(allreduces.values()) == {1}  # ...and one all-reduce: the model is one bucket


def test_run_main_refuses_a_main_the_ranks_cannot_import():
    with pytest.raises(ValueError, match="main=.*lambda.*define it in a .py file"):
        run_main(lambda argv: 0, [], nproc=2)
    with pytest.raises(ValueError, match="nodes must divide nproc=3"):
        run_main(ddp_recipe.main, [], nproc=3, nodes=2)
