"""dpkit's autograd functions run their backward under the step and the trace scope of their
forward, in whatever thread autograd runs it (dpkit.context; the class decorator in
dpkit._functions): that is how a trace files a backward's copies as that step's gradients.

The decorator runs as dpkit is imported, so mutmut credits its mutants to whichever test
happened to import dpkit._functions first; a class decorated here makes them this test's.
"""

from __future__ import annotations

import threading

import torch
from torch.autograd import Function

from dpkit import context
from dpkit._functions import _backward_in_step_of_forward


def test_a_backward_runs_in_its_forwards_step_and_scope_in_another_thread():
    seen = []

    @_backward_in_step_of_forward
    class Double(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.factor = 2.0
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append((context.current_step(), context.current_scope(), context.in_backward()))
            return grad * ctx.factor

    x = torch.ones(3, requires_grad=True)
    scope = context.open_scope()  # what an outermost dpkit.trace() opens
    try:
        step = context.begin_step()  # a DataParallel forward begins step 1
        y = Double.apply(x)
        context.begin_step()  # the next forward has begun before this backward runs
    finally:
        context.close_scope(scope)
    # autograd's thread for a GPU records into no trace of its own: the forward's scope
    backward = threading.Thread(target=lambda: y.sum().backward())
    backward.start()
    backward.join(10)
    assert seen == [(step, scope, True)]
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    assert context.current_scope() is context.NO_SCOPE and not context.in_backward()
