"""An NCCL rank sets its GPU current before it joins the process group and names it to torch
(``init_process_group(device_id=...)``), so NCCL binds the rank's communicator to that GPU
instead of guessing one from the rank; a gloo rank names none. Checked on the CPU with torch's
calls recorded (the GPU check's ``ddp`` stage runs the real thing on NCCL)."""

from __future__ import annotations

import pytest
import torch

from dpkit.ddp import rank as rank_module
from dpkit.ddp.workload import Workload


class Joined(Exception):
    """Raised after the group is joined: what the rank does next is not this test's."""


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda device: seen.append(("set_device", device))
    )

    def init_process_group(backend, **kwargs):
        seen.append(("init_process_group", backend, kwargs.get("device_id")))

    monkeypatch.setattr(rank_module.dist, "init_process_group", init_process_group)
    monkeypatch.setattr(rank_module, "import_what_ddp_imports", lambda: None)

    def stop_after_joining(seed):
        raise Joined

    monkeypatch.setattr(torch, "manual_seed", stop_after_joining)
    return seen


def _plan(backend, tmp_path):
    return rank_module.Plan(
        workload=Workload(torch.nn.Identity), nproc=2, batch=8, steps=1, backend=backend,
        port=None, timeout=30, store=str(tmp_path / "store"),
    )  # fmt: skip


class _Where:
    def at(self, *args):
        pass


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_an_nccl_rank_sets_its_gpu_first_and_names_it_when_it_joins(
    backend, calls, tmp_path, monkeypatch
):
    monkeypatch.setattr(rank_module.dist, "FileStore", lambda path, n: object())
    with pytest.raises(Joined):
        rank_module.run_rank(1, _Where(), None, None, _plan(backend, tmp_path))
    if backend == "nccl":
        assert calls == [
            ("set_device", torch.device("cuda", 1)),
            ("init_process_group", "nccl", torch.device("cuda", 1)),
        ]
    else:
        assert calls == [("init_process_group", "gloo", None)]
