"""DDP's settings do what notebook 09 says, measured on two gloo ranks:
``gradient_as_bucket_view=True`` removes the buckets' second copy of the gradients from
the memory a rank holds; a parameter the forward never uses fails the next step unless
``find_unused_parameters=True`` (a graph walk every step) or ``static_graph=True`` (none
after step 1); compression hooks (bf16, fp16, PowerSGD) send fewer bytes and add an error."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from dpkit import ddp
from dpkit.ddp import settings
from dpkit.models import WithUnusedLayer


def held(result, category):
    last = max(e.step for e in result.trace.events)
    return {row["device"]: row[category] for row in result.trace.memory_summary(step=last)}


@pytest.mark.parametrize("view", [False, True])
def test_gradient_as_bucket_view_removes_the_second_copy(view):
    result = ddp.run_ddp(
        "mlp", batch=16, steps=2, ddp_options={"gradient_as_bucket_view": view}, timeout=60
    )
    gradients, buckets = held(result, "gradients"), held(result, "buckets")
    for device, nbytes in gradients.items():
        assert nbytes == result.parameter_bytes
        assert buckets[device] == (0 if view else nbytes)


def test_an_unused_parameter_needs_find_unused_parameters():
    with_unused = dataclasses.replace(ddp.named_workload("mlp"), model=WithUnusedLayer)
    with pytest.raises(ddp.RankFailed, match="find_unused_parameters=True") as caught:
        ddp.run_ddp(with_unused, batch=16, steps=2, timeout=60)
    assert "in step 2" in str(caught.value)  # torch notices at the next step's forward
    result = ddp.run_ddp(
        with_unused, batch=16, steps=2, ddp_options={"find_unused_parameters": True}, timeout=60
    )
    assert len(result.step_times) == 2


def test_compression_hooks_send_fewer_bytes_at_the_error_they_add():
    # One launch, one fresh model per hook. bf16/fp16 (torch's bf16/fp16_compress_hook): the
    # bucket travels in a 2-byte type; relative to the largest gradient, the rounding stays
    # within a few units of that type's last place, far above float32's. PowerSGD (torch's
    # powerSGD_hook): each weight matrix n x m travels as (n + m) x R numbers, biases whole;
    # a higher rank sends more and loses less of the gradient.
    hooks = {name: {"compression": name} for name in ("bf16", "fp16", "powersgd", "powersgd-4")}
    results = settings.settings_sweep(hooks, "mlp", batch=16, steps=1, keep_gradients=True)
    reference = ddp.single_process_gradients("mlp", 16)
    errors = {name: settings.gradient_errors(r, reference) for name, r in results.items()}
    for name, tolerance in (("bf16", 2**-7), ("fp16", 2**-10)):
        sent = results[name].allreduce_bytes_per_step()
        assert set(sent.values()) == {results[name].parameter_bytes // 2}
        assert 1e-6 < errors[name][0] <= 4 * tolerance
    shapes = [p.shape for p in ddp.named_workload("mlp").model().parameters()]
    for rank in (1, 4):
        numbers = sum(
            (s[0] + s[1]) * rank if len(s) == 2 and 2 * (s[0] + s[1]) * rank < s[0] * s[1]
            else s.numel()
            for s in shapes
        )  # fmt: skip
        sent = results["powersgd" if rank == 1 else f"powersgd-{rank}"].allreduce_bytes_per_step()
        assert set(sent.values()) == {4 * numbers}
    assert 0.1 < errors["powersgd-4"][1] < errors["powersgd"][1] < 1


def test_an_unknown_compression_is_refused():
    for wrong in ("int8", "powersgd-0", "powersgd-x"):
        with pytest.raises(ValueError, match="compression must be None, 'bf16', 'fp16', 'powe"):
            ddp.run_ddp("mlp", compression=wrong)


def test_static_graph_trains_unused_parameters_without_find_unused_parameters_walk():
    # Both settings let a model whose forward skips a layer train, to the same gradients;
    # find_unused_parameters walks the autograd graph after every forward, static_graph
    # only in step 1. The two take their steps in turn, so each step's pair of forwards met
    # the machine in the same state: their median difference is the walk (0.07-0.14 ms
    # here in 6 runs on a loaded machine, 56 pairs, 15-30 % of the forward).
    both = {"find": {"find_unused_parameters": True}, "static": {"static_graph": True}}
    with_unused = dataclasses.replace(ddp.named_workload("mlp"), model=WithUnusedLayer)
    results = settings.settings_sweep(both, with_unused, batch=16, steps=30, keep_gradients=True)
    for result in results.values():
        assert len(result.step_times) == 30
        assert "unused.weight" not in result.gradients[0]  # no gradient, and no error
        for name, gradient in result.gradients[0].items():
            assert (gradient == results["find"].gradients[0][name]).all()
    walk = settings.forward_difference(results["find"], results["static"])
    forward = statistics.median(settings.forward_times(results["static"]))
    assert walk > 0.05 * forward, (walk, forward)  # 15-30 % measured; 0 +- 3 % without it


def test_an_emulated_link_holds_each_all_reduce_for_its_ring_s_bytes():
    link = 62.5e6  # 0.5 Gb/s: the demo MLP's one bucket takes 15 ms, loopback far less
    result = ddp.run_ddp("mlp", batch=16, steps=2, emulated_link=link, timeout=60)
    allreduces = [e for e in result.trace.events if e.phase == "allreduce"]
    assert allreduces
    for event in allreduces:
        assert event.details["emulated_link_bytes_per_s"] == link  # labelled as emulated
        assert event.duration >= event.details["ring_sent_bytes"] / link - 1e-3
    with pytest.raises(ValueError, match="emulated_link=0"):
        ddp.run_ddp("mlp", emulated_link=0)
