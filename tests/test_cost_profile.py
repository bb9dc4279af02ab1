"""The cost model's profile: FLOPs and bytes that are known by hand, models taking and
returning what DataParallel does, estimates where torch counts nothing (checked against
the same maths written with counted matmuls), work growing with the batch squared, the
cache, autocast, and a warning rather than a silent zero."""

from __future__ import annotations

import collections
import dataclasses
import math
import warnings
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dpkit.cost.profiling import (
    ESTIMATES,
    OpCost,
    PassCost,
    _attention_flops,
    fit_rows,
    op_kind,
    output_tensors,
    profile,
    python_calls,
    rows_like,
    run_passes,
)
from dpkit.tracing import replica_graph


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def counted(module: nn.Module, *args, **kwargs) -> tuple[float, float]:
    """FlopCounterMode's forward and backward FLOPs of ``module`` on these inputs, the
    backward seeded with ones from every floating output, as a replica's."""
    with FlopCounterMode(display=False) as counter:
        out = module(*args, **kwargs)
    forward = counter.get_total_flops()
    roots = [t for t in output_tensors(out) if t.requires_grad]
    params = [p for p in module.parameters() if p.requires_grad]
    seeds = [torch.ones_like(t) for t in roots]
    with FlopCounterMode(display=False) as counter:
        torch.autograd.grad(roots, params, seeds, allow_unused=True)
    return forward, counter.get_total_flops()


def ops_named(cost: PassCost, name: str) -> list[OpCost]:
    return [op for op in cost.ops if op.name == name]


# --- known by hand ------------------------------------------------------------------------


def test_an_mlps_flops_and_bytes_are_the_hand_counts():
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    cost = profile(model, torch.randn(1, 6))
    # hand-computed: 2 * rows * in * out per Linear (addmm; torch counts no FLOPs for the bias)
    for rows in (1, 7, 512):
        assert cost.forward.flops(rows) == 2 * rows * (6 * 5 + 5 * 3)
    first, second = ops_named(cost.forward, "aten.addmm")
    assert first.flops == (0.0, 60.0, 0.0) and second.flops == (0.0, 30.0, 0.0)
    assert (first.kind, first.dtype, first.estimated) == ("matmul", "float32", False)
    # hand-computed: the first addmm reads its bias (5 floats), its weight (30) and 6 floats
    # a row, and writes 5 floats a row: 140 + 44 * rows bytes
    assert first.nbytes == (140.0, 44.0, 0.0)
    # ReLU reads and writes 5 floats a row
    (relu,) = ops_named(cost.forward, "aten.relu")
    assert relu.nbytes == (0.0, 40.0, 0.0) and relu.kind == "memory"
    assert cost.input_row_bytes == 6 * 4 and cost.output_row_bytes == 3 * 4
    assert cost.parameter_sizes == cost.gradient_sizes == (120, 20, 60, 12)
    assert cost.output_tensors == 1 and cost.amp is None and cost.dtype == torch.float32


def test_counts_match_flop_counter_mode_at_another_batch_size():
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 10)
    )
    cost = profile(model, torch.randn(1, 1, 8, 8))
    forward, backward = counted(model, torch.randn(9, 1, 8, 8))
    assert cost.forward.flops(9) == forward and cost.backward.flops(9) == backward
    kinds = {op.name: op.kind for op in (*cost.forward.ops, *cost.backward.ops)}
    assert kinds["aten.convolution"] == kinds["aten.convolution_backward"] == "conv"


# --- what DataParallel accepts -------------------------------------------------------------


class TwoInputs(nn.Module):
    """Images, token ids, a repeat count (not a tensor) and a padding mask by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(4, 8)
        self.embed = nn.Embedding(50, 8)

    def forward(self, x, tokens, repeat, *, mask):
        assert isinstance(repeat, int)  # passed as it is, never batched
        assert len(x) == len(tokens) == len(mask)  # every tensor cut into the same rows
        words = self.embed(tokens) * mask.unsqueeze(-1)
        return self.image(x).repeat(1, repeat) + words.sum(1).repeat(1, repeat)


def test_a_model_with_two_inputs_a_plain_value_and_a_keyword_mask():
    model = TwoInputs()
    tokens, mask = torch.randint(0, 50, (1, 5)), torch.rand(1, 5) > 0.3
    cost = profile(model, (torch.randn(1, 4), tokens, 2), {"mask": mask})
    # hand-computed: a row is 4 floats, 5 int64 ids and 5 bools
    assert cost.input_row_bytes == 4 * 4 + 5 * 8 + 5 * 1
    assert cost.output_row_bytes == 16 * 4
    batch = (torch.randn(9, 4), torch.randint(0, 50, (9, 5)), 2)
    forward, backward = counted(model, *batch, mask=torch.rand(9, 5) > 0.3)
    assert cost.forward.flops(9) == forward == 2 * 9 * 4 * 8
    assert cost.backward.flops(9) == backward
    (embedding,) = ops_named(cost.forward, "aten.embedding")
    assert embedding.dtype == "float32"  # its weight's, not its ids' int64
    # a list is positional inputs too, as DataParallel takes them
    listed = profile(model, [torch.randn(1, 4), tokens, 2], {"mask": mask})
    assert listed.forward == cost.forward


def test_a_zero_dimensional_input_and_a_bad_amp_are_refused():
    with pytest.raises(TypeError, match="batch dimension"):
        profile(nn.Linear(3, 2), (torch.randn(1, 3), torch.tensor(2.0)))
    with pytest.raises(TypeError, match="batch dimension"):
        profile(nn.Linear(3, 2), 3)
    with pytest.raises(ValueError, match="amp"):
        profile(nn.Linear(3, 2), torch.randn(1, 3), amp=torch.float64)


class Pair(NamedTuple):
    logits: torch.Tensor
    embedding: torch.Tensor


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    extras: dict
    note: str = "not a tensor"


class ManyOutputs(nn.Module):
    """Logits, an auxiliary head's output and an integer one, in a container of ``kind``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.body = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)
        self.aux = nn.Linear(4, 2)

    def forward(self, x):
        logits, aux = self.head(self.body(x)), self.aux(x)
        picked = logits.argmax(-1)  # an integer output: gathered, never seeded
        if self.kind == "dict":
            return {"logits": logits, "aux": aux, "picked": picked}
        if self.kind == "tuple":
            return logits, (aux, picked)
        if self.kind == "namedtuple":
            return Pair(logits, aux), picked
        return Output(logits, {"aux": [aux], "picked": picked})


@pytest.mark.parametrize("kind", ["dict", "tuple", "namedtuple", "dataclass"])
def test_every_output_tensor_is_found_and_seeded(kind):
    model = ManyOutputs(kind)
    cost = profile(model, torch.randn(1, 4))
    # hand-computed: a row of logits (3 floats), aux (2 floats) and one int64
    assert cost.output_tensors == 3 and cost.output_row_bytes == 3 * 4 + 2 * 4 + 8
    # a loss reads, and DataParallel scatters a gradient for, the floating ones alone
    assert cost.grad_output_count == 2 and cost.grad_output_bytes(5) == 5 * (3 * 4 + 2 * 4)
    forward, backward = counted(model, torch.randn(7, 4))
    assert cost.backward.flops(7) == backward
    # hand-computed: the head's weight and input gradients, the body's weight gradient,
    # and the aux head's weight gradient, there only if aux is seeded too
    assert backward == 2 * 7 * (6 * 3 + 6 * 3 + 4 * 6 + 4 * 2)


def test_a_module_returning_no_tensor_is_named():
    class Nothing(nn.Module):
        def forward(self, x):
            return {"text": "nothing"}

    with pytest.raises(TypeError, match="returned dict holding none"):
        profile(Nothing(), torch.randn(1, 3))


def test_batches_of_ids_and_masks_have_rows_of_the_samples_values():
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    mask = torch.tensor([[True, False, False, True, True]])
    for sample in (ids, mask):
        batch = rows_like(sample, 4)
        assert batch.dtype == sample.dtype and batch.shape == (4, 5)
        assert all(sorted(row.tolist()) == sorted(sample[0].tolist()) for row in batch)
    grown = rows_like(torch.randn(1, 3, requires_grad=True), 2)
    assert not grown.requires_grad  # an input with no history, as scatter's chunks


# --- estimates where torch counts nothing --------------------------------------------------


class Attention(nn.Module):
    """Self-attention over (batch, 6 tokens, 16 features) in 4 heads, by SDPA or by hand."""

    def __init__(self, explicit: bool) -> None:
        super().__init__()
        self.explicit = explicit
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = (t.unflatten(-1, (4, 4)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        if self.explicit:
            weights = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
            return weights @ v
        return F.scaled_dot_product_attention(q, k, v)


def test_the_attention_estimate_is_the_count_of_the_same_maths_by_hand():
    sdpa, explicit = Attention(explicit=False), Attention(explicit=True)
    fused = profile(sdpa, torch.randn(1, 6, 16))
    by_hand = profile(explicit, torch.randn(1, 6, 16))
    (forward,) = ops_named(fused.forward, "aten._scaled_dot_product_flash_attention_for_cpu")
    (backward,) = ops_named(
        fused.backward, "aten._scaled_dot_product_flash_attention_for_cpu_backward"
    )
    assert forward.estimated and backward.estimated and forward.kind == "matmul"
    for rows in (1, 64):
        hand_forward = sum(op.flops_at(rows) for op in ops_named(by_hand.forward, "aten.bmm"))
        hand_backward = sum(op.flops_at(rows) for op in ops_named(by_hand.backward, "aten.bmm"))
        # hand-computed: 2 matmuls of 2 * L * S * E per batch and head = 2 * 2 * 6 * 6 * 4 * 4
        assert forward.flops_at(rows) == hand_forward == rows * 4 * 2 * 2 * 6 * 6 * 4
        # the fused backward recomputes Q @ K^T: 5 matmuls where the explicit one runs 4
        assert backward.flops_at(rows) == pytest.approx(1.25 * hand_backward, rel=1e-12)
        assert fused.forward.flops(rows) == pytest.approx(by_hand.forward.flops(rows))


class CrossAttention(nn.Module):
    """6 tokens of queries on 3 learned key/value tokens (L != S), 4 heads of 4."""

    def __init__(self, explicit: bool) -> None:
        super().__init__()
        self.explicit = explicit
        self.query = nn.Linear(16, 16)
        self.memory = nn.Parameter(torch.randn(1, 4, 3, 4))

    def forward(self, x):
        q = self.query(x).unflatten(-1, (4, 4)).transpose(1, 2)
        k = v = self.memory.expand(len(x), -1, -1, -1)
        if self.explicit:
            return torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1) @ v
        return F.scaled_dot_product_attention(q, k, v)


def test_the_attention_estimate_reads_queries_keys_and_values_in_both_passes():
    fused = profile(CrossAttention(explicit=False), torch.randn(1, 6, 16))
    by_hand = profile(CrossAttention(explicit=True), torch.randn(1, 6, 16))
    name = "aten._scaled_dot_product_flash_attention_for_cpu"
    (forward,) = ops_named(fused.forward, name)
    (backward,) = ops_named(fused.backward, name + "_backward")
    hand_backward = sum(op.flops_at(3) for op in ops_named(by_hand.backward, "aten.bmm"))
    # hand-computed at 3 rows: 2 matmuls of 2 * L * S * E = 2 * 6 * 3 * 4, 4 heads each
    assert forward.flops_at(3) == 3 * 4 * 2 * 2 * 6 * 3 * 4
    # the explicit backward's 4 matmuls (the memory needs its gradients), fused: 5
    assert backward.flops_at(3) == pytest.approx(1.25 * hand_backward, rel=1e-12)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_multihead_attention_counts_its_attention_in_either_mode(mode, need_weights):
    layer = nn.MultiheadAttention(16, 4, batch_first=True).train(mode == "train")

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = layer

        def forward(self, x):
            return self.attention(x, x, x, need_weights=need_weights)[0]

    cost = profile(SelfAttention(), torch.randn(1, 6, 16))
    # hand-computed at 3 rows of 6 tokens: q, k, v and out projections 2 * 18 * 16 * 16 each,
    # the attention 2 * 2 * 3 * 6 * 6 * 16 (all heads together)
    projections, attention = 4 * 2 * 18 * 16 * 16, 2 * 2 * 3 * 6 * 6 * 16
    assert cost.forward.flops(3) == projections + attention
    assert any(op.estimated for op in cost.forward.ops) != need_weights  # bmm when weights


def test_the_encoder_layers_fast_path_estimate_is_its_slow_paths_count():
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    slow = profile(layer.eval(), torch.randn(1, 6, 16))
    frozen = layer.requires_grad_(False)  # eval, no gradients: torch's fused fast path
    fast = profile(frozen, torch.randn(1, 6, 16))
    (fused,) = ops_named(fast.forward, "aten._transformer_encoder_layer_fwd")
    assert fused.estimated and len(fast.backward) == 0 and fast.gradient_sizes == ()
    for rows in (1, 64):
        assert fused.flops_at(rows) == pytest.approx(slow.forward.flops(rows), rel=1e-12)


def test_the_lstm_estimate_is_the_count_of_an_explicit_cell_loop():
    class Loop(nn.Module):
        def __init__(self, lstm: nn.LSTM) -> None:
            super().__init__()
            self.cell = nn.LSTMCell(lstm.input_size, lstm.hidden_size)

        def forward(self, x):
            state, outputs = None, []
            for token in x.unbind(1):
                state = self.cell(token, state)
                outputs.append(state[0])
            return torch.stack(outputs, 1)

    class LastLayer(nn.Module):
        def __init__(self, lstm: nn.LSTM) -> None:
            super().__init__()
            self.lstm = lstm

        def forward(self, x):
            return self.lstm(x)[0]

    lstm = nn.LSTM(16, 8, batch_first=True)
    fused = profile(LastLayer(lstm), torch.randn(1, 5, 16))
    by_hand = profile(Loop(lstm), torch.randn(1, 5, 16))
    (forward,) = ops_named(fused.forward, "aten.mkldnn_rnn_layer")
    (backward,) = ops_named(fused.backward, "aten.mkldnn_rnn_layer_backward")
    assert forward.estimated and backward.estimated
    for rows in (1, 64):
        # hand-computed: 2 * 4H * (I + H) FLOPs per token = 2 * 32 * 24, 5 tokens a row
        assert forward.flops_at(rows) == by_hand.forward.flops(rows) == rows * 5 * 2 * 32 * 24
        assert backward.flops_at(rows) == 2 * forward.flops_at(rows)
        # the loop's backward skips the input's gradients (x needs none): less than fused
        assert by_hand.backward.flops(rows) < backward.flops_at(rows)
    deeper = profile(
        nn.LSTM(16, 8, num_layers=2, bidirectional=True, batch_first=True), torch.randn(1, 5, 16)
    )
    layers = ops_named(deeper.forward, "aten.mkldnn_rnn_layer")
    # hand-computed: the second layer reads both directions, 16 features: 2 * 32 * (16 + 8)
    assert [op.flops_at(3) for op in layers] == [15 * 2 * 32 * 24] * 4


# --- no silent zeros ---------------------------------------------------------------------


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_a_compute_heavy_op_without_an_estimate_warns_with_its_share(monkeypatch, which):
    name = "aten._scaled_dot_product_flash_attention_for_cpu"
    name += "_backward" if which == "backward" else ""
    monkeypatch.delitem(ESTIMATES, name)
    with pytest.warns(UserWarning) as caught:
        cost = profile(Attention(explicit=False), torch.randn(1, 6, 16))
    (message,) = [str(w.message) for w in caught]
    passed = getattr(cost, which)
    (op,) = ops_named(passed, name)
    share = op.bytes_at(5) / passed.nbytes(5)
    assert f"{name} in the {which} is compute-heavy" in message
    assert f"{share:.1%} of the {which}'s bytes at 5 rows" in message
    assert op.flops_at(5) == 0 and not op.estimated


def test_a_custom_op_that_torch_cannot_count_warns():
    @torch.library.custom_op("dpkit_profile_test::blur", mutates_args=())
    def blur(x: torch.Tensor) -> torch.Tensor:
        return x.roll(1, -1) + x

    @blur.register_fake
    def _(x):
        return torch.empty_like(x)

    class Blurred(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            return blur(self.linear(x).detach())

    with pytest.warns(
        UserWarning, match=r"dpkit_profile_test.blur in the forward.*forward's bytes"
    ):
        profile(Blurred(), torch.randn(1, 4))


def test_the_course_models_profile_without_a_warning():
    from dpkit.models import build_model, sample_input

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("mlp", "cnn", "transformer"):
            profile(build_model(name, seed=0), sample_input())


# --- work that grows with the batch squared ------------------------------------------------


class Contrastive(nn.Module):
    """Every row against every other: ``z @ z.T`` inside the model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 4)

    def forward(self, x):
        z = self.embed(x)
        return torch.logsumexp(z @ z.T, dim=1)


def test_work_growing_with_the_batch_squared_is_predicted_exactly():
    model = Contrastive()
    cost = profile(model, torch.randn(1, 8))
    rows = 64
    x = torch.randn(rows, 8)
    forward, backward = counted(model, x)
    assert cost.forward.flops(rows) == forward and cost.backward.flops(rows) == backward
    (matmul,) = ops_named(cost.forward, "aten.mm")
    assert matmul.flops == (0.0, 0.0, 2.0 * 4)  # hand-computed: 2 * rows * 4 * rows
    out = model(x)
    saved = replica_graph.walk([out], [*model.parameters(), x]).saved_nbytes
    assert cost.activation_bytes(rows) == saved
    assert cost.forward.nbytes(rows) == pytest.approx(
        sum(op.bytes_at(rows) for op in cost.forward.ops)
    )


def test_a_count_that_is_no_quadratic_falls_back_to_a_line():
    # a quadratic through 2, 3, 4 rows that misses 5 rows: the line through 2 and 5
    assert fit_rows([10, 10, 12, 12]) == (10 - 2 * 2 / 3, 2 / 3, 0.0)
    assert fit_rows([8, 17, 30, 47]) == (2.0, -1.0, 2.0)  # 2 - r + 2r^2, exactly


def test_runs_that_ran_different_ops_are_scaled_by_rows():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x):
            y = self.linear(x)
            return y.relu() if x.shape[0] > 3 else y

    cost = profile(Branchy(), torch.randn(1, 3))
    (addmm,) = ops_named(cost.forward, "aten.addmm")
    assert addmm.flops == (0.0, 2.0 * 3 * 3, 0.0)  # the 5-row run's, per row
    assert ops_named(cost.forward, "aten.relu")  # the largest run's ops


# --- the cache --------------------------------------------------------------------------


def test_the_cache_follows_eval_mode_and_frozen_parameters():
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.ReLU(), nn.Linear(6, 2))
    sample = torch.randn(1, 4)
    trained = profile(model, sample)
    assert profile(model, torch.randn(3, 4)) is trained  # another batch size, same profile
    assert ops_named(trained.forward, "aten.bernoulli_")
    model.eval()
    evaluated = profile(model, sample)
    assert evaluated is not trained and not ops_named(evaluated.forward, "aten.bernoulli_")
    model[0].weight.requires_grad_(False)
    frozen = profile(model, sample)
    assert frozen is not evaluated
    # hand-computed: the first weight (6 x 4 floats) is broadcast but gets no gradient
    assert frozen.parameter_sizes == (96, 24, 48, 8) and frozen.gradient_sizes == (24, 48, 8)
    assert frozen.backward.flops(5) < evaluated.backward.flops(5)
    model.train()
    model[1].eval()  # a submodule's own mode, kept by the copy that runs
    assert not ops_named(profile(model, sample).forward, "aten.bernoulli_")
    assert profile(model, sample, amp=torch.bfloat16) is not profile(model, sample)


def test_the_cache_follows_keyword_inputs():
    model = TwoInputs()
    args = (torch.randn(1, 4), torch.randint(0, 50, (1, 5)), 2)
    short = profile(model, args, {"mask": torch.ones(1, 5, dtype=torch.bool)})
    longer = profile(model, args[:2] + (3,), {"mask": torch.ones(1, 5, dtype=torch.bool)})
    assert longer is not short and longer.output_row_bytes == 24 * 4
    other_ids = (args[0], torch.randint(0, 50, (1, 7)), 2)
    wider = profile(model, other_ids, {"mask": torch.ones(1, 7, dtype=torch.bool)})
    assert wider is not short and wider.input_row_bytes == 4 * 4 + 7 * 8 + 7


# --- mixed precision -------------------------------------------------------------------


def test_autocast_on_the_cpu_runs_in_the_dtype_asked_for():
    # float16, not CPU autocast's default (bfloat16)
    mixed = profile(nn.Sequential(nn.Linear(8, 4)), torch.randn(1, 8), amp=torch.float16)
    (matmul,) = [op for op in mixed.forward.ops if op.kind == "matmul"]
    assert matmul.dtype == "float16"


def test_autocast_records_matmuls_in_bfloat16():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    full = profile(model, torch.randn(1, 8))
    mixed = profile(model, torch.randn(1, 8), amp=torch.bfloat16)
    assert mixed.amp == torch.bfloat16 and mixed.dtype == torch.float32
    matmuls = [op for op in (*mixed.forward.ops, *mixed.backward.ops) if op.kind == "matmul"]
    assert matmuls and all(op.dtype == "bfloat16" for op in matmuls)
    assert ops_named(mixed.forward, "aten._to_copy")  # autocast's casts are ops too
    first_full, first_mixed = (
        ops_named(full.forward, "aten.addmm")[0],
        ops_named(mixed.forward, "aten.addmm")[0],
    )
    assert first_mixed.flops == first_full.flops
    assert first_mixed.nbytes == tuple(b / 2 for b in first_full.nbytes)  # 2-byte values


def test_op_kinds():
    assert op_kind("aten.addmm") == op_kind("aten.bmm") == "matmul"
    assert op_kind("aten._scaled_dot_product_flash_attention_for_cpu") == "matmul"
    assert op_kind("aten.mkldnn_convolution") == "conv"
    assert op_kind("aten._slow_conv2d_forward") == "conv"
    assert op_kind("aten._thnn_fused_lstm_cell") == "memory"
    assert op_kind("aten._convert_indices_from_coo_to_csr") == "memory"
    assert op_kind("aten.native_layer_norm") == "memory"


def test_the_estimates_know_their_shapes():
    q, k, v = torch.empty(2, 3, 5, 4), torch.empty(2, 3, 7, 4), torch.empty(2, 3, 7, 6)
    # hand-computed: B * H * (2 L S E + 2 L S Ev)
    assert _attention_flops(q, k, v, backward=False) == 6 * (2 * 5 * 7 * 4 + 70 * 6)
    assert _attention_flops(q, k, v, backward=True) == 6 * 2 * 5 * 7 * (12 + 12)
    # every dim before the last two is a batch (heads or not): 3 batches of one head
    q, k, v = torch.empty(3, 5, 4), torch.empty(3, 7, 4), torch.empty(3, 7, 6)
    assert _attention_flops(q, k, v, backward=False) == 3 * (2 * 5 * 7 * 4 + 70 * 6)
    assert math.isclose(ESTIMATES["aten.dot"]((torch.empty(9), torch.empty(9)), {}), 18)


def test_multihead_attentions_fast_path_estimate_is_its_slow_paths_count():
    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, x):
            return self.attention(x, x, x)[0]

    model = SelfAttention().eval()
    slow = profile(model, torch.randn(1, 6, 16))
    fast = profile(model.requires_grad_(False), torch.randn(1, 6, 16))
    (fused,) = ops_named(fast.forward, "aten._native_multi_head_attention")
    assert fused.estimated and fused.kind == "matmul"
    for rows in (1, 64):
        assert fused.flops_at(rows) == pytest.approx(slow.forward.flops(rows), rel=1e-12)


def test_a_bilinear_layers_estimate_is_the_hand_count():
    class Pairwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bilinear = nn.Bilinear(4, 5, 3)

        def forward(self, x, y):
            return self.bilinear(x, y)

    cost = profile(Pairwise(), (torch.randn(1, 4), torch.randn(1, 5)))
    (forward,) = ops_named(cost.forward, "aten._trilinear")
    # hand-computed: 2 * rows * out * in1 * in2 (x1^T W x2 for each output)
    assert forward.estimated and forward.flops_at(7) == 2 * 7 * 3 * 4 * 5
    assert cost.backward.flops(7) == 2 * 7 * 3 * 4 * 5  # the weight's gradient alone


def test_calibrations_timed_runs_count_and_estimate_nothing():
    # calibration times ops without a counter, so that counting costs no time
    from dpkit.cost.profiling import run_passes

    forward, backward, _, _ = run_passes(
        Attention(explicit=False), torch.randn(2, 6, 16), None, True
    )
    assert all(op[1] == 0 and not op[6] for op in (*forward, *backward))
    assert all(op[3] > 0 for op in (*forward, *backward))  # every op timed, the backward's too
    assert any(op[0] == "aten._scaled_dot_product_flash_attention_for_cpu" for op in forward)


def test_an_unused_parameters_gradient_is_never_ready():
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.spare = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return self.used(x)

    profiled = profile(Unused(), torch.randn(1, 4))
    used, spare = profiled.gradient_ops[:2], profiled.gradient_ops[2:]
    assert spare == (-1, -1)  # spare.weight, spare.bias: autograd never makes theirs
    assert all(0 <= index < len(profiled.backward) for index in used)


def test_a_method_of_torchs_c_classes_counts_as_a_call():
    # Generator.manual_seed has no __module__ of its own: its class's (torch._C) says torch
    generator = torch.Generator()
    assert python_calls(lambda: generator.manual_seed(0)) == 1
    assert python_calls(lambda: [1, 2].copy()) == 0  # not torch's


def test_a_sparse_buffer_is_counted_by_its_values_and_indices():
    class Graph(nn.Module):  # a fixed sparse adjacency, as a graph network keeps one
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("adjacency", torch.eye(4).to_sparse())
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            return torch.sparse.mm(self.adjacency, self.linear(x).t()).t()

    profiled = profile(Graph(), torch.randn(1, 4))
    # hand-computed: 4 float32 values (16 B) and a 2 x 4 int64 index (64 B)
    assert profiled.buffer_sizes == (16 + 64,)
    (sparse,) = [op for op in profiled.forward.ops if "sparse" in op.name]
    assert sparse.bytes_at(2) >= 80 + 2 * (2 * 4 * 4)  # the adjacency, the 4 x 2 in and out


def test_without_a_record_of_which_outputs_need_grad_every_output_does():
    profiled = profile(nn.Linear(4, 3), torch.randn(1, 4))
    unknown = dataclasses.replace(profiled, grad_output_row_bytes=None, grad_output_tensors=None)
    assert unknown.grad_output_bytes(5) == 5 * profiled.output_row_bytes == 5 * 3 * 4
    assert unknown.grad_output_count == profiled.output_tensors


def test_a_module_without_tensor_inputs_runs_its_passes():
    class Learned(nn.Module):  # a learned constant (a prompt, a positional table)
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.ones(3, 4))

        def forward(self):
            return self.table * 2.0

    forward, backward, output, _ = run_passes(Learned(), (), None, False)
    assert [op[0] for op in forward] == ["aten.mul"]
    assert torch.equal(output, torch.full((3, 4), 2.0)) and backward


def test_a_namedtuple_input_is_batched_as_one():
    pair = collections.namedtuple("Pair", "features offset")

    class Shifted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, inputs):
            return self.linear(inputs.features) + inputs.offset

    profiled = profile(Shifted(), (pair(torch.randn(1, 4), torch.randn(1, 4)),))
    assert profiled.input_row_bytes == 2 * 4 * 4  # a row of each field
    assert profiled.forward.flops(3) == 2 * 3 * 4 * 4  # the Linear's, at 3 rows


def test_each_row_is_another_rotation_of_the_samples_row():
    rows = rows_like(torch.arange(8.0).unsqueeze(0), 4)
    assert len({tuple(row.tolist()) for row in rows}) == 4  # 8 features: still 4 rows apart
    assert all(sorted(row.tolist()) == list(range(8)) for row in rows)


def test_an_uncounted_op_run_twice_warns_once_with_both_shares(monkeypatch):
    name = "aten._scaled_dot_product_flash_attention_for_cpu"
    monkeypatch.delitem(ESTIMATES, name)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = Attention(explicit=False)

        def forward(self, x):
            return self.attention(self.attention(x).transpose(1, 2).flatten(2))

    with pytest.warns(UserWarning) as caught:
        cost = profile(Twice(), torch.randn(1, 6, 16))
    (message,) = [str(w.message) for w in caught if "in the forward" in str(w.message)]
    both = sum(op.bytes_at(5) for op in ops_named(cost.forward, name)) / cost.forward.nbytes(5)
    assert len(ops_named(cost.forward, name)) == 2
    assert f"{both:.1%} of the forward's bytes" in message


def test_a_prims_op_is_torchs_own_not_a_custom_one():
    class Squared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):  # prims have no autograd: on the input, off its path
            return self.linear(torch.ops.prims.mul(x, x))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a custom op without FLOPs would warn
        profiled = profile(Squared(), torch.randn(1, 4))
    assert [op.name for op in profiled.forward.ops][0] == "prims.mul"
