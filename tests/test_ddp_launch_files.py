"""The cluster launch files for the DDP recipe say what they should: the Slurm batch script
is valid bash and, run with stand-ins for ``srun`` and ``scontrol``, starts on each node the
torchrun command a two-node job needs; the Kubernetes manifest's Indexed Job, headless
Service and torchrun command agree with each other; both pass the recipe options it accepts.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"
sys.path.insert(0, str(ROOT / "examples"))
import ddp_recipe  # noqa: E402  (examples/ is not a package)


def options(arguments: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in arguments if a.startswith(f"--{name}=")]
    return value


def stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_slurm_script_starts_one_torchrun_per_node(tmp_path):
    script = CLUSTER / "slurm_ddp_recipe.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # srun runs its command once per node (here: for nodes 0 and 1); torchrun prints its
    # arguments, one per line, after a line with the node's number
    # a long host list, longer than a pipe holds: `| head -n 1` would end in SIGPIPE (141)
    stand_in(tmp_path, "scontrol", 'printf "gpu-a\\ngpu-b\\n"; seq 200000\n')
    stand_in(tmp_path, "srun", 'for n in 0 1; do SLURM_NODEID=$n "$@"; done\n')
    stand_in(tmp_path, "torchrun", 'echo "node $SLURM_NODEID"; printf "%s\\n" "$@"\n')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_ID": "7"}  # fmt: skip
    result = subprocess.run(["bash", str(script)], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    nodes = result.stdout.split("node ")[1:]
    assert len(nodes) == 2
    for node, text in enumerate(nodes):
        lines = text.split()
        assert lines[0] == str(node)
        arguments = lines[1:]
        assert options(arguments, "nnodes") == "2" and options(arguments, "node_rank") == str(node)
        assert options(arguments, "master_addr") == "gpu-a"  # the first node hosts it
        assert options(arguments, "nproc_per_node") == "4"
        where = arguments.index("examples/ddp_recipe.py")
        recipe = ddp_recipe.parse(arguments[where + 1 :])
        assert recipe.out == "runs/ddp-recipe-7"
        assert recipe.batch % (2 * 4) == 0  # the global batch splits over the 8 ranks


def test_the_kubernetes_job_service_and_torchrun_agree():
    service, job = yaml.safe_load_all((CLUSTER / "kubernetes_ddp_recipe.yaml").read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    name = job["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    assert service["spec"]["selector"] == {"job-name": name}
    assert pod["subdomain"] == service["metadata"]["name"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[0] == "torchrun"
    nnodes = int(options(command, "nnodes"))
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nnodes
    assert options(command, "node_rank") == "$(JOB_COMPLETION_INDEX)"
    assert "JOB_COMPLETION_INDEX" in {e["name"] for e in container["env"]}
    assert options(command, "master_addr") == f"{name}-0.{service['metadata']['name']}"
    assert int(options(command, "master_port")) == service["spec"]["ports"][0]["port"]
    gpus = int(options(command, "nproc_per_node"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    script = next(a for a in command if a.endswith(".py"))
    assert script == f"{mounts['recipe']}/ddp_recipe.py"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["recipe"]["configMap"]["name"] == name
    recipe = ddp_recipe.parse(command[command.index(script) + 1 :])
    assert recipe.out == mounts["output"] and recipe.batch % (nnodes * gpus) == 0
