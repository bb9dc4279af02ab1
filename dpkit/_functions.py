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

They take what the maths needs, as torch's do, with one addition: where a piece comes from
is an argument when a tensor cannot say it (a virtual lane is not a tensor's
``torch.device``, and gradients carry no lane tag). They read line for line against torch's,
in torch's order; a ``# dpkit:`` comment marks what differs. The one addition every Function
shares is for tracing: its class decorator, :func:`_backward_in_step_of_forward`, notes in
the forward the step and the trace scope it runs in, and runs the backward under them
(:func:`dpkit.context.backward_of`), so the trace files the backward's copies as that step's
gradients, in the traces that recorded the forward.

What torch's have and dpkit's drop on purpose:

- the ``AssertionError`` on CPU tensors (``Broadcast``, ``Gather``): lanes may run on the CPU;
- complex tensors viewed as real for the copies and as complex after them: dpkit's copies
  (``clone``, ``to``, ``copy_``, ``+``) keep them as they are;
- ``Scatter``'s background copy streams (``_get_stream``, ``wait_stream``,
  ``record_stream``): dpkit's copies run on the caller's stream (see :mod:`dpkit.comm`).
"""

from __future__ import annotations

import warnings
from itertools import chain

from torch.autograd import Function

from dpkit import comm
from dpkit.context import backward_of, current_scope, current_step
from dpkit.lanes import device_of


def _backward_in_step_of_forward(function: type[Function]) -> type[Function]:
    """dpkit: ``function``'s forward notes the step and the trace scope it runs in (as
    torch's note ``ctx.input_device``), and its backward runs under them, in whatever thread
    autograd runs it (see :mod:`dpkit.context`)."""
    forward, backward = function.forward, function.backward

    def forward_in_step(ctx, *args):
        ctx.step, ctx.scope = current_step(), current_scope()
        return forward(ctx, *args)

    def backward_in_step(ctx, *grad_outputs):
        with backward_of(ctx.step, ctx.scope):
            return backward(ctx, *grad_outputs)

    function.forward = staticmethod(forward_in_step)
    function.backward = staticmethod(backward_in_step)
    return function


@_backward_in_step_of_forward
class Broadcast(Function):
    @staticmethod
    def forward(ctx, target_devices, *inputs):
        # dpkit: Devices the caller resolved (torch: _get_device_index here); no CPU assertion,
        # complex mask or ctx.input_device (see backward)
        ctx.target_devices = target_devices
        if len(inputs) == 0:
            return ()
        ctx.num_inputs = len(inputs)
        outputs = comm.broadcast(inputs, target_devices)  # dpkit: torch's broadcast_coalesced
        non_differentiables = []
        for idx, input_requires_grad in enumerate(ctx.needs_input_grad[1:]):
            if not input_requires_grad:
                non_differentiables.extend(output[idx] for output in outputs)
        ctx.mark_non_differentiable(*non_differentiables)
        return tuple(chain.from_iterable(outputs))

    @staticmethod
    def backward(ctx, *grad_outputs):
        # dpkit: the sum lands on target_devices[0] (torch: ctx.input_device, inputs[0]'s
        # device): the same device, only because comm.broadcast refuses inputs off devices[0]
        grads = ReduceAddCoalesced.apply(ctx.target_devices, ctx.num_inputs, *grad_outputs)
        return (None,) + grads


@_backward_in_step_of_forward
class ReduceAddCoalesced(Function):
    @staticmethod
    def forward(ctx, source_devices, num_inputs, *grads):
        # dpkit: source_devices, not torch's destination: grads arrive in groups of num_inputs,
        # one group per device of source_devices (torch reads each group's device off its
        # grads, which carry no lane); the sum lands on source_devices[0] (torch: destination,
        # by reduce_add_coalesced). No complex mask: complex grads are summed as they are.
        ctx.source_devices = source_devices
        grads_ = [grads[i : i + num_inputs] for i in range(0, len(grads), num_inputs)]
        return tuple(comm.reduce_add(grads_, source_devices[0], source_devices))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None) + Broadcast.apply(ctx.source_devices, *grad_outputs)


@_backward_in_step_of_forward
class Gather(Function):
    @staticmethod
    def forward(ctx, target_device, dim, input_devices, *inputs):
        # dpkit: target_device is a Device the caller resolved (torch: "cpu" kept, else
        # _get_device_index); input_devices[i] holds inputs[i]: the backward scatters each
        # gradient slice back to its own lane, which a gradient's tensor cannot name (torch:
        # ctx.input_gpus, each input's device). No CPU assertion, no complex view.
        ctx.target_device = target_device
        ctx.dim = dim
        ctx.input_devices = input_devices
        if all(t.dim() == 0 for t in inputs) and dim == 0:
            inputs = tuple(t.view(1) for t in inputs)
            warnings.warn(
                "Was asked to gather along dimension 0, but all input tensors were scalars; "
                "will instead unsqueeze and return a vector.",
                # dpkit: 3, the frame torch's 2 names (autograd's apply), past the decorator's
                stacklevel=3,
            )
            ctx.unsqueezed_scalar = True
        else:
            ctx.unsqueezed_scalar = False
        ctx.input_sizes = tuple(i.size(ctx.dim) for i in inputs)
        return comm.gather(inputs, ctx.dim, target_device, input_devices)

    @staticmethod
    def backward(ctx, grad_output):
        # dpkit: the source too, target_device: a gradient cannot say where it is
        scattered_grads = Scatter.apply(
            ctx.input_devices, ctx.input_sizes, ctx.dim, ctx.target_device, grad_output
        )
        if ctx.unsqueezed_scalar:
            scattered_grads = tuple(g[0] for g in scattered_grads)
        return (None, None, None) + scattered_grads  # dpkit: a None for input_devices too


@_backward_in_step_of_forward
class Scatter(Function):
    @staticmethod
    def forward(ctx, target_devices, chunk_sizes, dim, source, input):
        # dpkit: source: where input is, None to read it off the input (a gradient cannot
        # say); ctx.input_device a Device (torch: -1 for the CPU); target_devices kept for
        # backward's Gather (torch's reads the grads' devices). No background copy streams:
        # comm copies on the caller's stream (module docstring). No complex view.
        ctx.target_devices = target_devices
        ctx.dim = dim
        ctx.input_device = device_of(input) if source is None else source
        return comm.scatter(input, target_devices, chunk_sizes, ctx.dim, ctx.input_device)

    @staticmethod
    def backward(ctx, *grad_output):
        gathered = Gather.apply(ctx.input_device, ctx.dim, ctx.target_devices, *grad_output)
        return None, None, None, None, gathered  # dpkit: a None for source too
