"""dpkit.pipeline: a model split over lanes trains as the unsplit model does, and its bubble.

References are computed here: gradients from the unsplit model (a copy) on the whole batch,
idle shares from hand-made events, the formula from GPipe's paper, bytes from the shapes.
"""

from __future__ import annotations

import copy
import json
import statistics

import pytest
import torch
from torch import nn

import dpkit
import dpkit.viz
from dpkit import pipeline as pp
from dpkit.tracing import Event

WIDTH, BATCH = 64, 12


def data(rows: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(rows, WIDTH), torch.randint(0, WIDTH, (rows,))


def reference(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor):
    twin = copy.deepcopy(model)
    loss = nn.functional.cross_entropy(twin(inputs), targets)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in twin.named_parameters()}


@pytest.mark.parametrize(("stages", "micro_batches"), [(1, 1), (2, 1), (2, 5), (3, 4), (4, 12)])
def test_the_split_model_has_the_unsplit_models_loss_and_gradients(stages, micro_batches):
    model = pp.mlp_blocks(WIDTH, blocks=4)
    inputs, targets = data()  # 12 rows in 5 micro-batches: sizes 3, 3, 2, 2, 2
    expected_loss, expected = reference(model, inputs, targets)
    pipe = pp.pipeline(model, dpkit.virtual_devices(stages), micro_batches=micro_batches)
    loss = pipe.step(inputs, targets)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    for name, parameter in model.named_parameters():  # the model's own layers trained
        torch.testing.assert_close(parameter.grad, expected[name], rtol=1e-4, atol=1e-6)


def test_stages_are_contiguous_balanced_and_the_models_own_layers():
    model = nn.Sequential(nn.Linear(8, 100), nn.ReLU(), nn.Linear(100, 100), nn.Linear(100, 100))
    first, second = pp.split_model(model, 2)
    assert [*first, *second] == list(model)  # the same objects, in order
    # parameters 900, 0, 10100, 10100: only the last cut keeps each part under 20200
    assert len(first) == 3


def test_split_points_are_optimal_against_brute_force():
    import itertools

    sizes = [5, 1, 9, 2, 2, 7, 3]
    for stages in (1, 2, 3, 4):
        best = min(
            max(sum(sizes[a:b]) for a, b in zip((0, *cut), (*cut, len(sizes))))
            for cut in itertools.combinations(range(1, len(sizes)), stages - 1)
        )
        cut = pp.split_points(sizes, stages)
        got = max(sum(sizes[a:b]) for a, b in zip((0, *cut), (*cut, len(sizes))))
        assert got == best and len(cut) == stages - 1


def traced(stages: int, micro_batches: int, steps: int = 1):
    model = pp.mlp_blocks(WIDTH, blocks=4)
    pipe = pp.pipeline(model, dpkit.virtual_devices(stages), micro_batches=micro_batches)
    inputs, targets = data()
    with dpkit.trace() as recorded:
        for _ in range(steps):
            pipe.step(inputs, targets)
    return pipe, recorded


def test_the_trace_has_a_track_per_lane_and_follows_gpipes_schedule():
    p, m = 3, 4
    pipe, recorded = traced(p, m)
    events = recorded.events
    assert sorted({e.device for e in events}) == [f"virtual:{s} (cpu)" for s in range(p)]

    def event(phase, stage, micro):
        (found,) = [e for e in events if e.phase == phase and e.details["stage"] == stage
                    and e.details["micro_batch"] == micro]  # fmt: skip
        return found

    for s in range(p):
        forwards = [event("apply", s, j) for j in range(m)]
        backwards = [event("backward", s, j) for j in range(m)]
        # all forwards, then all backwards, last micro-batch first
        assert max(f.end for f in forwards) <= min(b.start for b in backwards)
        assert [b.details["micro_batch"] for b in sorted(backwards, key=lambda e: e.start)] == [
            3, 2, 1, 0
        ]  # fmt: skip
        for j in range(m):
            if s > 0:  # a stage's forward waits for the previous stage's
                assert event("apply", s - 1, j).end <= event("apply", s, j).start
            if s < p - 1:  # and its backward for the next stage's
                assert event("backward", s + 1, j).end <= event("backward", s, j).start


def test_received_bytes_are_the_activations_and_their_gradients():
    p, m = 2, 3
    _, recorded = traced(p, m)
    rows = [len(chunk) for chunk in torch.tensor_split(torch.zeros(BATCH), m)]
    for event in recorded.events:
        j = event.details["micro_batch"]
        receives = event.device == "virtual:1 (cpu)" if event.phase == "apply" else (
            event.device == "virtual:0 (cpu)"
        )  # fmt: skip
        assert event.nbytes == (rows[j] * WIDTH * 4 if receives else 0)


def test_the_chrome_trace_and_figures_work_on_a_pipeline_trace(tmp_path):
    _, recorded = traced(2, 2)
    path = recorded.to_chrome_trace(tmp_path / "pipeline.json")
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert len(spans) == 2 * 2 * 2  # stages x micro-batches x (forward, backward)
    assert "virtual" in dpkit.viz.timeline(recorded).axes[0].get_title()
    assert dpkit.viz.memory_per_device(recorded).axes
    held = {row["device"]: row for row in recorded.memory_summary()}
    half = sum(p.numel() * 4 for p in pp.mlp_blocks(WIDTH, 4).parameters()) // 2
    assert held["virtual:0 (cpu)"]["parameters"] == half  # each lane holds its stage only


def test_idle_fraction_of_hand_made_events():
    def e(device, start, end):
        return Event("apply", device, start, end, step=1)

    # two devices over 10 s: one busy 0-4 and 3-6 (overlap counted once: 6 s), one 2-10
    events = [e("a", 0, 4), e("a", 3, 6), e("b", 2, 10)]
    assert pp.busy_seconds(events) == {"a": 6, "b": 8}
    assert pp.idle_fraction(events) == pytest.approx(1 - 14 / 20)
    # a second step, 20-22 on both: each step's share is its own, and the default is the last
    later = [*events, Event("apply", "a", 20, 22, step=2), Event("apply", "b", 20, 22, step=2)]
    assert pp.idle_fraction(later, 1) == pytest.approx(1 - 14 / 20)
    assert pp.idle_fraction(later) == 0


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (3, 2), (4, 8)])
def test_the_predicted_schedule_of_equal_stages_has_the_formulas_bubble(p, m):
    assert pp.bubble_formula(p, m) == (p - 1) / (m + p - 1)
    predicted = pp.predict_schedule([(1.0, 2.0)] * p, m)
    assert pp.idle_fraction(predicted) == pytest.approx(pp.bubble_formula(p, m))
    assert "predicted" in predicted.hardware


def test_unequal_stages_idle_more_than_the_formula():
    predicted = pp.predict_schedule([(1.0, 2.0), (3.0, 6.0)], 4)
    assert pp.idle_fraction(predicted) > pp.bubble_formula(2, 4)


def test_measured_bubble_shrinks_with_micro_batches():
    # The naive split (m=1) runs one stage at a time, so every step leaves one of two stages
    # idle at least half of it (the formula's 0.5); GPipe's micro-batches fill that. Under
    # load a step can lose the overlap (CI: a median of 0.50 at m=4 beside 0.53 at m=1, with
    # another pytest worker on the second core), so the claim is on the best of 8 steps: only
    # an overlapped schedule can go below a half. Micro-batches of 64 rows of 512: of 16 rows
    # of 256, Python's cost per micro-batch filled the bubble on a loaded machine.
    model = pp.mlp_blocks(512, blocks=4)
    inputs, targets = torch.randn(256, 512), torch.randint(0, 512, (256,))
    lanes = dpkit.virtual_devices(2)
    idle = {
        m: pp.measure_steps(pp.pipeline(model, lanes, m), inputs, targets, 8)[1] for m in (1, 4)
    }
    # m=1: 0.51-0.62 per step here, quiet or under two 2-thread matmul loops; each step's own
    # share, not the whole trace's (0.9, with the gaps between steps counted as idle).
    assert 0.45 < min(idle[1]) and statistics.median(idle[1]) < 0.8
    # m=4: 0.2 by the formula; the best step 0.21-0.29 quiet, 0.26-0.38 under those loops.
    assert min(idle[4]) < 0.45


def test_a_failing_stage_stops_every_stage_and_names_itself():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    pipe = pp.Pipeline([nn.Linear(WIDTH, WIDTH), Boom()], dpkit.virtual_devices(2), 3)
    with pytest.raises(pp.StageFailed, match=r"stage 1 \(on virtual:1 \(cpu\), micro-batch 0\)"):
        pipe.step(*data())


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: pp.pipeline(pp.mlp_blocks(WIDTH, 1), dpkit.virtual_devices(2)), "stages=2"),
        (lambda: pp.split_model(nn.Linear(2, 2), 1), "nn.Sequential"),
        (lambda: pp.pipeline(pp.mlp_blocks(WIDTH), dpkit.virtual_devices(2), 0), "micro_batches"),
        (lambda: pp.pipeline(pp.mlp_blocks(WIDTH), dpkit.virtual_devices(2), 20).step(*data()),
         "micro_batches<=12"),
        (lambda: pp.Pipeline([nn.Linear(2, 2)], dpkit.virtual_devices(2)), "one device per stage"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_by_name(call, words):
    with pytest.raises((ValueError, TypeError), match=words):
        call()


def test_the_contrast_table_counts_each_strategys_bytes():
    model = pp.mlp_blocks(WIDTH, blocks=4)
    inputs, _ = data()
    rows = {row["strategy"].split()[0]: row for row in pp.contrast_table(model, inputs, 2)}
    params = sum(p.numel() * 4 for p in model.parameters())
    assert rows["DDP"]["bytes/step"] == 2 * params  # a ring over 2 ranks: each sends 1x
    # one cut, in the middle: BATCH x WIDTH floats forward and as many gradients back
    assert rows["model"]["bytes/step"] == 2 * BATCH * WIDTH * 4
    assert rows["DataParallel"]["bytes/step"] > rows["DDP"]["bytes/step"]


def test_stage_times_move_the_batch_and_targets_to_each_stages_device():
    # As on GPUs (stage s on cuda:s): under the placement check, CPU lanes are apart from
    # host memory, and the stages are timed in this (checked) thread.
    from dpkit.pipeline import bubble
    from dpkit.placement_check import checking_placement

    with checking_placement():
        lanes = dpkit.virtual_devices(2)
        pipe = pp.pipeline(pp.mlp_blocks(WIDTH), lanes, micro_batches=2)
        inputs, targets = torch.randn(8, WIDTH), torch.randint(0, WIDTH, (8,))  # on the host
        times: list[tuple[float, float]] = []
        bubble._time_stages(pipe, inputs, targets, 1, times)
    assert len(times) == 2 and all(forward > 0 and backward > 0 for forward, backward in times)


def test_the_default_model_is_the_same_on_every_call():
    # Notebook 07's stored outputs are computed from mlp_blocks(): seed 0 unless told
    first, again, seeded = pp.mlp_blocks(16, 2), pp.mlp_blocks(16, 2), pp.mlp_blocks(16, 2, seed=0)
    assert all(
        torch.equal(a, b) and torch.equal(a, c)
        for a, b, c in zip(first.parameters(), again.parameters(), seeded.parameters())
    )
    assert not torch.equal(first[0].weight, pp.mlp_blocks(16, 2, seed=1)[0].weight)
