"""The parent-side code of dpkit.ddp (compare, settings, run), from rank records written here
by hand: times in seconds on one clock, bytes made up, every expected value worked out here.

The tests that launch gloo ranks check these functions on measured numbers no test can
predict, and a mutation tool cannot follow a rank process. The functions themselves only
read what the ranks send back (a RankRun each: events as tuples, memory records, step
times), so here they read RankRuns, Events and Traces built in this process, and no rank
process is started.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpkit.ddp import compare, run, settings
from dpkit.ddp.record import RankRun
from dpkit.ddp.run import DDPResult
from dpkit.tracing import Event, Trace
from dpkit.verdict import Outcome

LANE = [f"virtual:{i} (cpu)" for i in range(3)]
RANK_LABEL = "processes (DistributedDataParallel, a rank each)"


def rank_run(rank, events, memory=(), step_times=(), device="cpu", cap=25.0, gradients=None):
    return RankRun(rank, device, 100 + rank, cap, 400, [*events], [*memory], [*step_times],
                   gradients)  # fmt: skip


def result(runs, step_times=(1.0,), cap=25.0, gradients=None) -> DDPResult:
    pids = [100 + r.rank for r in runs]
    return DDPResult(run.merged_trace(runs), len(runs), "gloo", 8, cap, 400, [*step_times],
                     pids, gradients)  # fmt: skip


def dp_trace(events, memory) -> Trace:
    """A DataParallel-like trace: straight into its lists, as merged_trace fills one."""
    trace = Trace()
    trace._events, trace._memory = [*events], [*memory]
    return trace


def allreduce(start, end, nbytes, step, ring_sent):
    return ("allreduce", start, end, nbytes, step, {"ring_sent_bytes": ring_sent})


def plan(**changes):
    arguments = dict(workload="mlp", nproc=2, batch=8, steps=3, bucket_caps=[25.0],
                     backend="gloo", timeout=10.0, port=None, threads=1) | changes  # fmt: skip
    return run.make_plan(**arguments)


# -- run.py


def test_a_rank_is_named_by_its_number_and_its_device():
    assert run.rank_name(1, "cpu") == "rank:1 (cpu)"
    assert run.rank_name(0, "cuda:1") == "rank:0 (cuda:1)"


def test_the_merged_trace_orders_every_rank_s_events_by_start():
    # rank 0's all-reduce starts inside its backward and ends first: by start, backward first
    rank0 = rank_run(0, [("backward", 2.0, 3.0, 0, 1, {}), allreduce(2.5, 2.9, 100, 1, 100),
                         ("apply", 1.0, 2.0, 0, 1, {})], [("parameters", 400, 1)])  # fmt: skip
    rank1 = rank_run(1, [("apply", 1.5, 2.2, 0, 1, {})], [("gradients", 400, 1)], device="cuda:1")
    trace = run.merged_trace([rank0, rank1])
    assert [(e.device, e.phase) for e in trace.events] == [
        ("rank:0 (cpu)", "apply"), ("rank:1 (cuda:1)", "apply"), ("rank:0 (cpu)", "backward"),
        ("rank:0 (cpu)", "allreduce"),
    ]  # fmt: skip
    assert trace.events[-1] == Event(
        "allreduce", "rank:0 (cpu)", 2.5, 2.9, 100, 1, "rank", {"ring_sent_bytes": 100}
    )
    assert [(m.device, m.category, m.nbytes, m.step, m.kind) for m in trace.memory] == [
        ("rank:0 (cpu)", "parameters", 400, 1, "rank"),
        ("rank:1 (cuda:1)", "gradients", 400, 1, "rank"),
    ]
    assert trace.origin == 1.0  # the first start of any rank
    assert trace.hardware == RANK_LABEL


def test_bytes_per_device_sums_one_phase_of_one_step_by_device():
    r0, r1 = "rank:0 (cpu)", "rank:1 (cpu)"
    events = [
        Event("allreduce", r1, 0, 1, 100, 2), Event("allreduce", r1, 1, 2, 50, 2),
        Event("replicate", r1, 0, 1, 400, 1), Event("allreduce", r0, 0, 1, 100, 2),
        Event("allreduce", r0, 0, 1, 70, 1), Event("optimizer", r0, 2, 3, 0, 2),
    ]  # fmt: skip
    last = run.bytes_per_device(events, "allreduce", None)  # step 2, the last
    assert last == {r0: 100, r1: 150} and list(last) == [r0, r1]
    assert run.bytes_per_device(events, "allreduce", 1) == {r0: 70}
    assert run.bytes_per_device(events, None, 1) == {r0: 70, r1: 400}


def test_a_result_s_all_reduced_bytes_leave_out_the_constructor_s_broadcast():
    steps = [allreduce(1, 2, 30, 1, 30), allreduce(3, 4, 20, 2, 20), allreduce(4, 5, 5, 2, 5)]
    ran = result([rank_run(rank, [("replicate", 0, 1, 400 * rank, 1, {}), *steps])
                  for rank in (0, 1)])  # fmt: skip
    assert ran.allreduce_bytes_per_step() == {"rank:0 (cpu)": 25, "rank:1 (cpu)": 25}
    assert ran.allreduce_bytes_per_step(1) == {"rank:0 (cpu)": 30, "rank:1 (cpu)": 30}


def test_the_median_step_leaves_out_step_1_when_there_are_more():
    assert result([], step_times=[5.0, 1.0, 2.0, 4.0]).median_step_s == 2.0  # of 1, 2, 4
    assert result([], step_times=[0.5]).median_step_s == 0.5


def test_a_result_s_step_runs_from_the_first_rank_s_start_to_the_last_rank_s_end():
    rank0 = rank_run(0, [("apply", 0, 1, 0, 1, {})], step_times=[(0.0, 2.0), (3.0, 4.5)],
                     cap=0.5, gradients={"w": 1})  # fmt: skip
    rank1 = rank_run(1, [("apply", 0, 1, 0, 1, {})], step_times=[(0.5, 2.5), (2.9, 4.4)],
                     cap=0.5, gradients={"w": 2})  # fmt: skip
    # the ranks' runs at the second cap of a sweep: the result says that cap
    made = run.result_of([rank0, rank1], plan(bucket_caps=[25.0, 0.5]), [11, 12])
    # step 1: 0 to rank 1's 2.5; step 2: rank 1's 2.9 to rank 0's 4.5 (no rank took 2.5 s)
    assert made.step_times == pytest.approx([2.5, 1.6])
    assert (made.nproc, made.backend, made.batch, made.bucket_cap_mb) == (2, "gloo", 8, 0.5)
    assert (made.parameter_bytes, made.pids, made.gradients) == (400, [11, 12], None)
    assert len(made.trace.events) == 2
    kept = run.result_of([rank0, rank1], plan(keep_gradients=True), [11, 12])
    assert kept.gradients == [{"w": 1}, {"w": 2}]
    # a world of one (nproc=1 is allowed): its one rank's steps and cap
    alone = run.result_of([rank0], plan(nproc=1, bucket_caps=[0.5]), [11])
    assert (alone.step_times, alone.bucket_cap_mb, alone.nproc) == ([2.0, 1.5], 0.5, 1)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"batch": 0}, "batch must be a whole number of at least 1"),
        ({"steps": True}, "steps must be a whole number of at least 1"),
        ({"threads": 1.5}, "threads must be a whole number of at least 1"),
        # 10 rows over 4 ranks: the next multiple of 4 is 12
        ({"batch": 10, "nproc": 4}, r"batch=10 .* nproc=4.*multiple of 4, e.g. batch=12"),
        ({"bucket_caps": [25.0, 0]}, "bucket_cap_mb must be a positive number"),
        ({"timeout": -1.0}, "timeout must be a positive number"),
        ({"compression": "zip"}, "compression must be None"),
        ({"variants": [{}, {"compression": "powersgd-"}]}, "compression must be None"),
        ({"emulated_link": True}, "emulated_link must be bytes/s or None"),
        ({"emulated_link": 0}, "emulated_link=0: a finite number of bytes/s above 0"),
        ({"port": 0}, "port must be a TCP port number"),
    ],
)
def test_a_plan_refuses_a_bad_argument_by_name(changes, words):
    with pytest.raises(ValueError, match=words):
        plan(**changes)


def test_a_plan_checks_the_backend_and_the_port_it_is_given():
    from dpkit.ddp.checks import free_port

    if not torch.cuda.is_available():  # no GPU: nccl is refused, None picks gloo
        with pytest.raises(ValueError, match="backend='nccl' needs CUDA GPUs"):
            plan(backend="nccl")
        assert plan(backend=None).backend == "gloo"
    port = free_port()
    assert plan(port=port).port == port


def test_a_plan_refuses_a_world_size_that_is_not_a_whole_number():
    with pytest.raises(TypeError, match="nproc must be an int"):
        plan(nproc=2.0)


def test_a_plan_holds_what_the_ranks_need():
    made = plan(bucket_caps=[25, None], timeout=10, threads=2, keep_gradients=True, blocks=5,
                ddp_options={"static_graph": True, "gradient_as_bucket_view": False},
                compression="bf16", emulated_link=1e6, variants=[{"b": 2, "a": 1}])  # fmt: skip
    assert made.workload.name == "mlp"
    assert (made.nproc, made.batch, made.steps, made.backend) == (2, 8, 3, "gloo")
    assert made.timeout == 40.0  # torch's collectives give up 30 s after the parent
    assert made.bucket_caps == (25.0, None)
    assert made.ddp_options == (("gradient_as_bucket_view", False), ("static_graph", True))
    assert made.variants == ((("a", 1), ("b", 2)),)
    assert (made.compression, made.emulated_link, made.port) == ("bf16", 1e6, None)
    assert (made.blocks, made.threads, made.keep_gradients) == (5, 2, True)


# -- compare.py


def test_spread_is_the_median_and_quartiles_in_ms():
    # 1, 2, 3, 4, 10 ms: quartiles (exclusive) at positions 1.5 and 4.5 of the sorted five
    assert compare.spread([0.004, 0.001, 0.010, 0.003, 0.002]) == pytest.approx(
        {"median_ms": 3.0, "q1_ms": 1.5, "q3_ms": 7.0}
    )
    assert compare.spread([0.002]) == pytest.approx({"median_ms": 2.0, "q1_ms": 2.0, "q3_ms": 2.0})


def test_devices_are_ordered_by_their_number_not_their_name():
    assert compare._index("rank:10 (cpu)") == (10, "rank:10 (cpu)")
    assert compare._index("rank:0 (cuda:1)")[0] == 0  # the rank, not the GPU
    assert compare._index("cpu") == (-1, "cpu")
    # No device 0 here: lane 2 comes first and receives lane 10's copy (5 B) too
    two, ten = "virtual:2 (cpu)", "virtual:10 (cpu)"
    events = [Event("scatter", ten, 0, 1, 5, 1), Event("scatter", two, 0, 1, 7, 1)]
    traffic = compare.traffic_per_device(dp_trace(events, []))
    assert list(traffic.items()) == [(two, 7 + 7 + 5), (ten, 5)]


def ddp_ranks(nproc=3):
    # each rank: step 1 the constructor, step 2 one bucket of 300 B, of which a ring of 3
    # sends 2 (3 - 1) / 3 x 300 = 400 B (and receives as much); 1,200 B held in step 2
    return [
        rank_run(rank, [("replicate", 0, 1, 400 * (rank > 0), 1, {}),
                        allreduce(2, 3, 300, 2, 400)],
                 [(category, 400, 2) for category in ("parameters", "gradients", "buckets")])
        for rank in range(nproc)
    ]  # fmt: skip


def dp_events_and_memory():
    vc = "virtual-cpu"
    events = [
        Event("scatter", LANE[1], 0, 1, 999, 1, vc),  # step 1: not counted
        Event("scatter", LANE[1], 0, 1, 100, 2, vc), Event("scatter", LANE[2], 0, 1, 60, 2, vc),
        Event("replicate", LANE[1], 1, 2, 40, 2, vc), Event("replicate", LANE[2], 1, 2, 40, 2, vc),
        Event("apply", LANE[0], 2, 3, 0, 2, vc),
        Event("reduce", LANE[1], 4, 5, 40, 2, vc, {"destination": LANE[0]}),
    ]  # fmt: skip
    held = {LANE[0]: [40, 100, 40], LANE[1]: [40, 100, 0], LANE[2]: [40, 60, 0]}
    memory = [(LANE[0], "parameters", 999, 1, vc)] + [
        (lane, category, nbytes, 2, vc)
        for lane, row in held.items()
        for category, nbytes in zip(("parameters", "input", "gradients"), row)
    ]
    return events, memory


def test_ring_traffic_is_twice_what_each_rank_sends():
    trace = run.merged_trace(ddp_ranks())
    assert compare.traffic_per_device(trace) == dict.fromkeys(
        ["rank:0 (cpu)", "rank:1 (cpu)", "rank:2 (cpu)"], 800
    )
    # step 1: the constructor's broadcast, no ring: its bytes once, on the receiving ranks
    assert list(compare.traffic_per_device(trace, step=1).values()) == [0, 400, 400]


def test_data_parallel_traffic_counts_a_copy_on_its_device_and_on_device_0():
    # lane 1: 100 + 40 + 40 = 180; lane 2: 60 + 40 = 100; lane 0 gets all of it, 280
    traffic = compare.traffic_per_device(dp_trace(*dp_events_and_memory()))
    assert traffic == {LANE[0]: 280, LANE[1]: 180, LANE[2]: 100}


def comparison(ddp=None, sweep=()):
    dp_times = [0.001, 0.002, 0.003, 0.004, 0.010]
    ddp = ddp or result(ddp_ranks(), step_times=[0.004])
    return compare.Comparison(3, 12, 1, dp_trace(*dp_events_and_memory()), dp_times, ddp,
                              [*sweep])  # fmt: skip


def test_the_comparison_rows_give_device_0_and_the_busiest_other_device():
    chosen = comparison()
    assert [name for name, *_ in chosen.engines()] == ["DataParallel", "DDP"]
    assert chosen.engines()[1][1] is chosen.ddp.trace
    # DataParallel held 180 B on lane 0 (the gradients too), 140 and 100 on the others
    assert list(chosen.rows()) == [
        {"engine": "DataParallel", "median_ms": pytest.approx(3.0), "q1_ms": pytest.approx(1.5),
         "q3_ms": pytest.approx(7.0), "steps": 5, "traffic dev 0": 280, "traffic others": 180,
         "memory dev 0": 180, "memory others": 140},
        {"engine": "DDP", "median_ms": pytest.approx(4.0), "q1_ms": pytest.approx(4.0),
         "q3_ms": pytest.approx(4.0), "steps": 1, "traffic dev 0": 800, "traffic others": 800,
         "memory dev 0": 1200, "memory others": 1200},
    ]  # fmt: skip


def test_the_comparison_prints_its_rows_and_each_engine_s_memory():
    chosen = comparison()
    text = str(chosen)
    assert text.startswith("3 devices, global batch 12, 1 torch thread(s) per process.")
    assert str(chosen.rows()) in text
    dp, ddp = chosen.data_parallel.memory_summary(), chosen.ddp.trace.memory_summary()
    assert f"DataParallel — virtual devices on the CPU:\n{dp}" in text
    assert text.endswith(f"DDP — {RANK_LABEL}:\n{ddp}")


def bucket_result(cap, buckets, step_times):
    # 4 ranks alike; step 1 one bucket of everything, step 2 ``buckets``. A ring of 4 sends
    # 2 (4 - 1) / 4 = 1.5 times a bucket per rank.
    events = [allreduce(1, 2, 3072, 1, 4608)] + [
        allreduce(3 + i, 4 + i, size, 2, size * 3 // 2) for i, size in enumerate(buckets)
    ]
    return result([rank_run(rank, events) for rank in range(4)], step_times, cap)


def test_the_bucket_table_counts_all_reduces_per_cap():
    default = bucket_result(25.0, [1024, 2048], [0.3, 0.1, 0.2])
    small = bucket_result(0.001, [1024, 1024, 1024], [0.5, 0.3])
    # rank 0's last step; the median step after step 1: 0.15 s and 0.3 s
    assert list(comparison(default, [small]).sweep_rows()) == [
        {"bucket_cap_mb": 25.0, "allreduces/step": 2, "bucket sizes (B)": "1,024 2,048",
         "bytes/step/rank": 3072, "ring sent/rank": 4608, "median_ms": pytest.approx(150.0)},
        {"bucket_cap_mb": 0.001, "allreduces/step": 3, "bucket sizes (B)": "1,024 1,024 1,024",
         "bytes/step/rank": 3072, "ring sent/rank": 4608, "median_ms": pytest.approx(300.0)},
    ]  # fmt: skip
    assert compare.bucket_rows([]) == []


def test_buckets_close_once_they_reach_the_cap_as_torch_s_do():
    # 4 | +4 = 8 closes | 12 closes | 4, +4 = 8 closes | 4 left open
    assert compare.assign_buckets([4, 4, 12, 4, 4, 4], 8) == [8, 12, 8, 4]
    # 4 | +6 = 10 closes, 2 over the cap | 4 left: torch lets a bucket pass the cap
    assert compare.assign_buckets([4, 6, 4], 8) == [10, 4]
    assert compare.assign_buckets([20], 8) == [20]
    assert compare.assign_buckets([], 8) == []


def test_the_other_rule_closes_a_bucket_before_a_gradient_would_overflow_it():
    # 4 | 6 would make 10: close 4 | 4 would make 10: close 6 | 4
    assert compare.assign_buckets([4, 6, 4], 8, "before overflow") == [4, 6, 4]
    # exactly full is not over: 4 + 4 stays one bucket; 20 alone in one, none empty
    assert compare.assign_buckets([4, 4, 20, 4], 8, "before overflow") == [8, 20, 4]
    assert compare.assign_buckets([20, 4], 8, "before overflow") == [20, 4]
    with pytest.raises(ValueError, match="'torch' or 'before overflow', got 'after'"):
        compare.assign_buckets([4], 8, "after")


def test_step_rows_time_each_step_s_backward_and_its_all_reduces():
    def rank(number, backward_1, waiting_1, constructor):
        return rank_run(number, [
            ("replicate", 0.0, constructor, 400 * number, 1, {}),
            ("backward", 1.0, backward_1, 0, 1, {"waiting_s": waiting_1}),
            allreduce(1.8, 2.2, 100, 1, 100), ("optimizer", 2.2, 2.3, 0, 1, {}),
            ("apply", 3.0, 3.5, 0, 2, {}), ("backward", 3.5, 4.5, 0, 2, {"waiting_s": 0.3}),
            allreduce(3.7, 3.9, 50, 2, 50), allreduce(4.1, 4.7, 50, 2, 50),
            allreduce(4.6, 4.8, 50, 2, 50),
        ])  # fmt: skip

    ran = result([rank(0, 2.0, 0.2, 0.5), rank(1, 1.6, 0.6, 0.6)])
    # Step 1, rank 0: the all-reduce 1.8-2.2 s overlaps backward (1-2 s) for 0.2 of 0.4 s.
    # Step 2: 0.2 of 0.2, 0.4 of 0.6 and none of 0.2 s (it starts after backward): 0.6 of 1.
    assert list(compare.step_rows(ran)) == [
        {"step": 1, "constructor_ms": pytest.approx(500), "backward_ms": pytest.approx(1000),
         "allreduces": 1, "first_starts_ms": pytest.approx(800), "overlap_%": pytest.approx(50),
         "waiting_ms": pytest.approx(200)},
        {"step": 2, "constructor_ms": 0, "backward_ms": pytest.approx(1000), "allreduces": 3,
         "first_starts_ms": pytest.approx(200), "overlap_%": pytest.approx(60),
         "waiting_ms": pytest.approx(300)},
    ]  # fmt: skip
    # rank 1's backward ends at 1.6 s, before its all-reduce starts: no overlap
    assert compare.step_rows(ran, rank=1)[0] == {
        "step": 1, "constructor_ms": pytest.approx(600), "backward_ms": pytest.approx(600),
        "allreduces": 1, "first_starts_ms": pytest.approx(800), "overlap_%": 0.0,
        "waiting_ms": pytest.approx(600)}  # fmt: skip


def test_a_step_without_all_reduces_has_a_row_of_none():
    """A step under ``ddp.no_sync()`` (gradient accumulation) all-reduces nothing."""
    ran = result([rank_run(0, [("apply", 0.0, 1.0, 0, 1, {}), ("backward", 1.0, 3.0, 0, 1, {})])])
    assert list(compare.step_rows(ran)) == [
        {"step": 1, "constructor_ms": 0, "backward_ms": pytest.approx(2000), "allreduces": 0,
         "first_starts_ms": None, "overlap_%": 0.0, "waiting_ms": 0.0}
    ]  # fmt: skip


# -- settings.py


def forwards(durations):
    """A rank's forwards, ``durations`` by step from step 1, one at 10 s per step, and a
    backward after each (not a forward)."""
    return [
        event
        for step, seconds in enumerate(durations, 1)
        for event in [("apply", 10.0 * step, 10.0 * step + seconds, 0, step, {}),
                      ("backward", 10.0 * step + 1, 10.0 * step + 5, 0, step, {})]
    ]  # fmt: skip


SLOWER = result([rank_run(0, forwards([1.0, 0.8, 0.5, 1.0, 0.9])),
                 rank_run(1, forwards([1.2, 0.6, 0.6, 0.4]))])  # fmt: skip
FASTER = result([rank_run(0, forwards([0.2, 0.2, 0.4, 0.4])),
                 rank_run(1, forwards([0.3, 0.3, 0.4, 0.2]))])  # fmt: skip


def test_forward_times_are_every_rank_s_forwards_from_step_3():
    # steps 3, 4 and 5 in start order, rank 0 before rank 1 in a step
    assert settings.forward_times(SLOWER) == pytest.approx([0.5, 0.6, 1.0, 0.4, 0.9])
    assert settings.forward_times(SLOWER, from_step=5) == pytest.approx([0.9])


def test_forward_difference_is_the_median_of_same_rank_same_step_pairs():
    # from step 3, in both runs: 0.1, 0.6 (rank 0), 0.2, 0.2 (rank 1): median 0.2, mean 0.275;
    # rank 0's step 5 has no partner
    assert settings.forward_difference(SLOWER, FASTER) == pytest.approx(0.2)
    # from step 2, also 0.6 and 0.3: the middle two of six, 0.2 and 0.3
    assert settings.forward_difference(SLOWER, FASTER, from_step=2) == pytest.approx(0.25)
    assert settings.forward_difference(FASTER, SLOWER) == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="from 5 on in both runs: train more steps"):
        settings.forward_difference(SLOWER, FASTER, from_step=5)


def test_forward_comparison_judges_the_same_step_pairs_as_rounds():
    # from step 3, slower over faster: 0.5/0.4, 1.0/0.4 (rank 0), 0.6/0.4, 0.4/0.2 (rank 1):
    # 1.25, 2.5, 1.5, 2.0; quartiles (inclusive) 1.4375, 1.75, 2.125: faster in every pair
    found = settings.forward_comparison(SLOWER, FASTER)
    assert found.outcome is Outcome.FASTER and found.rounds == 4
    assert (found.low, found.ratio, found.high) == pytest.approx((1.4375, 1.75, 2.125))
    assert str(found).endswith(settings.WALK_WORDING[Outcome.FASTER])
    backwards = settings.forward_comparison(FASTER, SLOWER)
    # the inverses 0.8, 0.4, 0.667, 0.5: their median is (0.5 + 0.667) / 2, not 1 / 1.75
    assert backwards.outcome is Outcome.SLOWER
    assert backwards.ratio == pytest.approx((0.5 + 2 / 3) / 2)


REFERENCE = {"unused": np.zeros(2), "w": np.array([3.0, 0.0]), "b": np.array([0.0, 4.0])}
ROUNDED = {"unused": np.zeros(2), "w": np.array([3.0, 1.5]), "b": np.array([0.0, 5.0])}


def test_gradient_errors_compare_rank_0_with_the_reference_per_parameter():
    rounded = result([], gradients=[ROUNDED, REFERENCE])  # rank 1's would be exact
    # largest: w 1.5 / 3, b 1 / 4, each against its own largest (against the largest of all,
    # 4, w's would be 0.375); "unused" is all 0, left out. norm: sqrt((1.5^2 + 1^2) / (3^2 + 4^2))
    largest, norm = settings.gradient_errors(rounded, REFERENCE)
    assert (largest, norm) == pytest.approx((0.5, (3.25 / 25) ** 0.5))
    # gradients under 1 count too: 0.25 off the largest 0.5; norm sqrt(0.25^2 / (0.5^2 + 0.25^2))
    small = {"s": torch.tensor([0.5, -0.25])}
    halved = result([], gradients=[{"s": torch.tensor([0.25, -0.25])}])
    assert settings.gradient_errors(halved, small) == pytest.approx((0.5, 0.2**0.5))
    with pytest.raises(ValueError, match="keep_gradients=True"):
        settings.gradient_errors(result([]), REFERENCE)


def test_the_settings_table_gives_each_setting_s_bytes_forwards_and_errors():
    def ranks(rank_0, rank_1, step, buckets):
        events = forwards(rank_0) + [allreduce(50, 51, size, step, size) for size in buckets]
        return [rank_run(0, events), rank_run(1, forwards(rank_1))]

    # float32: forwards from step 3 are 2, 3 ms (rank 0) and 4, 9 ms (rank 1): median 3.5
    plain = result(ranks([0.9, 0.001, 0.002, 0.003], [0.9, 0.001, 0.004, 0.009], 4, [300, 100]),
                   [0.9, 0.01, 0.03, 0.02], gradients=[ROUNDED])  # fmt: skip
    # bf16 ran 2 steps: all its forwards count, 10, 6, 12, 2 ms: median 8
    short = result(ranks([0.010, 0.006], [0.012, 0.002], 2, [150, 50]), [0.5, 0.04],
                   gradients=[REFERENCE])  # fmt: skip
    rows = settings.settings_rows({"float32": plain, "bf16": short}, REFERENCE)
    assert list(rows) == [
        {"setting": "float32", "bytes/step/rank": 400, "forward fastest ms": pytest.approx(2),
         "forward median ms": pytest.approx(3.5), "step median ms": pytest.approx(20),
         "largest error": "5e-01", "norm error": "4e-01"},  # 0.5 and sqrt(0.13)
        {"setting": "bf16", "bytes/step/rank": 200, "forward fastest ms": pytest.approx(2),
         "forward median ms": pytest.approx(8), "step median ms": pytest.approx(40),
         "largest error": "0e+00", "norm error": "0e+00"},
    ]  # fmt: skip
    assert "largest error" not in settings.settings_rows({"float32": plain})[0]


def test_rank_0_s_bytes_are_picked_by_its_name():
    assert settings._of_rank_0({"rank:1 (cpu)": 5, "rank:0 (cuda:0)": 7}) == 7
    assert settings._of_rank_0({"rank:1 (cpu)": 5}) == 0
