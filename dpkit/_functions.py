"""The autograd functions behind the primitives, mirroring ``torch/nn/parallel/_functions.py``.

Each forward is a move between devices; each backward is the mirror move:

=================  ==========================  ==============================
function           forward                     backward
=================  ==========================  ==============================
``Broadcast``      copy tensors to devices     ``ReduceAddCoalesced`` of grads
``ReduceAdd...``   sum tensors onto a device   ``Broadcast`` (double backward)
``Scatter``        split onto devices          ``Gather`` of grads
``Gather``         concatenate onto a device   ``Scatter`` of grads
=================  ==========================  ==============================

Each also takes the trace ``phase`` it records and the ``step`` it belongs to (None: the
current step); a backward records under the step of the forward that created it.
"""

from __future__ import annotations

import warnings
from itertools import chain

from torch.autograd import Function

from dpkit import comm, tracing


def _step(step):
    return tracing.current_step() if step is None else step


class Broadcast(Function):
    @staticmethod
    def forward(ctx, devices, phase, step, *inputs):
        ctx.devices = devices
        ctx.step = _step(step)
        if len(inputs) == 0:
            return ()
        ctx.num_inputs = len(inputs)
        outputs = comm.broadcast(inputs, devices, phase, ctx.step)
        non_differentiables = []
        for index, input_requires_grad in enumerate(ctx.needs_input_grad[3:]):
            if not input_requires_grad:
                non_differentiables.extend(output[index] for output in outputs)
        ctx.mark_non_differentiable(*non_differentiables)
        return tuple(chain.from_iterable(outputs))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = ReduceAddCoalesced.apply(ctx.devices, ctx.num_inputs, ctx.step, *grad_outputs)
        return (None, None, None) + grads


class ReduceAddCoalesced(Function):
    @staticmethod
    def forward(ctx, devices, num_inputs, step, *grads):
        ctx.devices = devices
        ctx.step = step
        per_device = [grads[i : i + num_inputs] for i in range(0, len(grads), num_inputs)]
        return tuple(comm.reduce_add(per_device, devices[0], devices, "reduce", step))

    @staticmethod
    def backward(ctx, *grad_outputs):
        copies = Broadcast.apply(ctx.devices, "grad_broadcast", ctx.step, *grad_outputs)
        return (None, None, None) + copies


class Scatter(Function):
    @staticmethod
    def forward(ctx, devices, chunk_sizes, dim, source, phase, step, input):
        ctx.devices = devices
        ctx.dim = dim
        ctx.source = source
        ctx.step = _step(step)
        return comm.scatter(input, devices, chunk_sizes, dim, source, phase, ctx.step)

    @staticmethod
    def backward(ctx, *grad_output):
        devices = ctx.devices[: len(grad_output)]
        gathered = Gather.apply(ctx.source, ctx.dim, devices, "grad_gather", ctx.step, *grad_output)
        return None, None, None, None, None, None, gathered


_SCALAR_WARNING = (
    "Was asked to gather along dimension 0, but all input tensors were scalars; "
    "will instead unsqueeze and return a vector."
)


class Gather(Function):
    @staticmethod
    def forward(ctx, destination, dim, input_devices, phase, step, *inputs):
        # Gradients carry no lane tag, so the lanes the inputs came from are passed in: the
        # backward scatters each gradient slice back to its own lane.
        ctx.dim = dim
        ctx.destination = destination
        ctx.input_devices = input_devices
        ctx.step = _step(step)
        if all(t.dim() == 0 for t in inputs) and dim == 0:
            inputs = tuple(t.view(1) for t in inputs)
            warnings.warn(_SCALAR_WARNING, stacklevel=2)
            ctx.unsqueezed_scalar = True
        else:
            ctx.unsqueezed_scalar = False
        ctx.input_sizes = tuple(t.size(ctx.dim) for t in inputs)
        return comm.gather(inputs, ctx.dim, destination, input_devices, phase, ctx.step)

    @staticmethod
    def backward(ctx, grad_output):
        scattered = Scatter.apply(
            ctx.input_devices,
            ctx.input_sizes,
            ctx.dim,
            ctx.destination,
            "grad_scatter",
            ctx.step,
            grad_output,
        )
        if ctx.unsqueezed_scalar:
            scattered = tuple(g[0] for g in scattered)
        return (None, None, None, None, None) + tuple(scattered)
