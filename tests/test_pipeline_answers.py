"""dpkit.pipeline's answers, computed by hand: the bubble of one step (not of every step
together), a predicted schedule's events, the sweep's medians and quartiles, where stages
are cut, what a stage holds, and the bytes each strategy sends.

Each expected number is worked out in the comment beside it from the definitions in the
module docs (GPipe's schedule, ``1 - busy / (p x span)``, ...), not read back from the code.
Found missing by mutation testing beyond the core (issue 32): the tests before these checked
that the code ran and that numbers were on the right side of a bound.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import dpkit
from dpkit import pipeline as pp
from dpkit.pipeline import bubble
from dpkit.pipeline.schedule import check_micro_batches
from dpkit.pipeline.stages import parameter_count, place_stages
from dpkit.tracing import Event

WIDTH, ROWS = 16, 6


def e(device: str, start: float, end: float, step: int = 1, phase: str = "apply") -> Event:
    return Event(phase, device, start, end, step=step)


# --------------------------------------------------------------------------------------
# The bubble


@pytest.mark.parametrize(
    ("p", "m", "idle"), [(1, 1, 0.0), (2, 1, 1 / 2), (2, 4, 1 / 5), (4, 8, 3 / 11), (3, 2, 1 / 2)]
)
def test_the_formula_is_p_minus_one_over_m_plus_p_minus_one(p, m, idle):
    assert pp.bubble_formula(p, m) == pytest.approx(idle, abs=1e-15)


def test_busy_seconds_count_overlaps_once_in_any_order():
    # a: 5-7, then 0-4 holding 1-2 (nested) and 4-5 touching it: 0-7 busy, 7 s;
    # b: 3-3.5 and 3-6 (same start): 3 s
    events = [e("a", 5, 7), e("a", 1, 2), e("a", 0, 4), e("a", 4, 5), e("b", 3, 3.5), e("b", 3, 6)]
    assert pp.busy_seconds(events) == {"a": 7, "b": 3}


def two_steps() -> list[Event]:
    # step 1 over 0-3: a busy 0-2, b busy 1-3: 4 of 2 x 3 device-seconds, idle 1/3
    # step 2 over 10-12: a busy 10-11, b 11-12: 2 of 2 x 2, idle 1/2
    # (both steps together would be 6 of 2 x 12: idle 3/4, the bubble of no step)
    return [e("a", 0, 2), e("b", 1, 3), e("a", 10, 11, 2), e("b", 11, 12, 2)]


def test_the_idle_fraction_is_one_steps_and_by_default_the_last():
    events = two_steps()
    assert pp.idle_fraction(events, step=1) == pytest.approx(1 / 3)
    assert pp.idle_fraction(events, step=2) == pytest.approx(1 / 2)
    assert pp.idle_fraction(events) == pytest.approx(1 / 2)
    assert pp.idle_fraction(list(reversed(events))) == pytest.approx(1 / 2)  # last by number


def test_the_idle_fraction_reads_a_trace_and_refuses_an_empty_one():
    with dpkit.trace() as recorded:
        pass
    with pytest.raises(ValueError, match="^the trace has no events"):
        pp.idle_fraction(recorded)
    predicted = pp.predict_schedule([(1.0, 1.0)] * 2, 1)  # a Trace: idle (p - 1) / p = 1/2
    assert pp.idle_fraction(predicted) == pytest.approx(1 / 2)


def test_measured_steps_each_have_their_own_bubble():
    # Each step's idle share is that step's events' alone (notebook 07's sweep): a naive
    # split of 2 stages idles about half of each step, never the 0.9 of several steps
    # with the gaps between them counted as idle.
    pipe = pp.pipeline(pp.mlp_blocks(WIDTH, 4), dpkit.virtual_devices(2), micro_batches=1)
    inputs, targets = data()
    recorded, idle = pp.measure_steps(pipe, inputs, targets, 3)
    steps = sorted({event.step for event in recorded.events})
    assert len(steps) == len(idle) == 3
    for step, measured in zip(steps, idle):
        events = [event for event in recorded.events if event.step == step]
        span = max(x.end for x in events) - min(x.start for x in events)
        busy = sum(x.end - x.start for x in events)  # one stage at a time: no overlaps
        assert measured == pytest.approx(1 - busy / (2 * span))
    # the gradients left are one step's, as one step of the unsplit model gives
    expected = pp.single_device_gradients(pp.mlp_blocks(WIDTH, 4), inputs, targets)
    for name, parameter in nn.Sequential(*pipe.stages[0], *pipe.stages[1]).named_parameters():
        torch.testing.assert_close(parameter.grad, expected[name], rtol=1e-4, atol=1e-6)


def test_the_sweep_reports_median_quartiles_and_step_time_per_micro_batch_count(monkeypatch):
    # measure_steps stubbed with hand-made steps: for m=2, idle 0.2, 0.4, 0.6, 0.8 (median
    # 0.5; quartiles, statistics' exclusive method: positions 1.25 and 3.75, so 0.25 and
    # 0.75) over steps spanning 2, 4, 6 and 8 ms (median 5 ms); for m=3 one step: its idle
    # share is every quartile, its 3 ms span the step time.
    steps = {
        2: ([0.2, 0.4, 0.6, 0.8], [e("a", 0, 0.002, 1), e("a", 1, 1.004, 2),
                                   e("b", 2, 2.006, 3), e("a", 3, 3.008, 4)]),
        3: ([0.3], [e("a", 5, 5.001, 7), e("b", 5.001, 5.003, 7)]),
    }  # fmt: skip

    class Made:
        def __init__(self, m):
            self.p, self.m = 3, m

    inputs, targets = torch.zeros(2), torch.ones(2)
    asked = []

    def measured(pipe, given_inputs, given_targets, repeats):
        assert given_inputs is inputs and given_targets is targets
        asked.append(repeats)
        idle, events = steps[pipe.m]
        trace = dpkit.Trace()
        trace._events = events
        return trace, idle

    monkeypatch.setattr(bubble, "measure_steps", measured)
    rows = pp.bubble_sweep(Made, inputs, targets, micro_batches=(2, 3), repeats=4)
    assert [row["micro_batches"] for row in rows] == [2, 3]
    first, second = rows
    assert first["formula"] == pytest.approx(2 / 4) and second["formula"] == pytest.approx(2 / 5)
    assert (first["measured idle"], first["q1"], first["q3"]) == pytest.approx((0.5, 0.25, 0.75))
    assert (second["measured idle"], second["q1"], second["q3"]) == pytest.approx((0.3,) * 3)
    assert first["step ms"] == pytest.approx(5.0) and second["step ms"] == pytest.approx(3.0)
    # two steps, idle 0.2 and 0.4: quartiles at positions 0.75 and 2.25, 0.15 and 0.45
    steps[4] = ([0.2, 0.4], [e("a", 0, 0.001, 1), e("a", 1, 1.003, 2)])
    (row,) = pp.bubble_sweep(Made, inputs, targets, micro_batches=(4,))
    assert (row["q1"], row["measured idle"], row["q3"]) == pytest.approx((0.15, 0.3, 0.45))
    assert row["step ms"] == pytest.approx(2.0)
    assert asked == [4, 4, 5]  # 5 steps unless told


def test_a_predicted_schedule_is_gpipes_by_hand():
    # Stages taking (forward, backward) = (1, 2) and (3, 4) s on the whole batch, m = 2:
    # each micro-batch takes half. Forwards: stage 0 runs 0-0.5 and 0.5-1; stage 1 waits
    # for each: 0.5-2, then 2-3.5. Backwards, last micro-batch first: stage 1 3.5-5.5,
    # 5.5-7.5; stage 0 waits for stage 1's: 5.5-6.5 (micro-batch 1), 7.5-8.5 (0).
    predicted = pp.predict_schedule([(1.0, 2.0), (3.0, 4.0)], 2)
    got = [(x.phase, x.device, x.details["stage"], x.details["micro_batch"], x.start, x.end)
           for x in predicted.events]  # fmt: skip
    s0, s1 = "predicted:0 (stage 0)", "predicted:1 (stage 1)"
    expected = [
        ("apply", s0, 0, 0, 0.0, 0.5),
        ("apply", s0, 0, 1, 0.5, 1.0),
        ("apply", s1, 1, 0, 0.5, 2.0),
        ("apply", s1, 1, 1, 2.0, 3.5),
        ("backward", s1, 1, 1, 3.5, 5.5),
        ("backward", s1, 1, 0, 5.5, 7.5),
        ("backward", s0, 0, 1, 5.5, 6.5),
        ("backward", s0, 0, 0, 7.5, 8.5),
    ]
    assert sorted(got) == sorted(expected)  # halves: exact in floats
    assert [x.start for x in predicted.events] == sorted(x.start for x in predicted.events)
    assert {(x.kind, x.step, x.nbytes) for x in predicted.events} == {("predicted", 1, 0)}
    # busy 3 s + 7 s of 2 x 8.5: idle 7/17, above the formula's 1/3 (unequal stages)
    assert pp.idle_fraction(predicted) == pytest.approx(7 / 17)
    # times from the schedule's start: its rows (and figures) begin at 0 s
    rows = predicted.rows()  # a DataFrame, or without pandas a list of dicts
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert sorted(row["start_s"] for row in rows)[:3] == [0.0, 0.5, 0.5]


def test_the_last_stage_turns_back_as_soon_as_its_forward_ends():
    # (0.25, 0.5) s per stage, m = 1: forwards 0-0.25, 0.25-0.5; backwards 0.5-1, 1-1.5
    predicted = pp.predict_schedule([(0.25, 0.5)] * 2, 1)
    spans = [(x.phase, x.details["stage"], x.start, x.end) for x in predicted.events]
    assert spans == [("apply", 0, 0.0, 0.25), ("apply", 1, 0.25, 0.5),
                     ("backward", 1, 0.5, 1.0), ("backward", 0, 1.0, 1.5)]  # fmt: skip


def data(rows: int = ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    return torch.randn(rows, WIDTH), torch.randint(0, WIDTH, (rows,))


def test_stage_times_are_the_median_forward_and_backward_of_each_stage(monkeypatch):
    # A clock read three times a repeat per stage (start, between forward and backward,
    # end). Stage 0's forwards take 5, 1, 3 s and backwards 2, 8, 4: medians 3 and 4;
    # stage 1's forwards 1, 1, 7 and backwards 6, 2, 2: medians 1 and 2.
    readings = iter([0, 5, 7, 10, 11, 19, 20, 23, 27,
                     30, 31, 37, 40, 41, 43, 50, 57, 59])  # fmt: skip
    monkeypatch.setattr(bubble.host_clock, "now", lambda lanes: next(readings))
    pipe = pp.pipeline(pp.mlp_blocks(WIDTH, 4), dpkit.virtual_devices(2), micro_batches=2)
    times = pp.stage_times(pipe, *data(), repeats=3)
    assert times == [(3, 4), (1, 2)]
    assert all(p.grad is None for p in pipe.parameters())  # timing leaves no gradients


class Seen(nn.Module):
    """Passes its input on, noting whether it wants a gradient, its shape, and torch's
    intra-op threads while it runs."""

    def __init__(self, log: list, name: int):
        super().__init__()
        self.log, self.name = log, name

    def forward(self, x):
        self.log.append((self.name, x.requires_grad, tuple(x.shape), torch.get_num_threads(),
                         threading.current_thread().name))  # fmt: skip
        return x


def test_stage_times_run_each_stage_as_the_pipeline_does():
    # Stage 0 gets the batch (its gradient not wanted) and sends a vector of 6 x 8 values;
    # stage 1 gets that vector (wanting its gradient, as backward sends it back), and the
    # loss runs on its output alone; every stage runs with the pipeline's threads, in one
    # thread of its own. Three repeats unless told.
    log, losses = [], []
    threads = torch.get_num_threads() + 1  # not what torch has now

    def loss(outputs, targets):
        losses.append(outputs.shape)
        return nn.functional.cross_entropy(outputs, targets)

    first = nn.Sequential(Seen(log, 0), nn.Linear(WIDTH, 8), nn.Flatten(0))
    second = nn.Sequential(nn.Unflatten(0, (ROWS, 8)), Seen(log, 1), nn.Linear(8, WIDTH))
    stages = [first, second]
    pipe = pp.Pipeline(stages, dpkit.virtual_devices(2), loss=loss, threads=threads)
    times = pp.stage_times(pipe, *data())
    assert len(times) == 2 and all(f > 0 and b > 0 for f, b in times)
    timer = "dpkit-stage-timer"  # a thread of its own, named as dpkit's threads are
    assert (
        log
        == [(0, False, (ROWS, WIDTH), threads, timer)] * 3
        + [(1, True, (ROWS, 8), threads, timer)] * 3
    )
    assert losses == [(ROWS, WIDTH)] * 3


def test_stage_times_raise_a_stages_error_in_the_caller():
    class Boom(nn.Module):
        def forward(self, x):
            raise ArithmeticError("stage 1 cannot")

    pipe = pp.Pipeline([nn.Linear(WIDTH, WIDTH), Boom()], dpkit.virtual_devices(2))
    with pytest.raises(ArithmeticError, match="stage 1 cannot"):
        pp.stage_times(pipe, *data())


def test_single_device_gradients_are_autograds_and_leave_the_model_alone():
    model = pp.mlp_blocks(WIDTH, 2)
    inputs, targets = data()
    twin = pp.mlp_blocks(WIDTH, 2)
    nn.functional.mse_loss(twin(inputs), torch.zeros(ROWS, WIDTH)).backward()
    grads = pp.single_device_gradients(model, inputs, torch.zeros(ROWS, WIDTH),
                                       loss=nn.functional.mse_loss)  # fmt: skip
    assert sorted(grads) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for name, parameter in twin.named_parameters():
        torch.testing.assert_close(grads[name], parameter.grad)
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------------------
# Stages


@pytest.mark.parametrize(
    ("sizes", "stages", "points"),
    [  # each the one split whose largest group is smallest (ties would be a free choice)
        ([5, 1, 9, 2, 2, 7, 3], 1, []),
        ([5, 1, 9, 2, 2, 7, 3], 2, [3]),  # 15 | 14; the next best 17 | 12
        ([2, 9, 1, 1, 1, 6], 3, [1, 2]),  # 2 | 9 | 9: nothing holds the 9 with less
        ([1, 1, 1, 1], 4, [1, 2, 3]),
        ([3, 1, 1, 3], 2, [2]),  # 4 | 4
        ([0.2, 0.3, 0.5], 2, [2]),  # seconds, say: 0.5 | 0.5 beats 0.2 | 0.8
    ],
)
def test_split_points_by_hand(sizes, stages, points):
    assert pp.split_points(sizes, stages) == points


def test_a_split_model_has_balanced_stages_of_its_own_layers():
    # Linear(8, 4): 36 parameters, ReLU 0, Linear(4, 100): 500, Linear(100, 2): 202.
    # Two stages: the cut before the last Linear (536 | 202) beats 36 | 702.
    layers = [nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 100), nn.Linear(100, 2)]
    model = nn.Sequential(*layers)
    assert [parameter_count(layer) for layer in layers] == [36, 0, 500, 202]
    first, second = pp.split_model(model, 2)
    assert list(first) == layers[:3] and list(second) == layers[3:]
    assert [list(stage) for stage in pp.split_model(model, 4)] == [[layer] for layer in layers]
    assert [list(stage) for stage in pp.split_model(model, 1)] == [layers]


@pytest.mark.parametrize("stages", [0, -1, True, 2.0, "2"])
def test_a_stage_count_that_is_not_a_whole_number_of_at_least_one_is_refused(stages):
    with pytest.raises(ValueError, match="stages must be a whole number of at least 1"):
        pp.split_model(pp.mlp_blocks(WIDTH, 2), stages)


def test_a_model_that_is_not_a_sequential_is_refused_by_its_type():
    with pytest.raises(TypeError, match=r"must be an nn.Sequential .*, got Linear; wrap"):
        pp.split_model(nn.Linear(2, 2), 1)


def test_more_stages_than_layers_is_refused_with_the_layer_count():
    with pytest.raises(ValueError, match=r"stages=4 but the model has 3 layers.*stages<=3"):
        pp.split_model(pp.mlp_blocks(WIDTH, 2), 4)  # Linear, ReLU, Linear
    assert len(pp.split_model(pp.mlp_blocks(WIDTH, 2), 3)) == 3


def test_mlp_blocks_are_blocks_of_a_square_linear_and_relu_without_the_last_relu():
    model = pp.mlp_blocks(8, blocks=3, seed=5)
    kinds = [type(layer).__name__ for layer in model]
    assert kinds == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert all(layer.weight.shape == (8, 8) for layer in model[::2])
    again, other = pp.mlp_blocks(8, blocks=3, seed=5), pp.mlp_blocks(8, blocks=3, seed=6)
    assert torch.equal(model[0].weight, again[0].weight)
    assert not torch.equal(model[0].weight, other[0].weight)
    assert [type(layer).__name__ for layer in pp.mlp_blocks()] == kinds[:2] * 3 + ["Linear"]
    assert pp.mlp_blocks()[0].weight.shape == (512, 512)


def test_placing_stages_moves_each_onto_its_device_and_wants_one_device_per_stage():
    lanes = dpkit.virtual_devices(2)
    moved = []

    class Seen(nn.Linear):
        def to(self, *args, **kwargs):
            moved.append(args)
            return super().to(*args, **kwargs)

    place_stages([Seen(2, 2), Seen(2, 2)], lanes)
    assert moved == [(lanes[0].torch_device,), (lanes[1].torch_device,)]
    with pytest.raises(ValueError, match="3 stages but 2 devices"):
        place_stages([nn.Linear(2, 2)] * 3, lanes)


# --------------------------------------------------------------------------------------
# The schedule


def test_each_stage_runs_with_the_pipelines_intra_op_threads():
    seen = []

    class Threads(nn.Module):
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return x

    before = torch.get_num_threads()
    stages = [nn.Sequential(Threads(), nn.Linear(WIDTH, WIDTH)), Threads()]
    pp.Pipeline(stages, dpkit.virtual_devices(2), 2).step(*data())
    assert seen == [1] * 4 and torch.get_num_threads() == before
    seen.clear()
    pp.Pipeline(stages, dpkit.virtual_devices(2), 2, threads=None).step(*data())
    assert seen == [before] * 4
    seen.clear()
    pp.Pipeline(stages, dpkit.virtual_devices(2), 2, threads=before + 1).step(*data())
    assert seen == [before + 1] * 4 and torch.get_num_threads() == before


def test_no_devices_are_refused_by_the_arguments_name():
    with pytest.raises(ValueError, match="^devices is empty"):
        pp.pipeline(pp.mlp_blocks(WIDTH, 2), [])
    with pytest.raises(ValueError, match="^devices is empty"):
        pp.Pipeline([nn.Linear(2, 2)], [])


def test_a_pipeline_knows_its_stages_parameters_and_clears_their_gradients():
    model = pp.mlp_blocks(WIDTH, 3)  # Linear ReLU Linear ReLU Linear: 3 stages of one Linear
    pipe = pp.pipeline(model, dpkit.virtual_devices(3), micro_batches=3)
    assert pipe.p == 3 and pipe.micro_batches == 3
    assert pipe.parameters() == list(model.parameters())
    loss = pipe.step(*data())
    assert all(p.grad is not None for p in model.parameters())
    inputs, targets = data()
    assert loss == pytest.approx(nn.functional.cross_entropy(model(inputs), targets).item())
    pipe.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("micro_batches", [0, -2, True, 2.0, None])
def test_a_micro_batch_count_that_is_not_a_whole_number_of_at_least_one_is_refused(micro_batches):
    with pytest.raises(ValueError, match=r"micro_batches must be a whole number of at least 1"):
        check_micro_batches(micro_batches)
    assert check_micro_batches(1) == 1 and check_micro_batches(7) == 7


def test_a_batch_smaller_than_the_micro_batch_count_is_refused_and_equal_is_fine():
    pipe = pp.pipeline(pp.mlp_blocks(WIDTH, 2), dpkit.virtual_devices(2), micro_batches=ROWS)
    assert pipe.step(*data()) > 0  # 6 rows, 6 micro-batches of one row
    with pytest.raises(ValueError, match=r"a batch of 5 rows cannot make micro_batches=6"):
        pipe.step(*data(5))


def test_a_failure_names_its_stage_device_and_micro_batch_and_keeps_its_cause():
    class FailsOnThird(nn.Module):
        calls = 0

        def forward(self, x):
            FailsOnThird.calls += 1
            if FailsOnThird.calls == 3:
                raise KeyError("third")
            return x

    pipe = pp.Pipeline([FailsOnThird(), nn.Linear(WIDTH, WIDTH)], dpkit.virtual_devices(2), 3)
    with pytest.raises(pp.StageFailed) as failed:
        pipe.step(*data())
    error = failed.value
    assert (error.stage, error.device, error.micro_batch) == (0, "virtual:0 (cpu)", 2)
    assert isinstance(error.__cause__, KeyError)
    assert "raised KeyError: 'third'" in str(error)
    assert not [t for t in threading.enumerate() if t.name.startswith("dpkit-stage-")]


def test_a_stage_holds_its_parameters_micro_batches_and_saved_activations():
    # mlp_blocks(16, 4) cut in two stages: [Linear, ReLU, Linear] and [ReLU, Linear, ReLU,
    # Linear] (each two Linear(16, 16): 2 x (256 + 16) x 4 = 2176 bytes). 6 rows in 3
    # micro-batches of 2: each stage's inputs are 6 x 16 floats, 384 bytes; stage 0 saves
    # the ReLU's output for backward (the second Linear's input, the same tensor): 384.
    model = pp.mlp_blocks(WIDTH, 4)
    stages = [model[:3], model[3:]]
    pipe = pp.Pipeline(stages, dpkit.virtual_devices(2), micro_batches=3)
    with dpkit.trace() as recorded:
        pipe.step(*data())
    held = {row["device"]: row for row in recorded.memory_summary()}
    first, second = held["virtual:0 (cpu)"], held["virtual:1 (cpu)"]
    assert (first["parameters"], first["input"], first["activations"]) == (2176, 384, 384)
    assert (second["parameters"], second["input"]) == (2176, 384)
    assert second["activations"] > 3 * 2 * 128  # two ReLUs' outputs and the loss's
    pipe.zero_grad()
    pipe.step(*data())  # not traced: nothing recorded, nothing held
    assert len(recorded.memory_summary()) == 2


def test_every_micro_batch_is_an_event_of_its_stage_with_what_it_received():
    # 2 stages, 3 micro-batches of 2 rows: 12 events; stage 1 receives 2 x 16 floats
    # (128 bytes) forward, stage 0 as many backward; each stage runs in its own thread.
    pipe = pp.pipeline(pp.mlp_blocks(WIDTH, 4), dpkit.virtual_devices(2), micro_batches=3)
    with dpkit.trace() as recorded:
        pipe.step(*data())
    got = sorted(
        (x.phase, x.device, x.kind, x.step, x.nbytes, x.details["stage"], x.details["micro_batch"],
         x.details["received_bytes"], x.details["thread"]) for x in recorded.events
    )  # fmt: skip
    lanes = ("virtual:0 (cpu)", "virtual:1 (cpu)")
    expected = sorted(
        (phase, lanes[s], "virtual-cpu", 1, nbytes, s, j, nbytes, "own")
        for phase in ("apply", "backward")
        for s in (0, 1)
        for j in range(3)
        for nbytes in [128 if (phase, s) in {("apply", 1), ("backward", 0)} else 0]
    )
    assert got == expected


# --------------------------------------------------------------------------------------
# The contrast of the strategies


class Shift(nn.Module):
    """Adds a buffer of 2 floats (8 bytes): a buffer crosses devices as parameters do."""

    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.ones(2))

    def forward(self, x):
        return x + self.shift


def contrast_model() -> nn.Sequential:
    # parameters 36 + 0 + 500 + 202 + 0 floats, and the buffer's 2: 2,960 bytes. Two
    # stages cut before Linear(100, 2) (536 | 202, the one best cut).
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 100), nn.Linear(100, 2), Shift())


def test_the_bytes_crossing_the_cuts_are_the_activations_there():
    inputs = torch.randn(5, 8)
    model = contrast_model()
    assert pp.cut_activation_bytes(model, inputs, 1) == 0
    assert pp.cut_activation_bytes(model, inputs, 2) == 5 * 100 * 4
    # one layer a stage: after Linear(8, 4) and the ReLU 5 x 4 floats each, after
    # Linear(4, 100) 5 x 100, after Linear(100, 2) 5 x 2
    assert pp.cut_activation_bytes(model, inputs, 5) == (20 + 20 + 500 + 10) * 4


@pytest.mark.parametrize(
    ("n", "data_parallel", "ddp"),
    [
        # 2 P (n - 1) + (input + 2 x output) (n - 1) / n, with P = 2,960, input 5 x 8
        # floats (160 bytes), output 5 x 2 (40): 5,920 + 240 / 2 = 6,040; DDP 2 P (n - 1)
        (2, 6040, 5920),
        (3, 11840 + 160, 11840),
        (4, 17760 + 180, 17760),
    ],
)
def test_the_contrast_table_by_hand(n, data_parallel, ddp):
    rows = pp.contrast_table(contrast_model(), torch.randn(5, 8), n)
    assert [row["strategy"] for row in rows] == [
        "DataParallel (one process)", "DDP (a process per device)", "model split / pipeline"
    ]  # fmt: skip
    assert [row["bytes/step"] for row in rows][:2] == [data_parallel, ddp]
    assert rows[2]["each device holds"] == f"1/{n} of the layers (one stage)"
    if n == 2:  # the activations at the one cut forward, their gradients back
        assert rows[2]["bytes/step"] == 2 * 5 * 100 * 4


def notebook_07_output(source: str) -> str:
    """What notebook 07's code cell containing ``source`` printed when it was last run."""
    import nbformat

    path = Path(__file__).resolve().parent.parent / "notebooks" / "07_beyond_dataparallel.ipynb"
    notebook = nbformat.read(path, as_version=4)
    (cell,) = [c for c in notebook.cells if c.cell_type == "code" and source in c.source]
    return "".join(output["text"] for output in cell.outputs if output.get("name") == "stdout")


def test_the_contrast_table_is_the_one_notebook_07_shows():
    # Notebook 07's table (its saved output, which nbval compares when the notebook runs):
    # the strategies' columns and words as a learner reads them, and the bytes of a
    # 4-block MLP of width 512 on 256 rows over 2 devices.
    table = pp.contrast_table(pp.mlp_blocks(width=512, blocks=4), torch.randn(256, 512), 2)
    assert f"{table}\n" == notebook_07_output("print(strategies)")
    assert list(table[0]) == ["strategy", "each device holds", "crosses devices", "bytes/step",
                              "fits when"]  # fmt: skip


def test_mlp_blocks_cut_in_two_as_notebook_07_shows():
    # Linear, ReLU, Linear, ReLU, Linear, ReLU, Linear: cutting after the second Linear or
    # after the ReLU behind it balances the parameters alike; the first such cut is taken,
    # so the ReLU starts stage 1 (3 and 4 modules, 2 Linear layers each, as notebook 07
    # prints).
    stages = pp.split_model(pp.mlp_blocks(width=512, blocks=4), 2)
    assert [len(stage) for stage in stages] == [3, 4]
    printed = notebook_07_output("strategies = pp.contrast_table(")
    assert printed == (
        "['stage 0: 2 Linear layers (3 modules with the activations)', "
        "'stage 1: 2 Linear layers (4 modules with the activations)']\n"
    )


def sent_during(call) -> list[tuple[str, str, str, int]]:
    """The copies between devices that ``call()`` makes, as dpkit.comm reports them."""
    from dpkit.comm import add_transfer_listener

    seen = []
    handle = add_transfer_listener(
        lambda t: seen.append((t.op, t.source.name, t.destination.name, t.nbytes))
    )
    try:
        call()
    finally:
        handle.remove()
    return sorted(seen)


LANE = ["virtual:0 (cpu)", "virtual:1 (cpu)", "virtual:2 (cpu)"]


def test_a_step_sends_activations_forward_and_gradients_back_between_neighbours():
    # 3 stages, 2 micro-batches of 3 rows x 16 floats (192 bytes): each crossing forward
    # and back once per micro-batch, neighbour to neighbour; each micro-batch's 3 targets
    # (int64, 24 bytes) from the host to the last stage, where the loss is. The batch stays
    # where it is: CPU lane 0's memory is the host's.
    pipe = pp.pipeline(pp.mlp_blocks(WIDTH, 4), dpkit.virtual_devices(3), micro_batches=2)
    sent = sent_during(lambda: pipe.step(*data()))
    expected = [("send", LANE[a], LANE[b], 192) for a, b in [(0, 1), (1, 2), (2, 1), (1, 0)]]
    assert sent == sorted([*expected * 2, *[("send", "cpu", LANE[2], 24)] * 2])


def test_stage_times_send_the_batch_s_activations_as_the_pipeline_does():
    # the whole batch: 6 x 16 floats (384 bytes) from each stage to the next, and the 6
    # targets (48 bytes) to the last stage alone
    pipe = pp.pipeline(pp.mlp_blocks(WIDTH, 4), dpkit.virtual_devices(3), micro_batches=2)
    sent = sent_during(lambda: pp.stage_times(pipe, *data(), repeats=1))
    assert sent == sorted([("send", LANE[0], LANE[1], 384), ("send", LANE[1], LANE[2], 384),
                           ("send", "cpu", LANE[2], 48)])  # fmt: skip
