"""DataParallel and DDP side by side, and the bucket size sweep: what each moves and holds.

Expected bytes come from the model here (parameter numel x element size) and from the
ring's formula, never from dpkit's output.
"""

from __future__ import annotations

import pytest

from dpkit import ddp
from dpkit.models import build_model

pytestmark = pytest.mark.placement_check  # DataParallel's side must put its model on lane 0

NPROC, BATCH, STEPS, REPEATS = 2, 16, 2, 2


def parameter_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in build_model("mlp").parameters())


@pytest.fixture(scope="module")
def comparison():
    return ddp.compare_with_data_parallel(
        "mlp", nproc=NPROC, batch=BATCH, steps=STEPS, repeats=REPEATS, timeout=120,
        sweep_caps_mb=(0.001,),
    )  # fmt: skip


def test_both_are_timed_in_interleaved_blocks_without_warm_up(comparison):
    assert len(comparison.data_parallel_step_times) == STEPS * REPEATS
    assert len(comparison.ddp.step_times) == STEPS * REPEATS
    for row in comparison.rows():
        assert row["steps"] == STEPS * REPEATS
        assert 0 < row["q1_ms"] <= row["median_ms"] <= row["q3_ms"]
    # Interleaved: DataParallel's blocks and DDP's alternate on the one clock.
    dp_steps = sorted({e.step for e in comparison.data_parallel.events})
    assert len(dp_steps) == STEPS * (REPEATS + 1)
    dp_start = min(e.start for e in comparison.data_parallel.events)
    dp_end = max(e.end for e in comparison.data_parallel.events)
    ddp_events = comparison.ddp.trace.events
    assert any(dp_start < e.start < dp_end for e in ddp_events)


def test_ddp_ranks_move_what_a_ring_moves_and_dp_funnels_through_device_0(comparison):
    size = parameter_bytes()
    ring = 2 * (NPROC - 1) / NPROC * size  # sent by each rank, and as much received
    assert ddp.traffic_per_device(comparison.ddp.trace) == {
        f"rank:{rank} (cpu)": round(2 * ring) for rank in range(NPROC)
    }
    dp = ddp.traffic_per_device(comparison.data_parallel)
    lane0, others = dp["virtual:0 (cpu)"], [v for k, v in dp.items() if k != "virtual:0 (cpu)"]
    # lane 1 gets its chunk and the parameters, returns its outputs and its gradients
    rows = BATCH // NPROC
    lane1 = rows * 28 * 28 * 4 + size + rows * 10 * 4 + rows * 10 * 4 + size
    assert others == [lane1]
    assert lane0 == sum(others)  # every copy goes through device 0


def test_dp_holds_the_gradients_on_device_0_only(comparison):
    dp = {row["device"]: row for row in comparison.data_parallel.memory_summary()}
    assert dp["virtual:0 (cpu)"]["gradients"] == parameter_bytes()
    assert dp["virtual:1 (cpu)"]["gradients"] == 0
    ranks = comparison.ddp.trace.memory_summary()
    assert {row["gradients"] for row in ranks} == {parameter_bytes()}  # no device 0


def test_the_comparison_prints_a_table(comparison):
    text = str(comparison)
    assert "DataParallel" in text and "DDP" in text and "median_ms" in text
    assert "virtual devices on the CPU" in text and "DistributedDataParallel" in text


def test_bucket_sweep_counts_all_reduces_per_cap():
    rows = ddp.bucket_sweep((0.001, 25.0), "mlp", nproc=NPROC, batch=BATCH, steps=2)
    small, large = rows
    assert (small["bucket_cap_mb"], large["bucket_cap_mb"]) == (0.001, 25.0)
    # 25 MiB holds the ~0.9 MB MLP in one bucket; 1 KB closes a bucket at every weight
    # matrix (its bias joins it): the MLP has three.
    assert (small["allreduces/step"], large["allreduces/step"]) == (3, 1)
    assert small["bytes/step/rank"] == large["bytes/step/rank"] == parameter_bytes()
    assert large["ring sent/rank"] == round(2 * (NPROC - 1) / NPROC * parameter_bytes())
    assert all(row["median_ms"] > 0 for row in rows)
    assert "allreduces/step" in str(rows)


def test_the_same_ranks_then_train_at_the_other_bucket_caps(comparison):
    (swept,) = comparison.sweep
    assert swept.pids == comparison.ddp.pids  # no second launch
    assert len(swept.step_times) == STEPS * REPEATS  # warm-up left out, as for the first cap
    rows = comparison.sweep_rows()
    assert [row["bucket_cap_mb"] for row in rows] == [25.0, 0.001]
    assert [row["allreduces/step"] for row in rows] == [1, 3]  # one per weight matrix
    assert {row["bytes/step/rank"] for row in rows} == {parameter_bytes()}
