"""DDP's settings do what notebook 09 says, measured on two gloo ranks:
``gradient_as_bucket_view=True`` removes the buckets' second copy of the gradients from
the memory a rank holds, and a parameter the forward never uses fails the next step
unless ``find_unused_parameters=True``."""

from __future__ import annotations

import dataclasses

import pytest

from dpkit import ddp
from dpkit.ddp.workload import WithUnusedLayer


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


@pytest.mark.parametrize("compression, tolerance", [("bf16", 2**-7), ("fp16", 2**-10)])
def test_compressed_buckets_send_half_the_bytes_and_round(compression, tolerance):
    # torch's bf16/fp16_compress_hook: the bucket travels in a 2-byte type. Relative to the
    # largest gradient, the rounding stays within a few units of that type's last place, and
    # is far above float32's (which the uncompressed all-reduce keeps: test_ddp.py)
    result = ddp.run_ddp(
        "mlp", batch=16, steps=1, keep_gradients=True, compression=compression, timeout=60
    )
    sent = result.allreduce_bytes_per_step()
    assert set(sent.values()) == {result.parameter_bytes // 2}
    expected = ddp.single_process_gradients("mlp", 16)
    errors = [
        abs(result.gradients[0][name] - gradient).max() / abs(gradient).max()
        for name, gradient in expected.items()
    ]
    assert 1e-6 < max(errors) <= 4 * tolerance


def test_an_unknown_compression_is_refused():
    with pytest.raises(ValueError, match="compression must be None, 'bf16' or 'fp16'"):
        ddp.run_ddp("mlp", compression="int8")


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
