"""Notebook 07's DDP timeline draws a rank's wait for its last all-reduce as waiting:
hatched, on the rank's compute track, from the backward's last gradient for the
backward's ``waiting_s``, and named "waiting" in the legend; not as a gap, nor as
backward. A made-up step of two ranks (no processes: the recorder's own tests measure
``waiting_s``)."""

from __future__ import annotations

from dpkit.ddp import merged_trace
from dpkit.ddp.record import RankRun
from dpkit.viz import beyond


def one_step(waiting_s: float) -> object:
    def run(rank: int) -> RankRun:
        events = [
            ("apply", 0.000, 0.002, 0, 1, {}),
            ("backward", 0.002, 0.006, 0, 1, {"waiting_s": waiting_s}),
            ("allreduce", 0.004, 0.006 + waiting_s, 4096, 1, {}),
            ("optimizer", 0.006 + waiting_s, 0.007 + waiting_s, 0, 1, {}),
        ]
        return RankRun(rank, "cpu", 100 + rank, 25.0, 4096, events=events)

    return merged_trace([run(0), run(1)])


def hatched_spans(figure) -> list[tuple[float, float]]:
    """(start, end) in ms of every bar drawn with the waiting hatch."""
    return [
        (path.vertices[:, 0].min(), path.vertices[:, 0].max())
        for bars in figure.axes[0].collections
        if bars.get_hatch() == beyond.WAITING["hatch"]
        for path in bars.get_paths()
    ]


def legend_labels(figure) -> list[str]:
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def test_a_rank_s_wait_for_its_last_all_reduce_is_drawn_hatched_and_named():
    figure = beyond.timelines_on_one_clock([("DDP", one_step(0.003))])
    spans = hatched_spans(figure)
    assert len(spans) == 2  # one per rank
    for start, end in spans:  # ms since the step began: backward's end, for waiting_s
        assert abs(start - 6.0) < 1e-6 and abs(end - 9.0) < 1e-6
    assert "waiting" in legend_labels(figure)


def test_no_wait_draws_nothing_and_names_nothing():
    figure = beyond.timelines_on_one_clock([("DDP", one_step(0.0))])
    assert hatched_spans(figure) == []
    assert "waiting" not in legend_labels(figure)
