"""DataParallel on virtual CPU lanes equals single-device training.

Every test runs the same model twice: wrapped in ``dpkit.DataParallel`` (or
``dpkit.data_parallel``) on virtual CPU lanes, and as a ``copy.deepcopy`` run plainly on the
CPU. The plain run is the reference; expected chunk sizes come from ``torch.chunk``, never
from dpkit itself. Models are tiny so the whole file runs in a few seconds.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import threading
import warnings
from collections import namedtuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import lanes
from torch import nn
from torch.testing import assert_close

import dpkit

F64 = torch.float64


def torch_chunk_rows(x: torch.Tensor, n: int, dim: int = 0) -> list[int]:
    return [c.shape[dim] for c in torch.chunk(x, n, dim)]


def mlp(seed: int = 0, dtype: torch.dtype = F64, d_in: int = 5, d_out: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, 7), nn.Tanh(), nn.Linear(7, d_out)).to(dtype)


def grads_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameter gradients by name; a missing gradient counts as zeros.

    DataParallel's backward reduce-adds a zero gradient where a plain backward leaves None
    (torch.nn.DataParallel does the same), which is the same update for every optimiser.
    """
    out = {}
    for name, p in module.named_parameters():
        g = p.grad
        if g is None:
            g = torch.zeros_like(p)
        elif g.is_sparse:
            g = g.to_dense()
        out[name] = g
    return out


def assert_same_grads(module: nn.Module, reference: nn.Module, **tol) -> None:
    ours, theirs = grads_of(module), grads_of(reference)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert_close(ours[name], theirs[name], msg=lambda m, n=name: f"grad of {n}: {m}", **tol)


def assert_same_params(module: nn.Module, reference: nn.Module, **tol) -> None:
    ref = dict(reference.named_parameters())
    for name, p in module.named_parameters():
        assert_close(p.detach(), ref[name].detach(), msg=lambda m, n=name: f"{n}: {m}", **tol)


class Recorder(nn.Module):
    """Wraps a module and records, from inside each replica, what that replica saw.

    ``log`` is a plain list: replicas share it by reference (replicate copies ``__dict__``
    shallowly), so appends from every worker thread land in the same list.
    """

    def __init__(self, inner: nn.Module, dim: int = 0):
        super().__init__()
        self.inner = inner
        self.dim = dim
        self.log: list[dict] = []

    def forward(self, x):
        device = dpkit.current_device()
        self.log.append(
            {
                "rows": x.shape[self.dim],
                "lane": None if device is None else device.index,
                "thread": threading.current_thread(),
            }
        )
        return self.inner(x)


# --------------------------------------------------------------------------------------
# 1. Outputs and gradients, over batch sizes and device counts.

BATCH_DEVICES = [
    (1, 4),  # batch smaller than devices: one replica
    (2, 4),  # two of four devices idle
    (6, 4),  # 2, 2, 2: fourth device idle
    (10, 4),  # uneven: 3, 3, 3, 1
    (8, 4),  # even
    (10, 3),  # 4, 4, 2
    (7, 2),  # 4, 3
    (5, 1),  # one device
    (3, 3),
]


@pytest.mark.parametrize("batch,ndev", BATCH_DEVICES, ids=[f"b{b}-d{d}" for b, d in BATCH_DEVICES])
def test_outputs_and_gradients_match_plain_model(batch, ndev):
    model = Recorder(mlp(seed=batch * 10 + ndev))
    reference = copy.deepcopy(model)
    dp = dpkit.DataParallel(model, device_ids=lanes(ndev))

    torch.manual_seed(1)
    x = torch.randn(batch, 5, dtype=F64)
    x_dp = x.clone().requires_grad_()
    x_ref = x.clone().requires_grad_()

    out = dp(x_dp)
    expected = reference(x_ref)
    assert out.shape == expected.shape == (batch, 3)
    assert_close(out, expected)

    weights = torch.randn_like(expected)  # a non-uniform upstream gradient
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    assert_same_grads(model, reference)
    assert_close(x_dp.grad, x_ref.grad)

    # The replicas saw torch.chunk's chunks, one per used device, in device order.
    assert sorted((e["lane"] or 0, e["rows"]) for e in model.log) == list(
        enumerate(torch_chunk_rows(x, ndev))
    )


def test_tied_and_frozen_parameters_match_plain_model():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.embed = nn.Linear(4, 6, bias=False)
            self.frozen = nn.Linear(6, 6)
            self.frozen.requires_grad_(False)
            self.out = nn.Linear(6, 4, bias=False)
            self.head = nn.Linear(6, 4)
            self.head.weight = self.out.weight  # tied: one Parameter in two modules

        def forward(self, x):
            h = torch.tanh(self.frozen(self.embed(x)))
            return self.head(h) + self.out(h)

    model = Tied().to(F64)
    reference = copy.deepcopy(model)
    x = torch.randn(10, 4, dtype=F64)
    dpkit.DataParallel(model, lanes(4))(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    assert model.frozen.weight.grad is None and model.frozen.bias.grad is None
    assert_same_grads(model, reference)


@settings(
    max_examples=20,
    deadline=None,
    database=None,
)
@given(
    batch=st.integers(1, 9),
    ndev=st.integers(1, 4),
    dim=st.sampled_from([0, 1, -2]),
)
def test_property_any_batch_device_count_and_dim(batch, ndev, dim):
    # Input (3, 3, 5) with the batch size put on the axis chosen by dim; Linear acts on the
    # last axis, so any split of the first two axes must give the plain model's result.
    model = mlp(seed=batch + 7 * ndev)
    reference = copy.deepcopy(model)
    shape = [3, 3, 5]
    shape[dim] = batch
    x = torch.randn(*shape, dtype=F64)
    out = dpkit.DataParallel(model, lanes(ndev), dim=dim)(x)
    expected = reference(x)
    assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(model, reference)


# --------------------------------------------------------------------------------------
# 2. Optimiser steps.


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        lambda params: torch.optim.Adam(params, lr=0.05),
    ],
    ids=["sgd-momentum", "adam"],
)
def test_five_optimizer_steps_match_plain_training(make_optimizer):
    model = mlp(seed=11)
    reference = copy.deepcopy(model)
    dp = dpkit.DataParallel(model, lanes(4))
    opt, ref_opt = make_optimizer(model.parameters()), make_optimizer(reference.parameters())
    torch.manual_seed(12)
    start = [p.detach().clone() for p in model.parameters()]
    for step in range(5):
        x = torch.randn(10, 5, dtype=F64)
        target = torch.randn(10, 3, dtype=F64)
        for module, optimizer in ((dp, opt), (reference, ref_opt)):
            optimizer.zero_grad()
            nn.functional.mse_loss(module(x), target).backward()
            optimizer.step()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert_close(p.detach(), q.detach(), msg=lambda m, n=name, s=step: f"step {s} {n}: {m}")
    # The training really moved the parameters (so equality above is not trivially true).
    assert any(not torch.equal(a, p) for a, p in zip(start, model.parameters()))


# --------------------------------------------------------------------------------------
# 3. dim=1


class PerTimestep(nn.Module):
    """Input (batch, time, features), split over time: a Linear per step plus a batch mean.

    The batch mean mixes rows of dim 0, so the result is right only if the split is on dim 1.
    """

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.proj = nn.Linear(4, 6)
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, x):
        self.shapes.append(tuple(x.shape))
        h = self.proj(x)
        return h - h.mean(dim=0, keepdim=True) * 0.5


def test_dim1_scatters_and_gathers_along_time():
    model = PerTimestep().to(F64)
    reference = copy.deepcopy(model)
    x = torch.randn(3, 10, 4, dtype=F64)
    out = dpkit.DataParallel(model, lanes(4), dim=1)(x)
    expected = reference(x)
    assert out.shape == (3, 10, 6)
    assert_close(out, expected)
    assert sorted(model.shapes, key=lambda s: -s[1]) == [(3, 3, 4)] * 3 + [(3, 1, 4)]
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    assert_same_grads(model, reference)


# --------------------------------------------------------------------------------------
# 4. Keyword arguments: tensors scattered, other objects shared.


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.lin = nn.Linear(5, 3)
        self.seen: list[tuple] = []

    def forward(self, x, scale: float, mask: torch.Tensor | None = None):
        self.seen.append((x.shape[0], scale, None if mask is None else mask.shape[0]))
        y = self.lin(x) * scale
        if mask is not None:
            y = y * mask
        return y


@pytest.mark.parametrize(
    "batch,with_mask", [(10, True), (10, False), (6, True), (8, False)], ids=str
)
def test_keyword_arguments_tensor_scattered_non_tensor_shared(batch, with_mask):
    model = Scaled().to(F64)
    reference = copy.deepcopy(model)
    x = torch.randn(batch, 5, dtype=F64)
    mask = (torch.rand(batch, 3) > 0.3).to(F64) if with_mask else None
    kwargs = {"scale": 2.5} if mask is None else {"scale": 2.5, "mask": mask}
    out = dpkit.DataParallel(model, lanes(4))(x, **kwargs)
    expected = reference(x, **kwargs)
    assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(model, reference)
    rows = torch_chunk_rows(x, 4)
    assert sorted(model.seen, key=lambda s: -s[0]) == [
        (r, 2.5, r if with_mask else None) for r in rows
    ]


# --------------------------------------------------------------------------------------
# 5. Nested inputs and outputs.

Pair = namedtuple("Pair", ["left", "right"])
Out = namedtuple("Out", ["score", "features"])


class Nested(nn.Module):
    def __init__(self, output_kind: str):
        super().__init__()
        torch.manual_seed(8)
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(2, 3)
        self.output_kind = output_kind

    def forward(self, batch: dict, extra: tuple, pair: Pair):
        h = self.a(batch["x"]) + self.b(batch["nested"][0]) * batch["nested"][1]
        h = h + self.a(pair.left) * pair.right + extra[0] - extra[1]
        score = h.sum(dim=1)
        if self.output_kind == "dict":
            return {"score": score, "features": h, "pair": Out(score * 2, h.tanh())}
        return Out(score=score, features=h)


@pytest.mark.parametrize("output_kind", ["dict", "namedtuple"])
def test_nested_inputs_and_outputs(output_kind):
    model = Nested(output_kind).to(F64)
    reference = copy.deepcopy(model)
    n = 10
    batch = {
        "x": torch.randn(n, 4, dtype=F64),
        "nested": (torch.randn(n, 2, dtype=F64), torch.randn(n, 1, dtype=F64)),
    }
    extra = (torch.randn(n, 3, dtype=F64), torch.randn(n, 3, dtype=F64))
    pair = Pair(torch.randn(n, 4, dtype=F64), torch.randn(n, 1, dtype=F64))
    x_dp = batch["x"].clone().requires_grad_()
    x_ref = batch["x"].clone().requires_grad_()
    out = dpkit.DataParallel(model, lanes(4))({**batch, "x": x_dp}, extra, pair)
    expected = reference({**batch, "x": x_ref}, extra, pair)

    assert type(out) is type(expected)
    if output_kind == "dict":
        assert list(out) == ["score", "features", "pair"]
        assert type(out["pair"]) is Out
        flat_out = [out["score"], out["features"], *out["pair"]]
        flat_ref = [expected["score"], expected["features"], *expected["pair"]]
    else:
        flat_out, flat_ref = list(out), list(expected)
    for a, b in zip(flat_out, flat_ref):
        assert_close(a, b)

    sum(t.pow(2).sum() for t in flat_out).backward()
    sum(t.pow(2).sum() for t in flat_ref).backward()
    assert_same_grads(model, reference)
    assert_close(x_dp.grad, x_ref.grad)


# --------------------------------------------------------------------------------------
# 6. Double backward.


@pytest.mark.parametrize("batch,ndev", [(10, 4), (6, 4), (4, 2)])
def test_gradient_penalty_double_backward(batch, ndev):
    model = mlp(seed=21, d_out=1)
    reference = copy.deepcopy(model)
    dp = dpkit.DataParallel(model, lanes(ndev))
    x = torch.randn(batch, 5, dtype=F64)
    results = []
    for module in (dp, reference):
        xi = x.clone().requires_grad_()
        out = module(xi)
        (grad_x,) = torch.autograd.grad(out.sum(), xi, create_graph=True)
        penalty = grad_x.pow(2).sum() + out.pow(2).mean()
        penalty.backward()
        results.append((grad_x.detach(), xi.grad))
    assert_close(results[0][0], results[1][0])
    assert_close(results[0][1], results[1][1])
    assert_same_grads(model, reference)
    assert model[0].weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------
# 7. Sparse embedding gradients.


def test_sparse_embedding_gradient():
    torch.manual_seed(9)
    model = nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Linear(4, 2)).to(F64)
    reference = copy.deepcopy(model)
    idx = torch.tensor([[1, 2], [3, 1], [5, 6], [7, 1], [9, 0], [1, 19], [4, 4], [2, 2], [0, 8]])
    out = dpkit.DataParallel(model, lanes(4))(idx)
    expected = reference(idx)
    assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    grad = model[0].weight.grad
    assert grad is not None and grad.is_sparse
    assert_close(grad.to_dense(), reference[0].weight.grad.to_dense())
    assert_same_grads(model, reference)
    # And a sparse-aware optimiser step lands in the same place.
    for m in (model, reference):
        torch.optim.SGD(m.parameters(), lr=0.5).step()
    assert_same_params(model, reference)


# --------------------------------------------------------------------------------------
# 8. BatchNorm statistics come from replica 0's chunk only.


@pytest.mark.parametrize("batch", [8, 10])
def test_batchnorm_running_stats_from_first_chunk(batch):
    torch.manual_seed(13)
    model = nn.BatchNorm1d(3).to(F64)
    x = torch.randn(batch, 3, 5, dtype=F64) * 3 + torch.arange(batch, dtype=F64).view(-1, 1, 1)
    first_chunk_ref = copy.deepcopy(model)
    whole_batch_ref = copy.deepcopy(model)
    per_chunk_refs = [copy.deepcopy(model) for _ in torch.chunk(x, 4)]

    out = dpkit.DataParallel(model, lanes(4))(x)

    first_chunk_ref(torch.chunk(x, 4)[0])
    assert_close(model.running_mean, first_chunk_ref.running_mean)
    assert_close(model.running_var, first_chunk_ref.running_var)
    assert model.num_batches_tracked.item() == 1
    # ...which is not what the whole batch would give (so the check above can fail).
    whole_batch_ref(x)
    assert not torch.allclose(model.running_mean, whole_batch_ref.running_mean)
    # Each replica normalises its chunk with that chunk's own batch statistics.
    expected = torch.cat([m(c) for m, c in zip(per_chunk_refs, torch.chunk(x, 4))])
    assert_close(out, expected)


def test_batchnorm_in_train_mode_under_inference_mode():
    # A plain BatchNorm in train mode works under torch.inference_mode(); so should DP.
    # Inference mode is thread-local like grad mode: if the workers do not run in it, the
    # buffer copies made for lanes 1.. (inference tensors) cannot be updated in place there.
    model = nn.BatchNorm1d(3)
    reference = copy.deepcopy(model)
    x = torch.randn(8, 3)
    with torch.inference_mode():
        expected = reference(x[:2])
        out = dpkit.DataParallel(model, lanes(4))(x)
    assert_close(out[:2], expected)
    assert_close(model.running_mean, reference.running_mean)


# --------------------------------------------------------------------------------------
# 9, 10, 17. What happens to the wrapped module: counters, hooks, replicas per used device.


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_counter_attribute_written_in_forward_is_lost_on_replicas():
    model = Counting()
    dp = dpkit.DataParallel(model, lanes(4))
    dp(torch.randn(10, 5))
    dp(torch.randn(3, 5))
    assert model.calls == 0
    model(torch.randn(2, 5))
    assert model.calls == 1


@pytest.mark.parametrize("batch", [6, 10, 2, 1])
def test_forward_hooks_run_once_per_used_replica(batch):
    model = Counting()
    reference = copy.deepcopy(model)
    pre_rows, post_rows = [], []

    def pre_hook(module, args):
        pre_rows.append(args[0].shape[0])

    def post_hook(module, args, output):
        post_rows.append(output.shape[0])
        return output * 2  # a hook may change the output; DP must keep that

    for m in (model, reference):
        m.register_forward_pre_hook(pre_hook)
        m.register_forward_hook(post_hook)
    x = torch.randn(batch, 5)
    out = dpkit.DataParallel(model, lanes(4))(x)
    expected_rows = torch_chunk_rows(x, 4)
    assert sorted(pre_rows, reverse=True) == expected_rows
    assert sorted(post_rows, reverse=True) == expected_rows
    pre_rows.clear()
    post_rows.clear()
    assert_close(out, reference(x), rtol=1e-5, atol=1e-6)
    assert pre_rows == post_rows == [batch]


@pytest.mark.parametrize("batch,used", [(2, 2), (6, 3), (1, 1)])
def test_replicas_only_for_devices_that_got_a_chunk(batch, used):
    model = Recorder(nn.Linear(5, 3))
    hook_calls = []
    model.register_forward_hook(lambda m, a, o: hook_calls.append(o.shape[0]))
    out = dpkit.DataParallel(model, lanes(4))(torch.randn(batch, 5))
    assert out.shape == (batch, 3)
    assert len(hook_calls) == used
    assert sorted(e["lane"] for e in model.log) == list(range(used))
    threads = {id(e["thread"]) for e in model.log}
    assert len(threads) == used
    if used > 1:  # each replica in its own worker thread, as torch's parallel_apply
        assert all(e["thread"] is not threading.main_thread() for e in model.log)


# --------------------------------------------------------------------------------------
# 11. No reference cycles.


@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
def test_no_reference_cycles_after_forward_and_backward(traced):
    """Replicas, their copies and the autograd graph are freed by reference counting alone,
    tracing or not (a cycle would keep every step's replicas until the GC runs)."""
    model = mlp(seed=2)
    dp = dpkit.DataParallel(model, lanes(4))
    dp(torch.randn(10, 5, dtype=F64)).sum().backward()  # warm-up: lazy imports, caches
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        with dpkit.trace() if traced else contextlib.nullcontext():
            x = torch.randn(10, 5, dtype=F64, requires_grad=True)
            out = dp(x)
            out.sum().backward()
            del out, x
        found = gc.collect()
        kinds = sorted({type(o).__qualname__ for o in gc.garbage})
        assert found == 0, f"{found} objects in reference cycles: {kinds[:20]}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


# --------------------------------------------------------------------------------------
# 12. Exceptions in a replica.


class BoomOnLane2(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.finished: list[int] = []

    def forward(self, x):
        lane = dpkit.current_device().index
        if lane == 2:
            raise ValueError("boom")
        out = self.lin(x)
        self.finished.append(lane)
        return out


def test_exception_in_one_replica_is_reraised_with_replica_and_device():
    model = BoomOnLane2()
    devs = lanes(4)
    # (lane memory's releaser thread may end meanwhile: it is not a replica's worker)
    workers = lambda: {t for t in threading.enumerate() if t.name != "dpkit-lane-memory"}  # noqa: E731
    threads_before = workers()
    with pytest.raises(ValueError) as info:
        dpkit.DataParallel(model, devs)(torch.randn(10, 5))
    message = str(info.value)
    assert "in replica 2" in message
    assert devs[2].name in message
    assert "boom" in message
    assert workers() == threads_before
    assert sorted(model.finished) == [0, 1, 3]  # the other workers ran and were joined


# --------------------------------------------------------------------------------------
# 13. Grad mode and autocast are carried into the workers.


class Inspect(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.seen: list[dict] = []

    def forward(self, x):
        y = self.lin(x)
        self.seen.append(
            {
                "lane": getattr(dpkit.current_device(), "index", None),
                "grad_enabled": torch.is_grad_enabled(),
                "param_requires_grad": self.lin.weight.requires_grad,
                "dtype": y.dtype,
                "output_requires_grad": y.requires_grad,
            }
        )
        return y


@pytest.mark.parametrize("grad_enabled", [False, True])
def test_grad_mode_is_carried_into_workers(grad_enabled):
    model = Inspect()
    x = torch.randn(10, 5)
    with torch.set_grad_enabled(not grad_enabled):
        with torch.set_grad_enabled(grad_enabled):  # the innermost setting is what counts
            out = dpkit.DataParallel(model, lanes(4))(x)
    assert len(model.seen) == 4
    assert all(s["grad_enabled"] is grad_enabled for s in model.seen)
    # Replica 0 holds the module's own Parameters (as in torch), so only the copies on the
    # other lanes show the grad mode through requires_grad.
    assert all(s["param_requires_grad"] is grad_enabled for s in model.seen if s["lane"] != 0)
    assert all(not s["output_requires_grad"] for s in model.seen) or grad_enabled
    assert all(s["output_requires_grad"] for s in model.seen) or not grad_enabled
    assert (out.grad_fn is not None) is grad_enabled
    assert out.requires_grad is grad_enabled


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_is_carried_into_workers(dtype):
    # The autocast dtype is thread-local too: a worker that only re-enables autocast gets
    # the thread default (bfloat16 on CPU), not the caller's dtype.
    model = Inspect()
    reference = copy.deepcopy(model)
    x = torch.randn(10, 5)
    with torch.autocast("cpu", dtype=dtype):
        out = dpkit.DataParallel(model, lanes(4))(x)
        expected = reference(x)
    assert expected.dtype == dtype  # the plain model computes in the caller's dtype
    assert [s["dtype"] for s in model.seen] == [dtype] * 4
    assert out.dtype == dtype
    assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_autocast_off_by_default_in_workers():
    model = Inspect()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            dpkit.DataParallel(model, lanes(4))(torch.randn(10, 5))
    assert [s["dtype"] for s in model.seen] == [torch.float32] * 4


# --------------------------------------------------------------------------------------
# 14. state_dict.


def test_state_dict_has_module_prefix_and_loads_into_plain_model():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    dp = dpkit.DataParallel(model, lanes(4))
    dp(torch.randn(8, 5))  # changes the running statistics
    state = dp.state_dict()
    assert list(state) == ["module." + k for k in model.state_dict()]
    fresh = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    fresh.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    # And the other way round: a plain state dict loads into the DataParallel wrapper.
    dp2 = dpkit.DataParallel(copy.deepcopy(fresh), lanes(2))
    dp2.load_state_dict({"module." + k: v for k, v in model.state_dict().items()})
    x = torch.randn(6, 5)
    fresh.eval()
    dp2.eval()
    assert_close(dp2(x), fresh(x))


# --------------------------------------------------------------------------------------
# 15. A forward without inputs.


class NoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.value = nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        self.calls: list = []

    def forward(self):
        self.calls.append(dpkit.current_device())
        return self.value * 2


def _data_parallel_functional(model, devices, timeout):
    return lambda: dpkit.data_parallel(model, None, devices, timeout=timeout)


# timeout= runs the module in a worker thread even on one device, which must still be told its
# device: with no input tensor to find it from, parallel_apply could not.
@pytest.mark.parametrize("form", [dpkit.DataParallel, _data_parallel_functional])
@pytest.mark.parametrize("timeout", [None, 30.0])
@pytest.mark.parametrize("ndev", [1, 4])
def test_forward_without_inputs_runs_once_on_device_0(ndev, timeout, form):
    model = NoInputs()
    out = form(model, lanes(ndev), timeout=timeout)()
    assert len(model.calls) == 1
    if ndev > 1:
        assert model.calls[0].index == 0
    assert_close(out, torch.tensor([2.0, 4.0, 6.0]))
    out.sum().backward()
    assert_close(model.value.grad, torch.full((3,), 2.0))


# --------------------------------------------------------------------------------------
# 16. Scalar outputs.


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(17)
        self.lin = nn.Linear(5, 2)

    def forward(self, x, y):
        return (self.lin(x) - y).pow(2).mean()


@pytest.mark.parametrize("batch,used", [(10, 4), (6, 3), (2, 2)])
def test_scalar_outputs_become_a_vector_per_device(batch, used):
    model = Loss().to(F64)
    reference = copy.deepcopy(model)
    x, y = torch.randn(batch, 5, dtype=F64), torch.randn(batch, 2, dtype=F64)
    with pytest.warns(UserWarning, match="scalars"):
        out = dpkit.DataParallel(model, lanes(4))(x, y)
    per_chunk = [reference(a, b) for a, b in zip(torch.chunk(x, 4), torch.chunk(y, 4))]
    assert out.shape == (used,)
    assert_close(out, torch.stack(per_chunk))
    out.sum().backward()
    sum(per_chunk).backward()
    assert_same_grads(model, reference)


def test_single_replica_scalar_output_stays_plain():
    # As in torch: with one device the module is called directly (a plain scalar, no
    # warning); with four devices and batch 1 the one output is still gathered (a 1-vector).
    model = Loss().to(F64)
    x, y = torch.randn(1, 5, dtype=F64), torch.randn(1, 2, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        single = dpkit.DataParallel(model, lanes(1))(x, y)
    assert single.dim() == 0
    with pytest.warns(UserWarning, match="scalars"):
        out = dpkit.DataParallel(model, lanes(4))(x, y)
    assert out.shape == (1,)
    assert_close(out[0], single)


# --------------------------------------------------------------------------------------
# The functional form.


@pytest.mark.parametrize("batch,ndev", [(10, 4), (2, 4), (5, 1), (7, 3), (6, 2)])
def test_functional_data_parallel_outputs_and_grads(batch, ndev):
    model = Scaled().to(F64)
    reference = copy.deepcopy(model)
    x = torch.randn(batch, 5, dtype=F64)
    mask = torch.rand(batch, 3, dtype=F64)
    x_dp, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = dpkit.data_parallel(
        model, (x_dp, 1.5), device_ids=lanes(ndev), module_kwargs={"mask": mask}
    )
    expected = reference(x_ref, 1.5, mask=mask)
    assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    assert_same_grads(model, reference)
    assert_close(x_dp.grad, x_ref.grad)
    assert sorted(s[0] for s in model.seen) == sorted(torch_chunk_rows(x, ndev))


def test_functional_data_parallel_single_tensor_input_and_dim1():
    model = PerTimestep().to(F64)
    reference = copy.deepcopy(model)
    x = torch.randn(3, 7, 4, dtype=F64)
    out = dpkit.data_parallel(model, x, device_ids=lanes(4), dim=1)
    expected = reference(x)
    assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(model, reference)
    assert sorted(s[1] for s in model.shapes) == sorted(torch_chunk_rows(x, 4, dim=1))


def test_output_device_other_than_device_0():
    model = mlp(seed=30)
    reference = copy.deepcopy(model)
    devs = lanes(4)
    x = torch.randn(10, 5, dtype=F64)
    out = dpkit.DataParallel(model, devs, output_device=devs[2])(x)
    assert dpkit.device_of(out) == devs[2]
    expected = reference(x)
    assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(model, reference)


def test_a_subclass_overriding_the_steps_is_called_as_torchs_dataparallel_calls_it():
    # torch's DataParallel.forward calls self.scatter, self.replicate, self.parallel_apply and
    # self.gather: overriding one is how users customise a step.
    calls = []

    class Watched(dpkit.DataParallel):
        def scatter(self, inputs, kwargs, device_ids):
            calls.append(("scatter", len(device_ids)))
            return super().scatter(inputs, kwargs, device_ids)

        def replicate(self, module, device_ids):
            calls.append(("replicate", len(device_ids)))
            return super().replicate(module, device_ids)

        def parallel_apply(self, replicas, inputs, kwargs):
            calls.append(("parallel_apply", len(replicas)))
            return super().parallel_apply(replicas, inputs, kwargs)

        def gather(self, outputs, output_device):
            calls.append(("gather", len(outputs)))
            return super().gather(outputs, output_device)

    model = mlp(seed=31)
    x = torch.randn(2, 5, dtype=F64)  # 2 rows over 4 devices: 2 replicas
    assert_close(Watched(model, lanes(4))(x), copy.deepcopy(model)(x))
    assert calls == [("scatter", 4), ("replicate", 2), ("parallel_apply", 2), ("gather", 2)]
