"""benchmarks/cost_published.py, the cost model against published GPU measurements: the
harness's arithmetic on tiny cases (a ratio row by hand from two predictions, the error's
sign, the median, the ranking check, the sequence-length stretch of a profile, the
optimizer estimate) and the written results (every row cites its source's URL). Fast: no
ResNet-50 or GPT-2 is profiled here."""

from __future__ import annotations

import json
import re
import statistics

import pytest
import torch
from torch import nn

import dpkit.cost as cost
from tests.scripts import REPO, load

RESULTS = REPO / "benchmarks" / "results"


published = load("benchmarks/cost_published.py")


def _row(key: str, published_value: float, predicted: float, **kw) -> object:
    fields = dict(group="g", what=key, unit="x", source="s", url="https://example.org",
                  quote="q", preset_numbers="p", off="o")  # fmt: skip
    fields.update(kw)
    return published.Row(key=key, published=published_value, predicted=predicted, **fields)


def test_the_error_is_predicted_over_published_minus_one_and_its_sign_says_which_way():
    assert published.error(110.0, 100.0) == pytest.approx(0.10)
    assert published.error(90.0, 100.0) == pytest.approx(-0.10)
    assert _row("over", 2.0, 2.5).error > 0  # the model says more than was measured
    assert _row("under", 2.0, 1.5).error < 0


def test_a_speed_up_row_is_the_ratio_of_two_predictions_computed_by_hand():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    x = torch.randn(1, 64)
    hardware = cost.preset("8xA100-SXM-NVLink")
    one = cost.predict(model, x, 32, 1, hardware, "ddp").step_time
    eight = cost.predict(model, x, 8 * 32, 8, hardware, "ddp").step_time
    by_hand = (8 * 32 / eight) / (32 / one)  # img/s on 8 over img/s on 1
    predicted = published.ratio(8 * 32 / eight, 32 / one)
    assert predicted == pytest.approx(by_hand)
    row = _row("speedup", 7.5, predicted)
    assert row.error == pytest.approx(by_hand / 7.5 - 1)


def test_the_summary_gives_the_median_of_absolute_errors_and_the_worst_row():
    rows = [_row("a", 1.0, 1.09), _row("b", 1.0, 0.80), _row("c", 1.0, 1.05)]
    result = published.summary(rows)
    assert result["median_abs_error"] == pytest.approx(statistics.median([0.09, 0.20, 0.05]))
    assert result["worst"]["key"] == "b"
    assert result["worst"]["error"] == pytest.approx(-0.20)
    assert result["over_10pct"] == 1
    assert result["over_35pct"] == 0


def test_a_ranking_holds_only_if_every_neighbour_keeps_its_order():
    measured = {"ddp nvlink": 1.96, "dp nvlink": 1.81, "ddp no p2p": 1.52}
    right = published.ranking(measured, {"ddp nvlink": 2.0, "dp nvlink": 1.7, "ddp no p2p": 1.6})
    assert right["holds"] and right["measured_order"] == ["ddp nvlink", "dp nvlink", "ddp no p2p"]
    swapped = published.ranking(measured, {"ddp nvlink": 2.0, "dp nvlink": 1.5, "ddp no p2p": 1.6})
    assert not swapped["holds"]
    tie = published.ranking({"8": 480.0, "4": 370.0}, {"8": 480.0, "4": 480.0})
    assert not tie["holds"]  # predicting no difference where one was measured is wrong


def test_the_quadratic_through_three_points_is_exact_for_a_quadratic():
    def f(s: float) -> float:
        return 3 + 2 * s + 0.5 * s * s

    assert published.through([4, 8, 16], [f(4), f(8), f(16)], 1024) == pytest.approx(f(1024))


class _Tiny(nn.Module):
    """A two-layer causal transformer small enough to profile in a blink."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True,
                                           norm_first=True)  # fmt: skip
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.blocks(self.embed(ids), mask=mask, is_causal=True))


def test_a_profile_stretched_in_sequence_length_matches_a_direct_profile():
    model = _Tiny()
    short = {s: cost.profile(model, torch.zeros(1, s, dtype=torch.long)) for s in (4, 8, 16)}
    direct = cost.profile(model, torch.zeros(1, 40, dtype=torch.long))
    stretched = published.stretch_profile(short, 40)
    for rows in (1, 4):
        assert stretched.forward.flops(rows) == pytest.approx(direct.forward.flops(rows))
        assert stretched.backward.flops(rows) == pytest.approx(direct.backward.flops(rows))
        assert stretched.forward.nbytes(rows) == pytest.approx(direct.forward.nbytes(rows))
        assert stretched.backward.nbytes(rows) == pytest.approx(direct.backward.nbytes(rows))
        assert stretched.activation_bytes(rows) == pytest.approx(direct.activation_bytes(rows))
    assert stretched.output_row_bytes == direct.output_row_bytes
    assert stretched.grad_output_row_bytes == direct.grad_output_row_bytes
    hardware = cost.preset("8xA100-SXM-NVLink")
    tokens = torch.zeros(1, 40, dtype=torch.long)
    with published.prepared({(id(model), None): stretched}):
        via_stretch = cost.predict(model, tokens, 16, 2, hardware, "ddp").step_time
    assert via_stretch == pytest.approx(
        cost.predict(model, tokens, 16, 2, hardware, "ddp").step_time
    )


def test_the_optimizer_estimate_is_the_longer_of_its_bytes_and_its_launches():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    profile = cost.profile(model, torch.randn(1, 64))
    hardware = cost.preset("8xV100-NVLink")
    accesses, kernels, _ = published.OPTIMIZERS["sgd_momentum"]
    parameters = sum(p.numel() for p in model.parameters())
    by_bytes = parameters * 4 * accesses / (900e9 * 0.8)
    by_launches = 4 * kernels * hardware.op_overhead  # four parameter tensors
    expected = max(by_bytes, by_launches)
    assert published.optimizer_seconds(hardware, profile, "sgd_momentum") == pytest.approx(expected)


def test_the_titan_rtx_pair_s_links_are_the_measured_ones():
    """NVLink: TU102's bridge in nccl-tests#44; without peer to peer, NCCL through host
    memory as two RTX 2080 Ti (TU102) measured it, not PCIe 3 / 2; a copy between the two
    still goes down to the host and up."""
    nvlink, off = published.titan_rtx_pair(True), published.titan_rtx_pair(False)
    by_key = {m.key: m for m in published.MEASUREMENTS}
    assert nvlink.collective_link().bandwidth == pytest.approx(21.4e9)
    assert not off.peer_to_peer
    measured = by_key["tu102_2gpu_shm_allreduce"]
    assert off.collective_link().bandwidth == pytest.approx(measured.value * 1e9)
    assert off.collective_link().bandwidth == pytest.approx(4.00e9)
    assert off.device_link().bandwidth == pytest.approx(off.host_to_device.bandwidth / 2)
    assert nvlink.peak_flops["float32"] == pytest.approx(16.3e12)


def test_the_link_a_ratio_would_need_is_found_where_the_ratio_meets_the_target():
    """The GPT-2 row's diagnostic: a ratio of 1 + 1 GB/s / link reaches 1.5 at 2 GB/s; one
    already at the target with the link the machine has keeps that link."""
    off = published.titan_rtx_pair(False)

    def ratio_at(hardware: cost.Hardware) -> float:
        return 1 + 1e9 / hardware.collective_link().bandwidth

    assert published.link_for_ratio(ratio_at, off, 1.5) == pytest.approx(2e9, rel=1e-6)
    assert published.link_for_ratio(ratio_at, off, 1.1) == off.collective_link().bandwidth


def _written() -> tuple[dict, str]:
    json_path, md_path = RESULTS / "cost_published.json", RESULTS / "cost_published.md"
    if not json_path.exists() or not md_path.exists():
        pytest.skip("run benchmarks/cost_published.py to write the results first")
    return json.loads(json_path.read_text()), md_path.read_text()


def test_every_row_of_the_results_cites_a_url_and_quotes_a_real_measurement():
    result, text = _written()
    rows = result["rows"]
    assert len(rows) >= 12
    for row in rows:
        assert re.match(r"https://\S+$", row["url"]), row["key"]
        assert row["quote"] and row["preset_numbers"] and row["off"], row["key"]
        assert row["error"] == pytest.approx(row["predicted"] / row["published"] - 1)
    table = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(table) == len(rows)
    for line in table:
        assert "](https://" in line, line[:80]
    measurements = {m.key: m for m in published.MEASUREMENTS}
    for row in rows:  # a row named after one measurement quotes its value exactly
        if row["key"] in measurements and row["unit"] == measurements[row["key"]].unit:
            assert row["published"] == measurements[row["key"]].value, row["key"]


def test_the_results_report_the_goal_and_every_ranking():
    result, text = _written()
    assert set(result["goal"]) == {"median", "worst", "rankings"}
    assert result["rankings"] and all("holds" in group for group in result["rankings"])
    assert "## Rankings" in text and "## Summary" in text
