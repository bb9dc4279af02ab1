"""A model's cost, read off the real module running on a sample input: :func:`profile`.

The surprise first: nothing here is a hand formula, except where torch counts nothing. The
FLOPs are what ``FlopCounterMode`` counts for each aten op the module really runs, forward
and backward; the bytes, the sizes of each op's tensors; the activations, what autograd
really saved (:mod:`dpkit.tracing.replica_graph`). An op doing a matmul's work uncounted
(attention, ``nn.LSTM``, fast paths) gets an estimate from its maths (:data:`ESTIMATES`);
any other compute-heavy op without a count makes :func:`profile` warn. numpy inside a custom
autograd Function runs no aten op, so its work is missing without a warning. The module
runs on 2 to 5 rows, each count fitted to rows (:func:`fit_rows`).
"""

import copy
import dataclasses
import functools
import math
import re
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dpkit import host_clock
from dpkit.nested import tensor_nbytes, tensors_in
from dpkit.tracing import replica_graph

PROFILE_ROWS = (2, 3, 4)  # the batch sizes each count's quadratic passes through
CHECK_ROWS = 5  # the batch size that checks it
# autocast's dtypes, by the names profile(amp=...), predict(amp=...) and --amp take
AMP_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
              "float16": torch.float16}  # fmt: skip

Coefficients = tuple[float, float, float]


def _evaluate(coefficients: Sequence[float], rows: int) -> float:
    """``a + b * rows + c * rows**2`` (a shorter tuple is a line or a constant), at least 0."""
    return max(0.0, sum(c * rows**power for power, c in enumerate(coefficients)))


@dataclasses.dataclass(frozen=True)
class OpCost:
    """One aten op of a pass, its ``flops`` and ``nbytes`` as ``(a, b, c)`` of rows."""

    name: str
    flops: Coefficients
    nbytes: Coefficients  # read + written; 0 for a view
    kind: str = "memory"  # or "matmul", "conv"
    dtype: str = "float32"  # the one it computes in
    estimated: bool = False  # the FLOPs are dpkit's estimate (ESTIMATES), not torch's count
    fill: float = 1.0  # of the CPU's vector lanes a convolution fills (vector_fill); else 1

    def flops_at(self, rows: int) -> float:
        return _evaluate(self.flops, rows)

    def work_at(self, rows: int) -> float:
        """What a calibrated machine's curves price: FLOPs as if every vector lane were
        filled (a narrow convolution's empty lanes take time too), else bytes."""
        flops = self.flops_at(rows)
        return flops / self.fill if flops > 0 else self.bytes_at(rows)

    def bytes_at(self, rows: int) -> float:
        return _evaluate(self.nbytes, rows)


@dataclasses.dataclass(frozen=True)
class PassCost:
    """The ops of a forward or a backward, in the order they ran; ``calls``: how many of
    torch's functions the forward's Python called (its host work: a GRU's one call runs
    hundreds of aten ops from C++), None for a backward (autograd's engine is C++)."""

    ops: tuple[OpCost, ...]
    calls: int | None = None

    def flops(self, rows: int) -> float:
        return sum(op.flops_at(rows) for op in self.ops)

    def nbytes(self, rows: int) -> float:
        return sum(op.bytes_at(rows) for op in self.ops)

    def __len__(self) -> int:
        return len(self.ops)


@dataclasses.dataclass(frozen=True)
class Profile:
    """What one replica's step costs, per row of its chunk and per model."""

    dtype: torch.dtype
    forward: PassCost
    backward: PassCost
    # bytes per tensor in parameters()/buffers() order: what replicate broadcasts
    parameter_sizes: tuple[int, ...]
    buffer_sizes: tuple[int, ...]
    modules: int  # what replicate builds per replica
    input_row_bytes: int
    output_row_bytes: int
    activations: Coefficients  # the bytes autograd saves
    gradient_sizes: tuple[int, ...] = ()  # of the parameters that require grad: what reduce sums
    amp: torch.dtype | None = None  # autocast's dtype
    output_tensors: int = 1  # what gather copies
    # per gradient, the backward op after which it is ready (-1: never, an unused parameter)
    gradient_ops: tuple[int, ...] = ()
    # Of the outputs that require grad (None: every output): the only ones the loss reads and
    # whose gradient DataParallel scatters back (torch runs Gather.backward only on its path).
    grad_output_row_bytes: int | None = None
    grad_output_tensors: int | None = None

    @property
    def parameter_bytes(self) -> int:
        return sum(self.parameter_sizes)

    @property
    def gradient_bytes(self) -> int:
        return sum(self.gradient_sizes)

    @property
    def buffer_bytes(self) -> int:
        return sum(self.buffer_sizes)

    def input_bytes(self, rows: int) -> int:
        return rows * self.input_row_bytes

    def output_bytes(self, rows: int) -> int:
        return rows * self.output_row_bytes

    def grad_output_bytes(self, rows: int) -> int:
        per_row = self.grad_output_row_bytes
        return rows * (self.output_row_bytes if per_row is None else per_row)

    @property
    def grad_output_count(self) -> int:
        count = self.grad_output_tensors
        return self.output_tensors if count is None else count

    def activation_bytes(self, rows: int) -> int:
        return round(_evaluate(self.activations, rows))


MATMUL_OPS = frozenset(f"aten.{name}" for name in (
    "mm addmm bmm baddbmm matmul linear addmv mv dot vdot addbmm _addmm_activation _scaled_mm "
    "_int_mm _trilinear").split())  # fmt: skip
# (Not ``_thnn_fused_lstm_cell``: CUDA's gates, elementwise after the matmuls before it.)
_ATTENTION_OR_RNN = re.compile(
    r"attention|_cudnn_rnn|miopen_rnn|mkldnn_rnn|_transformer_encoder|"
    r"^aten\.(lstm|gru|rnn_tanh|rnn_relu)$"
)
_CONV = re.compile(r"convolution|slow_conv|conv_depthwise|conv_tbc|conv_transpose|conv\dd")
# Compute-heavy ops that no FlopCounterMode formula and no estimate of ours covers: linear
# algebra, FFTs, pairwise distances. Zero FLOPs for them is a warning, not a fact.
_HEAVY_UNCOUNTED = re.compile(
    r"^aten\.(_?linalg_(?!vector_norm|matrix_norm)|_fft_|fft_|cholesky|triangular_solve|_cdist|_euclidean_dist|"
    r"inverse|_?lu|qr|svd|_?eig|slogdet|det|_weight_int\dpack_mm|_convert_weight_to_int)"
    r"(?!.*check_errors)"  # _linalg_check_errors only reads an info tensor
)


@functools.cache  # a few hundred names, looked up once per op run
def op_kind(name: str) -> str:
    if name in MATMUL_OPS or _ATTENTION_OR_RNN.search(name):
        return "matmul"
    return "conv" if _CONV.search(name) else "memory"


Estimate = Callable[[tuple, dict], float]  # the op's args and kwargs -> FLOPs

# The CPU's vector register in bytes: AVX-512's 64, AVX2's 32, else (NEON, SSE) 16.
_CAPABILITY = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")()
VECTOR_BYTES = 64 if "AVX512" in _CAPABILITY else 32 if "AVX2" in _CAPABILITY else 16
# Where a convolution's weight and groups are (``transposed`` two before groups): forward
# (input, weight, ..., groups), backward (grad, input, weight, ..., groups, mask)
_CONV_WEIGHT = {"aten.convolution": (1, 8), "aten.convolution_backward": (2, 9)}


def vector_fill(weight: torch.Tensor, groups: int) -> float:
    """The share of the CPU's vector lanes a convolution fills (grouped ones, and any off the
    CPU, whose units are not these vectors: 1). oneDNN computes it as a product of (output
    channels) x (input channels x kernel), each side cut into vectors (16 float32 on AVX-512):
    4 outputs fill a quarter, 1 input x 3x3 = 9 of 16. Measured here (benchmarks/conv_rates.py),
    FLOPs / fill spread 2-2.6x across layers, FLOPs alone 11-13x."""
    if groups != 1 or weight.dim() < 3 or weight.device.type != "cpu":
        return 1.0
    lanes = VECTOR_BYTES // weight.element_size()
    sides = (weight.shape[0], math.prod(weight.shape[1:]))
    return math.prod(side / (math.ceil(side / lanes) * lanes) for side in sides)


def _conv_fill(name: str, args: tuple) -> float:
    where = _CONV_WEIGHT.get(name)
    if where is None or len(args) <= where[1] or args[where[1] - 2]:  # transposed: not known
        return 1.0
    return vector_fill(args[where[0]], args[where[1]])


def _tokens(tensor: torch.Tensor) -> int:
    """Rows of features: every dim but the last."""
    return tensor.numel() // tensor.shape[-1] if tensor.dim() and tensor.shape[-1] else 0


def _attention_flops(query: Any, key: Any, value: Any, backward: bool) -> float:
    """Attention's ``Q @ K^T`` and ``P @ V``, 2 * L * S * E FLOPs each per batch and head;
    backward recomputes ``Q @ K^T`` and runs ``dP``, ``dV``, ``dQ``, ``dK`` (2.5 times the
    forward, as torch's ``sdpa_backward_flop_count`` for CUDA). Masks are not taken off."""
    length, width, value_width = query.shape[-2], query.shape[-1], value.shape[-1]
    inner = 3 * width + 2 * value_width if backward else width + value_width
    return 2.0 * math.prod(query.shape[:-2]) * length * key.shape[-2] * inner


def _native_mha(args: tuple, kwargs: dict) -> float:
    """``nn.MultiheadAttention``'s fast path (eval, no gradients): 4 projections, attention."""
    query, key, value, embed_dim = args[:4]
    projections = 2.0 * embed_dim * embed_dim * (2 * _tokens(query) + _tokens(key) + _tokens(value))
    return projections + 4.0 * _tokens(query) * key.shape[-2] * embed_dim


def _encoder_layer(args: tuple, kwargs: dict) -> float:
    """``nn.TransformerEncoderLayer``'s fast path: its four weight matmuls and attention."""
    src, embed_dim = args[0], args[1]
    weights = (args[3], args[5], args[14], args[16])  # qkv, proj, ffn 1, ffn 2
    matmuls = 2.0 * _tokens(src) * sum(w.numel() for w in weights)
    return matmuls + 4.0 * _tokens(src) * src.shape[-2] * embed_dim


def _sdpa(args: tuple, kwargs: dict, backward: bool) -> float:
    """Fused attention: forward (query, key, value, ...), backward (grad, query, ...)."""
    return _attention_flops(*(args[1:4] if backward else args[:3]), backward=backward)


def _recurrent(args: tuple, kwargs: dict, weights: Callable[[tuple], Sequence[torch.Tensor]],
               backward: bool) -> float:  # fmt: skip
    """A recurrent layer's forward, ``2 * weights`` FLOPs a token (the gates' elementwise work
    left out), and its backward, twice that: the input's and the weights' gradients, each a
    matmul of the forward's size (oneDNN computes the input's even where nothing needs it)."""
    forward = 2.0 * _tokens(args[0]) * sum(w.numel() for w in weights(args))
    return 2.0 * forward if backward else forward


def _trilinear(args: tuple, kwargs: dict) -> float:
    """``nn.Bilinear``'s kernel: three tensors, ``expand`` dims inserted, multiplied and
    summed over their broadcast shape: 2 FLOPs per element of it."""
    shapes = [list(tensor.shape) for tensor in args[:3]]
    for shape, expand in zip(shapes, args[3:6]):
        for dim in sorted(expand):
            shape.insert(dim, 1)
    return 2.0 * math.prod(torch.broadcast_shapes(*shapes))


# FLOPs of the ops FlopCounterMode counts 0 for, by op name (addmv, mv, dot, addbmm and
# _addmm_activation have no formula there). One that fails (a nested tensor's shape) is none.
# An op and its ``_backward`` share an estimate, told which pass it prices as the op runs
# (not at import, where mutation testing cannot follow it).
_PASSES = (("", False), ("_backward", True))
_FUSED_ATTENTION = (
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_fused_attention_overrideable",
)
ESTIMATES: dict[str, Estimate] = {
    **{op + suffix: functools.partial(_sdpa, backward=backward)
       for op in _FUSED_ATTENTION for suffix, backward in _PASSES},
    "aten._native_multi_head_attention": _native_mha,
    "aten._transformer_encoder_layer_fwd": _encoder_layer,
    # One layer and direction of nn.LSTM on a CPU (input, w_ih, w_hh); a whole nn.LSTM, GRU or
    # RNN on a GPU (input, every weight)
    **{"aten.mkldnn_rnn_layer" + suffix: functools.partial(
        _recurrent, weights=lambda args: args[1:3], backward=backward)
       for suffix, backward in _PASSES},
    **{op + suffix: functools.partial(
        _recurrent, weights=lambda args: [w for w in args[1] if w.dim() == 2], backward=backward)
       for op in ("aten._cudnn_rnn", "aten.miopen_rnn") for suffix, backward in _PASSES},
    **dict.fromkeys(("aten.addmv", "aten.mv"), lambda args, kwargs: 2.0 * (
        args[1] if args[0].dim() == 1 and args[1].dim() == 2 else args[0]).numel()),
    **dict.fromkeys(("aten.dot", "aten.vdot"), lambda args, kwargs: 2.0 * args[0].numel()),
    **dict.fromkeys(("aten.addbmm", "aten._addmm_activation"),  # (self, (B, n, m), (B, m, p))
                    lambda args, kwargs: 2.0 * args[1].numel() * args[2].shape[-1]),
    "aten._trilinear": _trilinear,
}  # fmt: skip


class OpRecorder(TorchDispatchMode):
    """Notes each aten op run inside it in ``ops`` as ``(name, flops, bytes, seconds, kind, dtype,
    estimated, fill)``: FLOPs as ``counter`` counted them, else estimated; seconds if ``timed``."""

    def __init__(self, counter: FlopCounterMode | None = None, timed: bool = False) -> None:
        super().__init__()
        self.counter, self.timed = counter, timed
        # on a GPU an op returns at its launch: each reading then waits for the GPU first
        gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.clock: Callable[[], float] = host_clock.now if gpu else time.perf_counter
        self.ops: list[tuple[str, float, int, float, str, str, bool, float]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        before = self.counter.get_total_flops() if self.counter is not None else 0
        start = self.clock() if self.timed else 0.0
        out = func(*args, **kwargs)
        seconds = self.clock() - start if self.timed else 0.0
        flops = float(self.counter.get_total_flops() - before) if self.counter is not None else 0.0
        name = str(func.overloadpacket)
        inputs, outputs = tensors_in([args, kwargs]), tensors_in(out)
        blocks: dict[tuple[int, int], int] = {}  # each once: an in-place op's output is its input
        for tensor in () if func.is_view else (*inputs, *outputs):
            try:
                blocks[tensor.data_ptr(), tensor.nbytes] = tensor.nbytes
            except RuntimeError:  # no single storage (sparse: values and indices)
                blocks[id(tensor), 0] = tensor_nbytes(tensor)
        nbytes = sum(blocks.values())
        estimated = False
        if self.counter is not None and flops == 0 and name in ESTIMATES:
            try:
                flops, estimated = float(ESTIMATES[name](args, kwargs)), True
            except (AttributeError, IndexError, RuntimeError, TypeError, ValueError):
                pass  # no estimate: profile() warns
        # its first floating-point tensor's dtype (a matmul under autocast reads bfloat16)
        floating = [t for t in (*inputs, *outputs) if t.is_floating_point() or t.is_complex()]
        chosen = floating or inputs
        dtype = str(chosen[0].dtype).removeprefix("torch.") if chosen else "float32"
        fill = _conv_fill(name, args)
        self.ops.append((name, flops, nbytes, seconds, op_kind(name), dtype, estimated, fill))
        return out


def rows_like(sample: torch.Tensor, rows: int) -> torch.Tensor:
    """``rows`` rows made of the sample's first row, each rotated by its own amount (fresh
    memory, no autograd history; token ids stay ids, a mask keeps its count).

    Why rotated: max-pooling ran twice as fast on one row repeated as on distinct rows (the
    branch predictor learns its comparisons), which made the course CNN's calibrated
    forward a third faster than a learner's random images take."""
    first = sample.detach()[:1].reshape(-1)
    batch = first.new_empty((rows, first.numel()))  # made from the sample: on its device, or lane
    # each row rolled 7919 places (a prime) further than the one before: deterministic
    for row in range(rows):
        batch[row] = first.roll(-row * 7919)
    return batch.reshape(rows, *sample.shape[1:])


def batch_like(inputs: Any, rows: int) -> Any:
    """``inputs`` with every tensor (in tuples, lists, namedtuples, dicts) replaced by
    :func:`rows_like` of it, as DataParallel's scatter cuts them, the rest as it is."""
    if isinstance(inputs, torch.Tensor):
        return rows_like(inputs, rows)
    if isinstance(inputs, (list, tuple)):
        items = [batch_like(item, rows) for item in inputs]
        return type(inputs)(*items) if hasattr(inputs, "_fields") else type(inputs)(items)
    if isinstance(inputs, dict):
        return type(inputs)((key, batch_like(item, rows)) for key, item in inputs.items())
    return inputs


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor in ``output``: in tuples, lists, dicts and dataclasses, nested."""
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        output = [getattr(output, field.name) for field in dataclasses.fields(output)]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in output_tensors(item)]
    return [output] if isinstance(output, torch.Tensor) else []


def gradient_roots(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs a backward starts from. A detached one (metrics, logits beside a loss the
    model computes) is none: no loss reads it, and DataParallel scatters no gradient for it."""
    return [t for t in outputs if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def run_passes(module: nn.Module, inputs: torch.Tensor | tuple | list,
               counter: FlopCounterMode | None, timed: bool,
               kwargs: dict[str, Any] | None = None, amp: torch.dtype | None = None,
               ready: list[int] | None = None, calls: list[int] | None = None,
               ) -> tuple[list[tuple], list[tuple], Any, int]:  # fmt: skip
    """A forward (under autocast to ``amp``) and a backward of ``module`` on ``inputs`` (a
    tensor, or positional inputs) and ``kwargs``, recorded op by op: the forward's ops, the
    backward's, the output and the activations' bytes. The backward is a replica's: from
    the :func:`gradient_roots`, seeded with ones, to the trainable parameters, outside
    autocast as torch recommends. ``ready`` gets, per trainable parameter, how many backward
    ops had run when its gradient was ready; ``calls`` the forward's :func:`python_calls`."""
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    kwargs = kwargs or {}
    given_inputs = tensors_in([args, kwargs])
    params = [p for p in module.parameters() if p.requires_grad]
    given = [*module.parameters(), *module.buffers(), *given_inputs]
    outer = counter if counter is not None else nullcontext()
    device = given_inputs[0].device.type if given_inputs else "cpu"
    autocast = nullcontext if amp is None else functools.partial(torch.autocast, device, dtype=amp)
    if calls is not None:  # a forward of its own: the recorders' own Python would count
        with autocast():
            calls[:] = [python_calls(lambda: module(*args, **kwargs))]
    with outer, OpRecorder(counter, timed) as forward, autocast():
        output = module(*args, **kwargs)
    found = output_tensors(output)
    if not found:
        raise TypeError(
            "the cost model profiles modules that return tensors (in tuples, lists, dicts or "
            f"dataclasses); this one returned {type(output).__name__} holding none"
        )
    activations = replica_graph.walk(found, given).saved_nbytes
    roots = gradient_roots(found)
    seeds = [torch.ones_like(t) for t in roots]
    if ready is not None:
        ready[:] = [-1] * len(params)
    with outer, OpRecorder(counter, timed) as backward:
        hooks = [p.register_hook(lambda _, i=i: ready.__setitem__(i, len(backward.ops)))
                 for i, p in enumerate(params) if ready is not None]  # fmt: skip
        if params and roots:
            torch.autograd.grad(roots, params, seeds, allow_unused=True)
        for hook in hooks:
            hook.remove()
    return forward.ops, backward.ops, output, activations


# What Python asks of torch without work behind it: the tracer's and __torch_function__'s
# checks on every call, and a tensor's shape.
_QUERIES = ("_get_tracing_state", "_has_torch_function", "dim", "size", "is_", "__len__")
# Code that runs *because* of a call, not the model's: a TorchFunctionMode's handler (dpkit's
# placement check follows every torch call with one) calls torch again for each call.
_HANDLERS = ("placement_check.py", "overrides.py", "_python_dispatch.py")


def python_calls(work: Callable[[], Any]) -> int:
    """How many of torch's C functions (not queries of shape or state) ``work()``'s Python
    called: an eager forward's host work, read with ``sys.setprofile``."""
    called: list[str] = []

    def note(frame: Any, event: str, function: Any) -> None:
        if event != "c_call" or frame.f_code.co_filename.endswith(_HANDLERS):
            return
        owner = getattr(function, "__self__", None)
        module = getattr(function, "__module__", None) or type(owner).__module__ or ""
        if module.startswith("torch") or isinstance(owner, torch.Tensor):
            called.append(getattr(function, "__name__", ""))

    previous = sys.getprofile()
    sys.setprofile(note)
    try:
        work()
    finally:
        sys.setprofile(previous)
    return sum(not name.startswith(_QUERIES) for name in called)


def fit_rows(values: Sequence[float]) -> Coefficients:
    """``(a, b, c)`` of ``a + b * rows + c * rows**2`` for ``values`` at :data:`PROFILE_ROWS` and
    :data:`CHECK_ROWS`: the quadratic through the first three if it meets the fourth (exact for
    layers and for batch-squared work, ``x @ x.T``), else the line through the first and last."""
    (r1, r2, r3), (v1, v2, v3, check) = PROFILE_ROWS, values
    slope_low, slope_high = (v2 - v1) / (r2 - r1), (v3 - v2) / (r3 - r2)
    c = (slope_high - slope_low) / (r3 - r1)
    b = slope_low - c * (r1 + r2)
    a = v1 - b * r1 - c * r1 * r1
    if math.isclose(a + b * CHECK_ROWS + c * CHECK_ROWS**2, check, rel_tol=1e-9, abs_tol=1e-6):
        return (a, b, c)
    slope = (check - v1) / (CHECK_ROWS - r1)
    return (v1 - slope * r1, slope, 0.0)


def _fit(runs: Sequence[list[tuple]], calls: int | None = None) -> PassCost:
    """Each op's FLOPs and bytes fitted to rows from ``runs`` of one pass (making ``calls``);
    if the runs ran different ops, the largest run's costs scaled by rows."""
    largest = runs[-1]
    if all([op[0] for op in run] == [op[0] for op in largest] for run in runs):
        fit, columns = fit_rows, list(zip(*runs))
    else:  # the largest run's counts, as if they grew with rows from nothing
        fit, columns = lambda values: (0.0, values[-1] / CHECK_ROWS, 0.0), [[op] for op in largest]
    return PassCost(tuple(
        OpCost(ops[-1][0], fit([op[1] for op in ops]), fit([op[2] for op in ops]), *ops[-1][4:])
        for ops in columns
    ), calls)  # fmt: skip


def _warn_uncounted(cost: PassCost, which: str) -> None:
    """Warns once per compute-heavy op with no FLOP count and no estimate: a matmul or
    convolution, a known heavy kernel, or an op outside aten whose work dpkit cannot know."""
    rows = CHECK_ROWS
    total = cost.nbytes(rows) or 1.0
    shares: dict[str, float] = {}
    for op in cost.ops:
        custom = op.name.split(".", 1)[0] not in ("aten", "prims", "prim")
        heavy = op.kind != "memory" or bool(_HEAVY_UNCOUNTED.search(op.name)) or custom
        if op.flops_at(rows) == 0 and op.bytes_at(rows) > 0 and heavy:
            shares[op.name] = shares.get(op.name, 0.0) + op.bytes_at(rows) / total
    for name, share in shares.items():
        warnings.warn(
            f"dpkit.cost.profile: {name} in the {which} is compute-heavy, but torch's "
            f"FlopCounterMode counts no FLOPs for it and dpkit has no estimate: it is "
            f"predicted by its bytes alone ({share:.1%} of the {which}'s bytes at {rows} "
            "rows), so the predicted compute time is too low",
            stacklevel=3,
        )


# a widget sweeping batch sizes profiles once
_cache: weakref.WeakKeyDictionary[nn.Module, dict[tuple, Profile]] = weakref.WeakKeyDictionary()


def _structure(obj: Any) -> Any:
    """What of the inputs changes the cost: tensors' shapes past the batch dim, dtypes and
    devices, containers' shapes, and other values themselves (their type, if unhashable)."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape[1:]), obj.dtype, obj.device)
    if isinstance(obj, (list, tuple)):
        return (type(obj).__qualname__, tuple(_structure(item) for item in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((key, _structure(item)) for key, item in obj.items()))
    try:
        hash(obj)
    except TypeError:
        return ("value", type(obj).__qualname__)
    return ("value", type(obj).__qualname__, obj)


def profile(module: nn.Module, sample_input: torch.Tensor | tuple | list,
            sample_kwargs: dict[str, Any] | None = None,
            amp: torch.dtype | str | None = None) -> Profile:  # fmt: skip
    """FLOPs, bytes and activations of ``module`` per row of its inputs (cached).

    ``sample_input``: a batch (rows along dim 0), or a tuple of positional inputs;
    ``sample_kwargs``: keyword inputs. As in DataParallel's scatter, every tensor is a batch
    along dim 0 and anything else is passed as it is; their batch size does not matter.
    ``amp`` (``torch.bfloat16``/``"bf16"``, ``torch.float16``/``"fp16"``) runs the forward
    under ``torch.autocast``. A copy of the module runs: BatchNorm's statistics stay."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    args = tuple(sample_input) if isinstance(sample_input, (tuple, list)) else (sample_input,)
    if sample_kwargs is not None and not isinstance(sample_kwargs, dict):
        raise TypeError(f"sample_kwargs must be a dict, got {type(sample_kwargs).__name__}")
    kwargs = dict(sample_kwargs or {})
    tensors = tensors_in([args, kwargs])
    if not tensors or any(t.dim() == 0 for t in tensors):
        raise TypeError(
            "sample_input must be a tensor with a batch dimension (dim 0), e.g. "
            "torch.randn(1, 1, 28, 28), or a tuple of inputs whose tensors all have one "
            "(DataParallel cuts every tensor input along dim 0)"
        )
    amp = AMP_DTYPES.get(amp.lower(), amp) if isinstance(amp, str) else amp
    if amp is not None and amp not in AMP_DTYPES.values():
        raise ValueError(f"amp={amp!r}: autocast runs in torch.bfloat16 ('bf16') or "
                         "torch.float16 ('fp16'); None for no autocast")  # fmt: skip
    # The key holds the parameters' names and shapes: a module changed in place is profiled afresh;
    # train/eval and requires_grad change the ops run (dropout, fast paths, the backward).
    named = module.named_parameters()
    parameters = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in named)
    modes = tuple(m.training for m in module.modules())
    key = (_structure(args), _structure(kwargs), parameters, modes, amp)
    cached = _cache.setdefault(module, {})
    if key in cached:
        return cached[key]
    work = copy.deepcopy(module)  # keeps each submodule's train/eval and requires_grad
    runs, ready, calls = [], [], []
    for rows in (*PROFILE_ROWS, CHECK_ROWS):
        counter = FlopCounterMode(display=False)
        inputs, keywords = batch_like(args, rows), batch_like(kwargs, rows)
        counted = calls if rows == CHECK_ROWS else None
        runs.append(run_passes(work, inputs, counter, False, keywords, amp, ready, counted))
    forward, backward = _fit([run[0] for run in runs], calls[0]), _fit([run[1] for run in runs])
    _warn_uncounted(forward, "forward")
    _warn_uncounted(backward, "backward")
    first, last = output_tensors(runs[0][2]), output_tensors(runs[-1][2])
    roots = [gradient_roots(found) for found in (first, last)]
    out_small, out_large = (sum(map(tensor_nbytes, found)) for found in (first, last))
    grad_small, grad_large = (sum(map(tensor_nbytes, found)) for found in roots)
    per_row = CHECK_ROWS - PROFILE_ROWS[0]
    floating = [t for t in (*module.parameters(), *tensors) if t.is_floating_point()] or tensors
    cached[key] = Profile(
        dtype=floating[0].dtype,  # the parameters', else the inputs'
        forward=forward,
        backward=backward,
        parameter_sizes=tuple(map(tensor_nbytes, module.parameters())),
        buffer_sizes=tuple(map(tensor_nbytes, module.buffers())),
        modules=len(list(module.modules())),
        input_row_bytes=sum(t[:1].nbytes for t in tensors),
        output_row_bytes=round((out_large - out_small) / per_row),
        activations=fit_rows([run[3] for run in runs]),
        gradient_sizes=tuple(tensor_nbytes(p) for p in module.parameters() if p.requires_grad),
        amp=amp,
        output_tensors=len(last),
        gradient_ops=tuple(count - 1 if count > 0 else -1 for count in ready),
        grad_output_row_bytes=round((grad_large - grad_small) / per_row),
        grad_output_tensors=len(roots[-1]),
    )
    return cached[key]
