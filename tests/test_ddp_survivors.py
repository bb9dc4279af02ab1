"""What the users of dpkit.ddp's launchers and commands see, run in this process with the
processes they would start replaced: the defaults that the docs promise (``run_ddp`` is
``dpkit ddp``, ``launch_nodes`` is two nodes of two ranks, ``settings_sweep`` trains the
mlp its docstring compares with), the help and the printed report of ``dpkit ddp`` and
``python -m dpkit.ddp.train``, ``run_main``'s cleanup, and ``measure_link`` on a ring whose
bandwidth and latency are known.
"""

from __future__ import annotations

import argparse
import shutil
import types
from pathlib import Path

import pytest

from dpkit.ddp import checks, command, nodes, run, script, settings, sharding, train
from dpkit.ddp.nodes import launch_nodes
from dpkit.ddp.run import DDPResult
from dpkit.tracing import Event


class Launched(Exception):
    """Raised by the stand-in launcher, with the plan it was given: no rank starts."""

    def __init__(self, plan):
        super().__init__("launched")
        self.plan = plan


def launch_plan(plan, timeout):
    raise Launched(plan)


def dpkit_ddp_defaults() -> argparse.Namespace:
    top = argparse.ArgumentParser(prog="dpkit")
    command.add_ddp_command(top.add_subparsers())
    return top.parse_args(["ddp"])


# -- run_ddp and settings_sweep: their defaults


def test_run_ddp_s_defaults_are_dpkit_ddp_s_two_ranks_batch_64_three_steps_of_the_mlp(
    monkeypatch,
):
    # README and dpkit.ddp's docstring show `dpkit ddp` and run_ddp("mlp", nproc=2, batch=64,
    # steps=3) as one run: the shell's defaults and the function's are the same
    monkeypatch.setattr(run, "launch_plan", launch_plan)
    with pytest.raises(Launched) as launched:
        run.run_ddp()
    plan, shell = launched.value.plan, dpkit_ddp_defaults()
    assert (plan.workload.name, plan.nproc, plan.batch, plan.steps) == ("mlp", 2, 64, 3)
    assert (shell.model, shell.nproc, shell.batch, shell.steps) == ("mlp", 2, 64, 3)


def test_settings_sweep_trains_the_mlp_on_32_rows_for_6_steps_by_default(monkeypatch):
    # its docstring compares the sweep with single_process_gradients("mlp", 32): that is the
    # same model on the same rows only with these defaults; 6 steps: steps 3 to 6, four per
    # rank, are the forwards that forward_times and settings_rows read
    monkeypatch.setattr(settings, "launch_plan", launch_plan)
    with pytest.raises(Launched) as launched:
        settings.settings_sweep({"float32": {}, "bf16": {"compression": "bf16"}})
    plan = launched.value.plan
    assert (plan.workload.name, plan.nproc, plan.batch, plan.steps) == ("mlp", 2, 32, 6)
    assert plan.threads == 1  # one torch thread per rank, as the docstring says
    assert plan.variants == ((), (("compression", "bf16"),))


# -- launch_nodes: its defaults


class Node:
    """A node's torchrun, not started: it ends at once with status 0 and an empty log."""

    started: list[Node] = []

    def __init__(self, command, **options):
        self.command, self.returncode = command, None
        Node.started.append(self)

    def communicate(self, timeout=None):
        self.returncode = 0
        return "", None


def test_launch_nodes_runs_two_nodes_of_two_ranks_by_default(monkeypatch):
    # docs/ddp_clusters.md: launch_nodes(["examples/ddp_recipe.py"]) is the same two
    # "nodes" as `dpkit ddp --nnodes 2 --nproc 2`
    Node.started = []
    monkeypatch.setattr(nodes, "subprocess", types.SimpleNamespace(
        Popen=Node, PIPE=-1, STDOUT=-2, TimeoutExpired=TimeoutError))  # fmt: skip
    monkeypatch.setattr(nodes, "_stop", lambda launch: None)  # nothing was started
    monkeypatch.setattr(checks, "free_port", lambda *_: 29517)
    monkeypatch.setattr(checks, "cores", lambda: 2)
    ran = launch_nodes(["examples/ddp_recipe.py"])
    assert [node.command[3:6] for node in Node.started] == [
        ["--nnodes=2", "--nproc_per_node=2", f"--node_rank={n}"] for n in (0, 1)
    ]
    assert ran.commands == [node.command for node in Node.started] and ran.ok


# -- dpkit ddp: its help and its report


def test_dpkit_ddp_s_help_says_each_node_is_a_torchrun_on_127_0_0_1(capsys):
    top = argparse.ArgumentParser(prog="dpkit")
    command.add_ddp_command(top.add_subparsers())
    with pytest.raises(SystemExit):
        top.parse_args(["ddp", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        '--nnodes NNODES "nodes" on this machine, a torchrun each on 127.0.0.1 (above 1: the '
        "training script of python -m dpkit.ddp.train) (default: 1)"
    ) in text


class Trace:
    """A trace of one step whose tables print as TABLE and MEMORY."""

    hardware = "processes"
    events = [Event("allreduce", "rank:0 cpu", 1.0, 1.5, 400, 1, "cpu", {"ring_sent_bytes": 400})]

    def summary(self):
        return "TABLE"

    def memory_summary(self):
        return "MEMORY"


def test_dpkit_ddp_s_report_sets_each_table_apart_with_a_blank_line():
    result = DDPResult(Trace(), 2, "gloo", 8, 25.0, 400, [0.5], [101, 102], None)
    text = command.report(result, "mlp", (Path("/o/trace.json"), None, None))
    lines = text.splitlines()
    memory = lines.index("memory per rank in the last step (counted: the sum of the categories):")
    assert lines[memory - 3 : memory + 3] == [
        "per phase, mean per step — processes:", "TABLE", "", lines[memory], "MEMORY", ""
    ]  # fmt: skip


# -- python -m dpkit.ddp.train: its help


def test_train_s_help_gives_the_timeout_in_seconds_and_its_default(capsys):
    with pytest.raises(SystemExit):
        train.parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--timeout TIMEOUT collective timeout (s) (default: 120.0)" in text


# -- run_main: its cleanup


def clean_up_the_store(argv):
    """A script's main that removes its init-method file's folder when it is done."""
    shutil.rmtree(Path(argv[0][len("file://") :]).parent)
    return "cleaned"


class Ranks:
    """launch.Ranks replaced: one rank, whose main runs here."""

    def __init__(self, target, args, nproc, timeout):
        self.main, self.argv = args[0], args[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def wait_for(self, kind):
        return [self.main(self.argv)]


def test_run_main_returns_what_main_returned_even_if_main_removed_the_store_s_folder(
    monkeypatch,
):
    monkeypatch.setattr(script.launch, "Ranks", Ranks)
    assert script.run_main(clean_up_the_store, ["{store}"], nproc=1) == ["cleaned"]


# -- measure_link


class Ring:
    """gloo's ring as dpkit.cost describes it: an all-reduce of S bytes over n ranks takes
    2 (n - 1) latency + 2 (n - 1) / n * S / bandwidth, on a clock that only it moves."""

    def __init__(self, world, bandwidth, latency):
        self.world, self.bandwidth, self.latency = world, bandwidth, latency
        self.now, self.sizes = 0.0, []

    def get_world_size(self):
        return self.world

    def barrier(self):
        pass

    def all_reduce(self, tensor):
        n, size = self.world, tensor.nbytes
        self.sizes.append(size)
        self.now += 2 * (n - 1) * self.latency + 2 * (n - 1) / n * size / self.bandwidth

    def perf_counter(self):
        return self.now


def test_measure_link_reads_the_ring_s_bandwidth_and_latency(monkeypatch):
    ring = Ring(world=4, bandwidth=1e9, latency=20e-6)
    monkeypatch.setattr(sharding, "dist", ring)
    monkeypatch.setattr(sharding, "time", types.SimpleNamespace(perf_counter=ring.perf_counter))
    bandwidth, latency = sharding.measure_link(small=4096, large=1 << 22, repeats=8)
    assert ring.sizes == [4096] * 8 + [1 << 22] * 2  # 8 small ones, 8 // 4 large ones
    # the small one's 4,096 bytes count as latency: 1.5 * 4096 / 1e9 s over its 6 steps
    assert latency == pytest.approx(20e-6 + 1.024e-6, rel=1e-9)
    # 1.5 * 4 MiB on the wire in 6.291456 ms, less those 6 * 1.024 us: 0.1 % more than 1 GB/s
    assert bandwidth == pytest.approx(6291456 / (6291456e-9 - 6.144e-6), rel=1e-9)
    assert bandwidth == pytest.approx(1e9, rel=1e-3)


def test_dpkit_ddp_s_report_says_how_long_rank_0_s_buckets_took_of_the_allreduce_row():
    # two buckets, 1.0-1.5 s and 2.0-2.25 s: the row spans 1.25 s, the all-reduces take 0.75
    events = [
        Event("allreduce", "rank:0 cpu", 1.0, 1.5, 400, 1, "cpu", {"ring_sent_bytes": 400}),
        Event("allreduce", "rank:0 cpu", 2.0, 2.25, 100, 1, "cpu", {"ring_sent_bytes": 100}),
    ]
    trace = Trace()
    trace.events = events
    result = DDPResult(trace, 2, "gloo", 8, 25.0, 400, [0.5], [101, 102], None)
    text = command.report(result, "mlp", (Path("/o/trace.json"), None, None))
    assert "in the last step rank 0's 2 all-reduces took 750.000 ms of those 1250.000 ms)" in text
