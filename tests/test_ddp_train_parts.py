"""dpkit.ddp.train, the script torchrun starts once per rank, run in this test's own process:
its options, the world it reads from the environment, the backend it picks, the recorder,
the files rank 0 writes, the training itself, and ``main`` as a world of one.

Why in-process: the tests that launch it (test_ddp_nodes.py, test_ddp_cli.py) run it in
torchrun's rank processes, where a mutation tool that records which test calls which
function sees none of it. Here a gloo group of one rank is set up and torn down in the test
(as test_ddp_one_rank.py and test_sharding_one_rank.py do), and where a test needs a second
rank, torch.distributed is a stand-in that answers for it. Sockets are bound to 127.0.0.1
only: gloo on the loopback interface, and ``main``'s store served by
:func:`dpkit.ddp.nodes.loopback_store`.
"""

from __future__ import annotations

import gc
import json
import socket
import types

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dpkit.ddp import checks, train
from dpkit.ddp.nodes import loopback_store, train_on_nodes
from dpkit.ddp.record import RankRun
from dpkit.ddp.workload import named_workload

WORLD_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


@pytest.fixture
def no_world(monkeypatch):
    """None of torchrun's variables set, and whatever the test sets removed afterwards
    (monkeypatch forgets a variable it deleted that was not there: set it first)."""
    for name in WORLD_VARIABLES:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", checks.loopback_interface() or "lo")


@pytest.fixture
def one_rank(monkeypatch):
    """A gloo group of this process alone, its connections on the loopback interface."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", checks.loopback_interface() or "lo")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        gc.collect()  # DDP's reducers before their group (dpkit.ddp.rank.free_reducers)
        if dist.is_initialized():
            dist.destroy_process_group()


# -- parse


def test_parse_defaults():
    args = train.parse([])
    assert (args.model, args.samples, args.batch_per_rank, args.epochs) == ("mlp", 256, 32, 1)
    assert (args.bucket_mb, args.timeout, args.out) == (None, 120.0, ".")  # torch's buckets


def test_parse_reads_each_option_as_its_type():
    args = train.parse(["--model", "cnn", "--samples", "40", "--batch-per-rank", "2",
                        "--epochs", "3", "--bucket-mb", "0.5", "--timeout", "30",
                        "--out", "runs/a"])  # fmt: skip
    assert (args.model, args.samples, args.batch_per_rank, args.epochs) == ("cnn", 40, 2, 3)
    assert (args.bucket_mb, args.timeout, args.out) == (0.5, 30.0, "runs/a")
    assert isinstance(args.timeout, float) and isinstance(args.samples, int)


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer", "wide"])
def test_parse_takes_every_model_dpkit_ddp_trains(model):
    assert train.parse(["--model", model]).model == model


@pytest.mark.parametrize(
    "argv, named",
    [(["--model", "resnet"], "--model"), (["--samples", "many"], "--samples"),
     (["--bucket-mb", "big"], "--bucket-mb"), (["--batch-per-rank", "1.5"], "--batch-per-rank")],
)  # fmt: skip
def test_parse_refuses_a_bad_value_naming_its_option(argv, named, capsys):
    with pytest.raises(SystemExit) as refused:
        train.parse(argv)
    assert refused.value.code == 2
    error = capsys.readouterr().err
    assert named in error and "invalid" in error
    assert "python -m dpkit.ddp.train" in error  # the usage line names how to run it


def test_parse_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        train.parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "images in the dataset (default: 256)" in text
    assert "DDP's bucket_cap_mb; None: torch's (25, the first bucket 1) (default: None)" in text


def test_parse_reads_the_script_that_train_on_nodes_builds(monkeypatch):
    # dpkit ddp --nnodes passes these options: each must be one this script knows
    scripts = []
    monkeypatch.setattr(
        "dpkit.ddp.nodes.launch_nodes", lambda script, *a, **k: scripts.append(script)
    )
    train_on_nodes("runs/x", nnodes=2, nproc_per_node=1, model="transformer", batch=6,
                            steps=4, bucket_mb=1e-06, timeout=45.0)  # fmt: skip
    ((module_flag, module, *options),) = scripts
    assert (module_flag, module) == ("-m", "dpkit.ddp.train")
    args = train.parse(options)
    assert (args.model, args.samples, args.batch_per_rank, args.epochs) == ("transformer", 24, 3, 1)
    assert (args.bucket_mb, args.timeout, args.out) == (1e-06, 45.0, "runs/x")


# -- _world_from_environment


def test_plain_python_becomes_a_world_of_one_on_127_0_0_1(no_world, monkeypatch):
    monkeypatch.setattr(checks, "free_port", lambda *_: 41234)
    train._world_from_environment()
    got = {name: train.os.environ[name] for name in WORLD_VARIABLES}
    assert got == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                   "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": "41234"}  # fmt: skip


def test_a_world_of_one_s_port_is_a_free_one(no_world):
    train._world_from_environment()
    port = int(train.os.environ["MASTER_PORT"])
    with socket.socket() as probe:  # nothing listens there: it can be bound
        probe.bind(("127.0.0.1", port))


def test_a_world_of_one_keeps_an_address_and_port_the_caller_chose(no_world, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29555")
    train._world_from_environment()
    assert (train.os.environ["MASTER_ADDR"], train.os.environ["MASTER_PORT"]) == (
        "localhost", "29555")  # fmt: skip
    assert train.os.environ["WORLD_SIZE"] == "1"


def test_under_torchrun_the_environment_is_left_as_it_is(no_world, monkeypatch):
    torchrun_s = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                  "GROUP_RANK": "1"}  # fmt: skip
    for name, value in torchrun_s.items():
        monkeypatch.setenv(name, value)
    train._world_from_environment()
    assert {name: train.os.environ.get(name) for name in WORLD_VARIABLES} == {
        **torchrun_s, "MASTER_ADDR": None, "MASTER_PORT": None}  # fmt: skip


# -- every_rank_has_a_gpu


@pytest.mark.parametrize(
    "available, gpus, local_world_size, expected",
    [(True, 2, 1, True), (True, 2, 2, True), (True, 2, 3, False), (True, 1, 2, False),
     (False, 4, 1, False), (False, 0, 1, False)],
)  # fmt: skip
def test_cuda_only_when_every_rank_of_the_node_has_a_gpu(
    monkeypatch, available, gpus, local_world_size, expected
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert train.every_rank_has_a_gpu(local_world_size) is expected


# -- recorder_for


def test_a_recorder_for_any_rank_imports_first_and_needs_no_parent(monkeypatch):
    order = []
    monkeypatch.setattr(train, "import_what_ddp_imports", lambda: order.append("import"))
    real = train.RankRecorder
    monkeypatch.setattr(
        train, "RankRecorder", lambda *a, **k: order.append("recorder") or real(*a, **k)
    )
    recorder = train.recorder_for(3, 4, torch.device("cpu"))
    assert order == ["import", "recorder"]  # DDP's imports are not timed as its constructor
    assert (recorder.rank, recorder.nproc, recorder.clock.device) == (3, 4, torch.device("cpu"))
    recorder.where.at(2, step=5)  # rank 3's progress goes nowhere, without an error


# -- write_trace


def a_record(rank: int, events: list) -> RankRun:
    return RankRun(rank=rank, device="cpu", pid=100 + rank, bucket_cap_mb=25.0,
                   parameter_bytes=92, events=events)  # fmt: skip


# Times that are exact in binary, so that microseconds compare exactly
EVENTS = [("apply", 2.0, 2.5, 0, 1, {"rows": 4}),
          ("allreduce", 2.25, 2.75, 92, 1, {"last_bucket": True})]  # fmt: skip


def x_events(trace: dict) -> list[tuple]:
    tracks = {
        e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    return [(e["name"], tracks[e["tid"]], e["ts"], e["dur"], e["args"])
            for e in trace["traceEvents"] if e["ph"] == "X"]  # fmt: skip


def test_rank_0_of_one_writes_the_trace_with_its_node_and_who_ran(one_rank, tmp_path):
    record = a_record(0, list(EVENTS))
    who = {"rank": 0, "node": 2, "host": "here"}
    out = tmp_path / "new" / "dir"
    train.write_trace(record, who, out)
    trace = json.loads((out / "trace.json").read_text())
    # microseconds from the first start; the track is named with the node
    assert x_events(trace) == [
        ("apply", "rank:0 (cpu, node 2)", 0.0, 500000.0,
         {"step": 1, "nbytes": 0, "kind": "rank", "rows": 4}),
        ("allreduce", "rank:0 (cpu, node 2)", 250000.0, 500000.0,
         {"step": 1, "nbytes": 92, "kind": "rank", "last_bucket": True}),
    ]  # fmt: skip
    assert json.loads((out / "ranks.json").read_text()) == [who]
    assert record.events == EVENTS  # one host: rank 0's own clock, not shifted


def test_a_rank_without_a_node_is_on_node_0(one_rank, tmp_path):
    record = a_record(0, list(EVENTS))
    train.write_trace(record, {"rank": 0}, tmp_path)
    assert record.device == "cpu, node 0"
    tracks = [e["args"]["name"] for e in json.loads((tmp_path / "trace.json").read_text())[
        "traceEvents"] if e["name"] == "thread_name"]  # fmt: skip
    assert tracks == ["rank:0 (cpu, node 0)"]


class TwoRanks:
    """torch.distributed as rank ``rank`` of a world of two sees it: ``answers`` make up
    what the other rank sends to each all_gather_object, given what this one sends."""

    def __init__(self, rank: int, *answers):
        self.rank, self.answers, self.barriers = rank, list(answers), 0

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return self.rank

    def barrier(self) -> None:
        self.barriers += 1

    def all_gather_object(self, gathered: list, mine) -> None:
        assert len(gathered) == 2  # a place per rank
        gathered[self.rank], gathered[1 - self.rank] = mine, self.answers.pop(0)(mine)


def test_a_rank_on_another_host_shifts_its_times_onto_rank_0_s_clock(monkeypatch, tmp_path):
    # rank 0's clock read 5 s later than this rank's at the same barrier
    other = TwoRanks(1, lambda mine: (mine[0] + 5.0, "rank-0-host"), lambda mine: None)
    monkeypatch.setattr(train, "dist", other)
    record = a_record(1, list(EVENTS))
    train.write_trace(record, {"rank": 1, "node": 1}, tmp_path)
    assert record.events == [("apply", 7.0, 7.5, 0, 1, {"rows": 4}),
                             ("allreduce", 7.25, 7.75, 92, 1, {"last_bucket": True})]  # fmt: skip
    assert record.device == "cpu, node 1"
    assert other.barriers >= 1 and other.answers == []  # read at a barrier; both gathers
    assert list(tmp_path.iterdir()) == []  # rank 1 writes nothing


def test_a_rank_on_rank_0_s_host_keeps_its_times(monkeypatch, tmp_path):
    same_host = TwoRanks(1, lambda mine: (mine[0] + 5.0, socket.gethostname()), lambda m: None)
    monkeypatch.setattr(train, "dist", same_host)
    record = a_record(1, list(EVENTS))
    train.write_trace(record, {"rank": 1, "node": 0}, tmp_path)
    assert record.events == EVENTS  # one monotonic clock per machine


def test_rank_0_of_two_writes_both_ranks_tracks_and_who_ran_in_rank_order(monkeypatch, tmp_path):
    rank_1 = a_record(1, [("apply", 3.0, 3.5, 0, 1, {"rows": 4})])
    rank_1.device = "cpu, node 1"  # as rank 1's own write_trace names it
    who_1 = {"rank": 1, "node": 1}
    zero = TwoRanks(0, lambda mine: (mine[0] - 100.0, "rank-1-host"), lambda mine: (rank_1, who_1))
    monkeypatch.setattr(train, "dist", zero)
    train.write_trace(a_record(0, list(EVENTS)), {"rank": 0, "node": 0}, tmp_path)
    trace = json.loads((tmp_path / "trace.json").read_text())
    # rank 0's times unshifted whatever rank 1's clock read
    assert [(name, track, ts) for name, track, ts, _, _ in x_events(trace)] == [
        ("apply", "rank:0 (cpu, node 0)", 0.0),
        ("allreduce", "rank:0 (cpu, node 0)", 250000.0),
        ("apply", "rank:1 (cpu, node 1)", 1000000.0),
    ]
    assert json.loads((tmp_path / "ranks.json").read_text()) == [{"rank": 0, "node": 0}, who_1]


# -- _clock_offset (what main adds to every time of a rank)


def test_the_clock_offset_is_0_on_rank_0_s_host_else_the_readings_difference(monkeypatch):
    monkeypatch.setattr(train, "dist", TwoRanks(1, lambda now: now + 5.0))
    assert train._clock_offset("rank-0-host") == pytest.approx(5.0)
    monkeypatch.setattr(train, "dist", TwoRanks(1, lambda now: now + 5.0))
    assert train._clock_offset(socket.gethostname()) == 0.0


# -- _save


def test_save_writes_the_model_the_trace_and_who_ran_and_says_so(tmp_path, capsys):
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.5, -2.0]]))
        model.bias.fill_(0.25)
    gathered = [
        (a_record(0, [("apply", 1.0, 1.5, 0, 1, {}), ("apply", 2.0, 2.5, 0, 3, {})]), {"rank": 0}),
        (a_record(1, [("apply", 1.25, 1.75, 0, 2, {})]), {"rank": 1}),
    ]
    out = tmp_path / "runs" / "ddp"
    train._save(out, model, gathered)
    weights = torch.load(out / "model.pt")
    assert set(weights) == {"weight", "bias"}  # the model's own names
    torch.testing.assert_close(weights["weight"], torch.tensor([[1.5, -2.0]]))
    torch.testing.assert_close(weights["bias"], torch.tensor([0.25]))
    trace = json.loads((out / "trace.json").read_text())
    assert [(track, ts) for _, track, ts, _, _ in x_events(trace)] == [
        ("rank:0 (cpu)", 0.0),
        ("rank:1 (cpu)", 250000.0),
        ("rank:0 (cpu)", 1000000.0),
    ]
    assert json.loads((out / "ranks.json").read_text()) == [{"rank": 0}, {"rank": 1}]
    printed = capsys.readouterr().out
    assert printed.startswith(f"rank 0: 2 ranks, 3 steps each; wrote {out}/model.pt, trace.json,")
    assert "per phase, mean per step" in printed and "apply" in printed  # the summary table


# -- train: a world of one, in this process


def plain_training(samples: int, batch: int, epochs: int, rank: int = 0, world: int = 1):
    """What rank ``rank``'s DDP training must equal when no other rank adds gradients: the
    same seed, data and first weights; each epoch the rank's share of DistributedSampler's
    order (torch.randperm seeded with seed + epoch, every ``world``-th row from ``rank``);
    plain SGD steps on the mean over ``world`` ranks, of which the others add nothing."""
    workload = named_workload("mlp")
    torch.manual_seed(workload.seed)
    images, labels = workload.data(samples)
    model = workload.model()
    optimizer = workload.optimizer(model.parameters())
    for epoch in range(epochs):
        shuffle = torch.Generator().manual_seed(workload.seed + epoch)
        for rows in torch.randperm(samples, generator=shuffle)[rank::world].split(batch):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(images[rows]), labels[rows])
            (loss / world).backward()  # this rank's gradients, averaged with nothing else
            optimizer.step()
    return model


def assert_same_weights(model: nn.Module, expected: nn.Module) -> None:
    for (name, got), want in zip(model.state_dict().items(), expected.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)


def test_one_rank_trains_each_epoch_s_shuffle_as_plain_training_does(one_rank):
    args = train.parse(["--samples", "12", "--batch-per-rank", "4", "--epochs", "2",
                        "--bucket-mb", "0.1"])  # fmt: skip
    record, model = train.train(args, torch.device("cpu"))
    assert not isinstance(model, nn.parallel.DistributedDataParallel)  # DDP unwrapped
    # with one rank DDP's all-reduce of the mean changes nothing
    assert_same_weights(model, plain_training(12, 4, 2))
    # 12 rows in batches of 4, twice: 6 steps, each recorded with its rows
    assert (record.rank, record.device, record.bucket_cap_mb) == (0, "cpu", 0.1)
    assert len(record.step_times) == 6
    # DDP was given the cap. Step 1 all-reduces everything in one bucket (torch's DDP
    # without find_unused_parameters); the rebuilt buckets then fill from the last
    # parameter: 40 + 5,120 + 512 + 131,072 bytes pass 0.1 MiB (104,858) and close one,
    # 1,024 + 802,816 the second. (Under torch's default, 1 MiB first, 940,584 bytes: one.)
    allreduces = [e[4] for e in record.events if e[0] == "allreduce"]
    assert allreduces == [1] + [step for step in range(2, 7) for _ in range(2)]
    applies = [(e[4], e[5]["rows"]) for e in record.events if e[0] == "apply"]
    assert applies == [(step, 4) for step in range(1, 7)]


def test_rank_1_of_two_loads_only_its_share_of_each_epoch(one_rank, monkeypatch):
    # train reads its rank and world from torch.distributed: told it is rank 1 of 2, it
    # must take every other row of the shuffle from row 1, in batches of --batch-per-rank.
    # DDP's all-reduce runs in the real group of this process alone: the sum is this rank's
    # gradients, divided by the 2 ranks train was told of
    told = types.SimpleNamespace(get_rank=lambda: 1, get_world_size=lambda: 2)
    monkeypatch.setattr(train, "dist", told)
    args = train.parse(["--samples", "16", "--batch-per-rank", "4", "--epochs", "2"])
    record, model = train.train(args, torch.device("cpu"))
    assert_same_weights(model, plain_training(16, 4, 2, rank=1, world=2))
    assert record.rank == 1
    # 8 of the 16 rows a rank, in batches of 4: 2 steps an epoch
    applies = [(e[4], e[5]["rows"]) for e in record.events if e[0] == "apply"]
    assert applies == [(step, 4) for step in range(1, 5)]


# -- main: torchrun's environment for a world of one, its store on 127.0.0.1


def test_main_trains_a_world_of_one_and_rank_0_saves_everything(no_world, monkeypatch, tmp_path,
                                                                 capsys):  # fmt: skip
    port = checks.free_port()
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                        "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # as if rank 0 were on another host whose clock reads 1,000 s ahead: events move, whole
    monkeypatch.setattr(train, "_clock_offset", lambda host: 1000.0)
    threads = torch.get_num_threads()
    # env:// asks for a multi-tenant store on MASTER_PORT: it shares this one, on loopback
    store = loopback_store(port)
    try:
        assert train.main(["--samples", "8", "--batch-per-rank", "4", "--out", str(tmp_path)]) == 0
        assert torch.get_num_threads() == 1  # a node's ranks share its cores
        assert not dist.is_initialized()  # the group is destroyed
    finally:
        torch.set_num_threads(threads)
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        del store  # TCPStore's server closes the listening socket with its last store
    (who,) = json.loads((tmp_path / "ranks.json").read_text())
    assert who == {"rank": 0, "local_rank": 0, "node": 2, "host": socket.gethostname(),
                   "pid": train.os.getpid(), "device": "cpu", "steps": 2}  # fmt: skip
    weights = torch.load(tmp_path / "model.pt")
    assert set(weights) == {f"{layer}.{kind}" for layer in (1, 3, 5) for kind in ("weight", "bias")}
    trace = json.loads((tmp_path / "trace.json").read_text())
    phases = {(name, args["step"]) for name, _, _, _, args in x_events(trace)}
    assert {("apply", 1), ("apply", 2), ("backward", 2), ("optimizer", 2)} <= phases
    assert {track for _, track, _, _, _ in x_events(trace)} == {"rank:0 (cpu)"}
    assert all(0 <= duration < 60e6 for _, _, _, duration, _ in x_events(trace))  # in us
    assert capsys.readouterr().out.startswith("rank 0: 1 ranks, 2 steps each")
