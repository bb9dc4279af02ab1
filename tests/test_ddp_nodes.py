"""dpkit.ddp.nodes starts one real torchrun per "node" on 127.0.0.1, numbers the ranks as a
cluster would, and leaves nothing running. The ranks here run a script that only writes
what torchrun told it (no torch to import: the launch costs the two torchruns only)."""

from __future__ import annotations

import json
import os
import sys

from dpkit.ddp import nodes

WHO = """
import json, os, sys
keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
        "CUDA_VISIBLE_DEVICES")
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as out:
    json.dump({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}, out)
"""


def test_two_torchruns_number_four_ranks_as_two_nodes_and_leave_nothing(tmp_path):
    script = tmp_path / "who.py"
    script.write_text(WHO)
    run = nodes.launch_nodes([str(script), str(tmp_path)], nnodes=2, nproc_per_node=2,
                             limit_s=120)  # fmt: skip
    assert run.ok, "\n".join(run.logs)
    assert [c[3:7] for c in run.commands] == [
        ["--nnodes=2", "--nproc_per_node=2", f"--node_rank={node}", "--master_addr=127.0.0.1"]
        for node in (0, 1)
    ]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, who in enumerate(ranks):
        node, local = divmod(rank, 2)
        assert (who["GROUP_RANK"], who["LOCAL_RANK"]) == (str(node), str(local))
        assert (who["WORLD_SIZE"], who["LOCAL_WORLD_SIZE"]) == ("4", "2")
        assert who["MASTER_ADDR"] == "127.0.0.1"
        # this machine's GPUs, none here, shared out between the nodes (test_gpus_of_node...)
        assert who["CUDA_VISIBLE_DEVICES"] == nodes.gpus_of_node(node, 2, 2, _gpus())
    for who in ranks:  # every rank has ended
        assert not os.path.exists(f"/proc/{who['pid']}") or _zombie(who["pid"])
    assert sys.executable in run.commands[0][0]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _gpus() -> list[str]:
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def test_python_dash_m_dpkit_ddp_nodes_starts_without_runpys_warning():
    # runpy warns when the package's import already imported the module it is asked to run
    import subprocess

    run = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "dpkit.ddp.nodes", "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "RuntimeWarning" not in run.stderr and "torchrun" in run.stdout + run.stderr
