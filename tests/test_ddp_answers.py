"""dpkit.ddp's plan and communication hook, their answers computed by hand.

The plan's arithmetic (what ZeRO-1, FSDP and a pipeline hold and take, from DDP's
prediction) is checked on predictions made up here, so that every number follows from the
module doc by hand; the choice on hand-made rows. The hook runs on torch's own all-reduce
and PowerSGD hook, in this process (a gloo group of one rank, ``nproc`` set to what a
bucket would be divided by), on a bucket built here as DDP builds one (a flat buffer, the
gradients views into it). Found missing by mutation testing beyond the core (issue 32):
the ranks' tests run the hook in other processes, where mutation testing cannot follow.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

import dpkit.cost as cost
from dpkit.ddp import hook
from dpkit.ddp import plan as plan_module
from dpkit.ddp.plan import choose, plan
from dpkit.ddp.record import RankRecorder
from dpkit.models import PREDICTION_MODELS

GiB = 2**30

# --------------------------------------------------------------------------------------
# The plan on made-up predictions

# DDP over 4 devices (64 rows, 16 a device) and one device (the whole 64 rows), bytes per
# device by category; the pipeline's micro-batch, m = 4 x 4 = 16 of 4 rows, on one device.
# (Not multiples of 4: a share of the 4 devices is rounded down to whole bytes.)
DDP_HELD = {"parameters": 403, "input": 40, "activations": 80, "outputs": 8, "gradients": 403,
            "buckets": 403, "optimizer": 806}  # fmt: skip
ONE_HELD = {"parameters": 403, "input": 160, "activations": 322, "outputs": 32,
            "gradients": 403, "buckets": 403, "optimizer": 806}  # fmt: skip


def made_up_predictions(monkeypatch):
    """cost.predict and cost.allreduce replaced by fixed answers; returns their calls."""
    calls = []

    def predict(model, sample, batch, n, machine, strategy, optimizer):
        calls.append((strategy, batch, n, optimizer))
        if strategy == "dp":
            return SimpleNamespace(held=[{}], memory_per_device=[700, 1000, 800, 800],
                                   step_time=0.010)  # fmt: skip
        if n > 1:
            return SimpleNamespace(held=[dict(DDP_HELD)], memory_per_device=[2128] * n,
                                   step_time=0.004)  # fmt: skip
        if batch == 64:
            return SimpleNamespace(held=[dict(ONE_HELD)], memory_per_device=[2512],
                                   step_time=0.012)  # fmt: skip
        return SimpleNamespace(held=[{}], memory_per_device=[0], step_time=0.001)

    def allreduce(nbytes, n, machine):
        calls.append(("allreduce", nbytes, n))
        return 0.002

    monkeypatch.setattr(cost, "predict", predict)
    monkeypatch.setattr(cost, "allreduce", allreduce)
    # two_linears gives the bytes; the made-up model is deep enough for a stage per device
    monkeypatch.setattr(plan_module, "_layers", lambda model: 16)
    return calls


def two_linears() -> nn.Module:
    # Linear(10, 20): 220 floats, 880 bytes (the largest layer); Linear(20, 5): 105, 420
    return nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 5))


# ZeRO-1's bytes exactly (below): it fits
MACHINE = dataclasses.replace(cost.preset("8xA100-SXM-NVLink"), memory_capacity=1538)


def test_the_plan_derives_zero_fsdp_and_the_pipeline_from_ddp_by_hand(monkeypatch):
    calls = made_up_predictions(monkeypatch)
    rows = {r["strategy"]: r for r in plan(two_linears(), None, 64, 4, MACHINE, "sgd")}
    assert sorted(calls) == sorted([
        ("dp", 64, 4, "sgd"), ("ddp", 64, 4, "sgd"), ("ddp", 64, 1, "sgd"),
        ("ddp", 4, 1, "sgd"),  # a micro-batch: 64 rows / 16
        ("allreduce", 1300, 4),  # the parameters' bytes: 880 + 420
    ])  # fmt: skip
    expected = {
        "DataParallel": (1000, True, 10.0),  # the fullest device
        "DDP": (2128, False, 4.0),
        # DDP's bytes with the optimizer's 800 / 4; its step + half an all-reduce (1 ms)
        "ZeRO-1": (403 + 40 + 80 + 8 + 403 + 403 + 201, True, 5.0),  # 1,538
        # parameters, gradients, optimizer / 4, no buckets, + the largest layer's 880
        "FSDP": (100 + 40 + 80 + 8 + 100 + 201 + 880, True, 5.0),
        # one device's bytes with parameters, gradients, optimizer and activations / 4, no
        # buckets; a micro-batch's 1 ms / 4 stages x (16 + 4 - 1)
        "pipeline": (100 + 160 + 80 + 32 + 100 + 201, True, 0.25 * 19),
    }
    for name, (nbytes, fits, ms) in expected.items():
        assert (rows[name]["predicted bytes/device"], rows[name]["fits"]) == (nbytes, fits)
        assert rows[name]["predicted step ms"] == pytest.approx(ms)
    assert {name: r["how"] for name, r in rows.items()} == {
        "DataParallel": "dpkit.cost.predict, 'dp'",
        "DDP": "dpkit.cost.predict, 'ddp'",
        "ZeRO-1": "DDP, state / n; + an all-gather",
        "FSDP": "DDP, all / n + a layer; + an all-gather",
        "pipeline": "a micro-batch's step / n x (m + n - 1), m=16; sends left out",
    }


def test_a_prediction_without_optimizer_state_shards_none(monkeypatch):
    # plain SGD holds no optimizer state: ZeRO-1 on two devices holds what DDP does
    held = {"parameters": 400, "gradients": 400}

    def predict(model, sample, batch, n, machine, strategy, optimizer):
        return SimpleNamespace(held=[dict(held)], memory_per_device=[800] * n, step_time=0.001)

    monkeypatch.setattr(cost, "predict", predict)
    monkeypatch.setattr(cost, "allreduce", lambda nbytes, n, machine: 0.0)
    rows = {r["strategy"]: r for r in plan(two_linears(), None, 8, 2, MACHINE, "sgd")}
    assert rows["ZeRO-1"]["predicted bytes/device"] == 800


def test_on_one_device_the_plan_is_no_wrapper(monkeypatch):
    # torch's DataParallel on one device calls the module; DDP, ZeRO, FSDP and a pipeline of
    # one stage share out nothing and only add buckets or copies
    made_up_predictions(monkeypatch)
    rows = plan(two_linears(), None, 64, 1, MACHINE)
    by = {r["strategy"]: r for r in rows}
    assert by["DataParallel"]["fits"] and by["DataParallel"]["how"].startswith("one device")
    assert [name for name, row in by.items() if row["fits"]] == ["DataParallel"]
    assert choose(rows, MACHINE.memory_capacity).startswith("no wrapper: one device")


def test_lanes_of_one_machine_fit_in_their_share_of_its_memory(monkeypatch):
    made_up_predictions(monkeypatch)
    # DDP holds 2,128 bytes a device (made_up_predictions): 4 lanes need 8,512 of the host's
    gpus = dataclasses.replace(MACHINE, memory_capacity=4000)
    fits = {r["strategy"]: r["fits"] for r in plan(two_linears(), None, 64, 4, gpus)}
    assert fits["DDP"]  # 4,000 bytes on each of 4 GPUs
    lanes = dataclasses.replace(gpus, virtual_lanes=True)
    fits = {r["strategy"]: r["fits"] for r in plan(two_linears(), None, 64, 4, lanes)}
    assert not fits["DDP"]  # 4,000 bytes shared by 4 lanes
    roomy = dataclasses.replace(lanes, memory_capacity=4 * 2128)
    fits = {r["strategy"]: r["fits"] for r in plan(two_linears(), None, 64, 4, roomy)}
    assert fits["DDP"]


@pytest.mark.parametrize(
    ("batch", "micro", "rows"), [(8, 8, 1), (40, 16, 2), (12, 12, 1), (1, 1, 1)]
)
def test_the_pipeline_takes_four_micro_batches_a_stage_or_a_row_each(monkeypatch, batch, micro,
                                                                    rows):  # fmt: skip
    calls = made_up_predictions(monkeypatch)
    table = plan(two_linears(), None, batch, 4, MACHINE)
    assert ("ddp", rows, 1, "adam") in calls  # a micro-batch of batch // m rows
    (pipeline,) = [r for r in table if r["strategy"] == "pipeline"]
    assert pipeline["predicted step ms"] == pytest.approx(0.25 * (micro + 3))
    assert f"m={micro};" in pipeline["how"]


def test_dataparallel_is_left_out_beyond_one_machine(monkeypatch):
    calls = made_up_predictions(monkeypatch)
    rows = {r["strategy"]: r for r in plan(two_linears(), None, 64, 16, "2x8xA100-IB-HDR")}
    assert not [call for call in calls if call[0] == "dp"]
    left_out = rows["DataParallel"]
    assert (left_out["predicted bytes/device"], left_out["fits"]) == (0, False)
    assert left_out["predicted step ms"] == math.inf
    assert left_out["how"] == "one machine only (8)"
    assert rows["DDP"]["fits"]  # 2,128 bytes of 80 GiB


def test_the_largest_layer_is_the_one_with_most_parameter_bytes_of_its_own():
    # the Sequential holds 1,300 bytes through its children, none of its own
    assert plan_module._largest_layer_bytes(two_linears()) == 880
    assert plan_module._largest_layer_bytes(nn.ReLU()) == 0


def row(strategy: str, gib: float, ms: float) -> dict:
    return {"strategy": strategy, "predicted bytes/device": int(gib * GiB),
            "predicted step ms": ms}  # fmt: skip


def rows_of(pipeline_ms: float, ddp_ms: float = 10.0) -> list[dict]:
    return [row("DataParallel", 60, 40.0), row("DDP", 50, ddp_ms), row("ZeRO-1", 30, 12.0),
            row("FSDP", 20, 14.0), row("pipeline", 10, pipeline_ms)]  # fmt: skip


def test_the_choice_is_the_simplest_that_fits_unless_another_is_twice_as_fast():
    # 40 GiB a device: ZeRO-1, FSDP and the pipeline fit; ZeRO-1 is the simplest.
    switched = choose(rows_of(pipeline_ms=5.0), 40 * GiB)  # 12 / 5 = 2.4x
    assert switched.startswith("pipeline: it fits and is predicted 2.4x faster than ZeRO-1")
    assert "(30 of 40.0 GiB a device)" in switched
    assert switched.endswith("; DataParallel, DDP: would not fit, or cannot run here")
    assert choose(rows_of(pipeline_ms=6.0), 40 * GiB).startswith("pipeline:")  # 2.0x: enough
    kept = choose(rows_of(pipeline_ms=6.1), 40 * GiB)  # 1.97x
    assert kept.startswith("ZeRO-1: the simplest engine that fits (30 of 40.0 GiB a device)")
    assert "; pipeline is predicted only 1.97x faster, less than the 2x needed" in kept
    # all fit and the simplest is the fastest: nothing more to say
    assert choose(rows_of(6.0, ddp_ms=4.0), 64 * GiB) == (
        "DDP: the simplest engine that fits (50 of 64.0 GiB a device)"
    )


def test_a_strategy_that_cannot_run_does_not_fit_and_is_not_the_smallest():
    rows = rows_of(5.0)
    rows[0] = row("DataParallel", 0, math.inf)  # beyond one machine
    assert choose(rows, 100 * GiB).endswith("; DataParallel: would not fit, or cannot run here")
    assert choose(rows, 5 * GiB) == (
        "nothing fits 5.0 GiB a device: the smallest is pipeline at 10 GiB; add devices, shard "
        "further (FSDP with a pipeline), or shrink the batch (activations) or the optimizer state"
    )


def test_dpkit_plan_defaults_to_every_device_of_the_preset(monkeypatch, capsys):
    made_up_predictions(monkeypatch)
    assert plan_module.main(["--model", "mlp", "--hardware", "2x8xA100-IB-HDR"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("mlp on 16 x A100, global batch 256 (every number predicted")
    assert "one machine only (8)" in printed
    assert plan_module.main(["--model", "mlp", "--devices", "2", "--batch", "32"]) == 0
    assert capsys.readouterr().out.startswith("mlp on 2 x A100, global batch 32 ")


# --------------------------------------------------------------------------------------
# The communication hook


@pytest.mark.parametrize(
    ("compression", "rank"),
    [(None, None), ("bf16", None), ("fp16", None), ("powersgd", 1), ("powersgd-1", 1),
     ("powersgd-4", 4), ("powersgd12", 12)],
)  # fmt: skip
def test_the_powersgd_rank_is_the_number_after_powersgd(compression, rank):
    assert hook.powersgd_rank(compression) == rank


@pytest.mark.parametrize("wrong", ["powersgd-0", "powersgd-x", "powersgd--2", "powersgd-1.5",
                                   "powersgd-", "powersgd-\u0663", "int8", "", 2,
                                   "BF16"])  # fmt: skip
def test_anything_else_is_refused_naming_what_is_accepted(wrong):
    with pytest.raises(ValueError, match=r"^compression must be None, 'bf16', 'fp16', 'powersgd'"):
        hook.powersgd_rank(wrong)


def test_the_powersgd_state_compresses_from_step_one_without_feedback_or_warm_start():
    state = hook.powersgd_state("powersgd-3")
    assert state.matrix_approximation_rank == 3
    assert state.start_powerSGD_iter == 0
    assert (state.use_error_feedback, state.warm_start) == (False, False)
    assert state.process_group is None  # the default group: DDP's


@pytest.fixture(scope="module")
def one_rank():
    """A gloo process group of this process alone: all-reduce returns what it is given."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    # The all-reduces' works and futures go first: the group freed in one of gloo's threads
    # would join that thread from itself ('Resource deadlock avoided', an abort).
    gc.collect()
    dist.destroy_process_group()


class Bucket:
    """A bucket as DDP makes one: a flat buffer; each gradient a view into it."""

    def __init__(self, parameters, index=1, last=True):
        self._parameters, self._index, self._last = parameters, index, last
        self._buffer = torch.cat([p.grad.reshape(-1) for p in parameters])
        offsets = [0]
        for p in parameters:
            offsets.append(offsets[-1] + p.numel())
        self._gradients = [self._buffer[a:b].view(p.shape)
                           for p, a, b in zip(parameters, offsets, offsets[1:])]  # fmt: skip

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._gradients

    def parameters(self):
        return self._parameters

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def set_buffer(self, tensor):
        self._buffer.copy_(tensor)


def recorder_for(model: nn.Module, nproc: int, **options) -> RankRecorder:
    recorder = RankRecorder(0, nproc, torch.device("cpu"), None, **options)
    recorder._names = {p.data_ptr(): name for name, p in model.named_parameters()}
    recorder.step = 3
    return recorder


def with_gradients(model: nn.Module, *values: float) -> nn.Module:
    for p, value in zip(model.parameters(), values):
        p.grad = torch.full_like(p, value)
    return model


def test_a_bucket_is_all_reduced_as_a_mean_and_timed_with_its_bytes(one_rank):
    # Linear(3, 2): weight 6 floats, bias 2; a bucket of 8 floats (32 bytes). Divided by 4
    # ranks before the sum, as torch's allreduce_hook does: 2.0 becomes 0.5 (one rank here
    # sums alone). A ring over 4 ranks sends 2 x 3 / 4 of 32 bytes from each: 48.
    model = with_gradients(nn.Linear(3, 2), 2.0, 8.0)
    recorder = recorder_for(model, 4)
    bucket = Bucket(list(model.parameters()), index=1, last=True)
    started = time.perf_counter()
    result = hook.recorded_allreduce(recorder, bucket).wait()
    assert result.tolist() == [0.5] * 6 + [2.0] * 2
    (event,) = recorder.events
    phase, start, end, nbytes, step, details = event
    assert (phase, nbytes, step) == ("allreduce", 32, 3)
    assert started <= start <= end <= time.perf_counter()
    assert details == {"bucket": 1, "parameters": ["weight", "bias"], "last_bucket": True,
                       "ring_sent_bytes": 48}  # fmt: skip
    # the bucket is a second copy of the gradients here (none is a view into it): all 32
    assert recorder.bucket_bytes == {3: 32}
    bucket = Bucket(list(model.parameters()), index=0, last=False)
    model.bias.grad = bucket.gradients()[1]  # gradient_as_bucket_view for the bias alone
    hook.recorded_allreduce(recorder, bucket).wait()
    assert recorder.bucket_bytes == {3: 32 + 32 - 8}  # the bias's 8 bytes are shared
    assert recorder.events[1][5]["last_bucket"] is False and recorder.events[1][5]["bucket"] == 0


@pytest.mark.parametrize(
    ("compression", "travels_as"),
    # 1/3 in the 2-byte types: bfloat16 keeps 8 bits of mantissa (0.333984375), float16
    # 11 (0.333251953125); divided by 4 exactly in either
    [("bf16", 0.333984375 / 4), ("fp16", 0.333251953125 / 4)],
)
def test_a_compressed_bucket_travels_in_half_the_bytes_and_comes_back_rounded(
    one_rank, compression, travels_as
):
    model = with_gradients(nn.Linear(3, 2), 1 / 3, 1 / 3)
    recorder = recorder_for(model, 4, compression=compression)
    bucket = Bucket(list(model.parameters()))
    result = hook.recorded_allreduce(recorder, bucket).wait()
    assert result.dtype == torch.float32 and result.data_ptr() == bucket.buffer().data_ptr()
    assert result.tolist() == [travels_as] * 8
    ((_, _, _, nbytes, _, details),) = recorder.events
    assert nbytes == 16  # 8 values of 2 bytes
    assert details["compression"] == compression and details["ring_sent_bytes"] == 24
    assert recorder.bucket_bytes == {3: 32}  # the bucket itself stays float32


@pytest.mark.parametrize(("compression", "numel"), [("powersgd", 14 + 6), ("powersgd-2", 48 + 6)])
def test_powersgd_sends_the_low_rank_factors_torch_counts(one_rank, compression, numel):
    # Linear(8, 6): its 6 x 8 weight travels at rank 1 as P (6 x 1) and Q (8 x 1), 14
    # numbers, as (6 + 8) x 1 x 2 < 48 (torch's min_compression_rate 2); at rank 2 as 28
    # numbers, but 28 x 2 > 48, so torch sends it whole. The bias (6 x 1) is never worth
    # compressing. 4 bytes a number.
    torch.manual_seed(0)
    model = with_gradients(nn.Linear(8, 6), 1.0, 1.0)
    recorder = recorder_for(model, 1, compression=compression)
    bucket = Bucket(list(model.parameters()))
    result = hook.recorded_allreduce(recorder, bucket).wait()
    assert result.shape == (54,)  # the whole bucket back
    hook.recorded_allreduce(recorder, Bucket(list(model.parameters()))).wait()
    ((phase, _, _, nbytes, _, details), again) = recorder.events
    assert (phase, nbytes) == ("allreduce", numel * 4)
    assert again[3] == numel * 4  # the second bucket's own, not both
    assert details["compression"] == compression and details["ring_sent_bytes"] == 0  # 1 rank
    # an all-ones matrix is rank 1: PowerSGD returns it as it was (the bias, uncompressed)
    torch.testing.assert_close(model.weight.grad, torch.ones(6, 8))


def test_an_emulated_link_holds_each_bucket_for_its_bytes_one_after_another():
    # 50 bytes on a link of 1,000 bytes/s: 0.05 s. Two buckets handed over at once: the
    # second waits for the first, so it ends 0.1 s after both began.
    recorder = SimpleNamespace(emulated_link=1000.0, link_free_at=0.0)
    start = time.perf_counter()
    first, second = {"ring_sent_bytes": 50}, {"ring_sent_bytes": 50}
    hook.hold_for_the_emulated_link(recorder, start, first)
    assert recorder.link_free_at == pytest.approx(start + 0.05)
    assert time.perf_counter() >= start + 0.05
    hook.hold_for_the_emulated_link(recorder, start, second)
    assert recorder.link_free_at == pytest.approx(start + 0.1)
    assert time.perf_counter() >= start + 0.1
    assert first["emulated_link_bytes_per_s"] == second["emulated_link_bytes_per_s"] == 1000.0
    # a bucket handed over after the link was free begins when it was handed over; its
    # time on the link over already (it began 1 s ago), it is not held
    recorder.link_free_at = 0.0
    now = time.perf_counter()
    hook.hold_for_the_emulated_link(recorder, now - 1.0, {"ring_sent_bytes": 50})
    assert recorder.link_free_at == pytest.approx(now - 1.0 + 0.05)
    assert time.perf_counter() - now < 0.04


def test_the_all_reduce_ends_once_the_emulated_link_has_carried_the_ring_s_bytes(one_rank):
    # a bucket of 32 bytes over 4 ranks: 48 bytes sent by each, 0.048 s at 1,000 bytes/s
    model = with_gradients(nn.Linear(3, 2), 1.0, 1.0)
    recorder = recorder_for(model, 4, emulated_link=1000.0)
    hook.recorded_allreduce(recorder, Bucket(list(model.parameters()))).wait()
    ((_, start, end, _, _, details),) = recorder.events
    assert end - start >= 0.048 and details["emulated_link_bytes_per_s"] == 1000.0


def test_dpkit_plan_s_options_their_defaults_choices_and_help(monkeypatch, capsys):
    import re

    from dpkit.cli import main as dpkit_main

    made_up_predictions(monkeypatch)
    monkeypatch.setenv("COLUMNS", "200")  # argparse's help on one line per option

    def says(text: str, printed: str) -> bool:  # the text whole, as its own words
        return re.search(rf"(^|\s){re.escape(text)}(\s|$)", printed, re.MULTILINE) is not None

    assert plan_module.main([]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("wide-mlp on 8 x A100, global batch 256 ")
    assert re.search(r"^choice: \w", printed, re.MULTILINE)  # the choice on a line of its own
    refusals = ((["--model", "resnet-9000"], "invalid choice"),
                (["--hardware", "a-toaster"], "'a-toaster' is not a preset"))  # fmt: skip
    for wrong, says_why in refusals:
        with pytest.raises(SystemExit) as refused:
            plan_module.main(wrong)
        assert refused.value.code == 2 and says_why in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_module.main(["--help"])
    printed = capsys.readouterr().out
    assert printed.startswith("usage: python -m dpkit.ddp.plan ")
    assert says(plan_module.DESCRIPTION, printed)
    for text in ("a model of dpkit.models, default: wide-mlp", "--hardware PRESET",
                 "a preset, any case (dpkit predict --list), default: 8xA100-SXM-NVLink",
                 "global batch, default: 256", "default: all of the preset's"):  # fmt: skip
        assert says(text, printed), text
    assert "{" + ",".join(PREDICTION_MODELS) + "}" in printed
    with pytest.raises(SystemExit):
        dpkit_main(["--help"])
    assert says("which engine for a model, batch and machine (predicted memory and time)",
                capsys.readouterr().out)  # fmt: skip
    with pytest.raises(SystemExit):
        dpkit_main(["plan", "--help"])
    assert says(plan_module.DESCRIPTION, capsys.readouterr().out)
