"""The placement check's finer rules, each as a user meets it: what the error names, which
moves keep their lanes (as on a GPU), ``param.data = ...``, the exemption for dpkit's own
primitives, and turning the check off (from any thread) giving plain torch back.

Written for the survivors of the mutation audit of ``dpkit/testing/placement_check.py``
(``benchmarks/results/mutation.md``); the broader behaviour is in test_placement_check.py.
"""

from __future__ import annotations

import functools
import re
import threading

import pytest
import torch
from torch import nn

import dpkit
from dpkit import comm
from dpkit.testing import placement_check
from dpkit.testing.placement_check import checking_placement


@pytest.fixture
def lanes():
    with checking_placement():
        yield dpkit.virtual_devices(2, on="cpu")


def _defined_in(module: str, source: str):
    """The function ``source`` defines, as if written in ``module``."""
    namespace = {"__name__": module, "torch": torch, "F": nn.functional}
    exec(source, namespace)
    return namespace["mix"]


def test_the_error_names_the_operation_the_lane_and_the_tensor_left_behind(lanes):
    on_lane, left_on_host = torch.ones(3, 2, device=lanes[0].torch_device), torch.ones(4, 2)
    with pytest.raises(RuntimeError) as error:
        torch.cat([on_lane, left_on_host])
    message = str(error.value)
    assert message.startswith("Expected all tensors to be on the same device")
    assert (
        f"(in cat; dpkit's placement check: data on {lanes[0]} met a tensor of shape (4, 2)"
        " left on the host CPU; move it with .to(lanes[0].torch_device)" in message
    )
    # An operation without a name (a library's partial, dispatched by torch) by its repr.
    add_twice = functools.partial(torch.add, alpha=2)
    with pytest.raises(RuntimeError, match=r"\(in functools\.partial\(<built-in method add"):
        torch.overrides.handle_torch_function(
            add_twice, (on_lane, left_on_host), on_lane, left_on_host
        )


def test_numpy_of_lane_data_names_the_lane(lanes):
    with pytest.raises(TypeError, match=re.escape(f"(it is on {lanes[0]}; dpkit's placement")):
        torch.ones(2, device=lanes[0].torch_device).numpy()


def test_moves_return_what_torch_returns_and_keep_each_lane(lanes):
    host = torch.ones(2)
    assert host.cpu() is host and host.to("cpu") is host  # as torch: nothing to move
    on_lane_1 = dpkit.scatter(torch.ones(4, device=lanes[0].torch_device), lanes)[1]
    # cpu:0 is every checked lane's torch device: data on a lane stays on its own lane
    assert dpkit.device_of(on_lane_1.to(lanes[0].torch_device)) == lanes[1]
    x = torch.ones(2, device=lanes[0].torch_device)
    assert torch.atleast_1d(x, on_lane_1) == (x, on_lane_1)  # the arguments themselves,
    assert dpkit.device_of(on_lane_1) == lanes[1]  # and none is moved to the first's lane


@pytest.mark.parametrize("refusal", [AttributeError, RuntimeError])
def test_a_tensor_type_that_takes_no_attributes_still_computes(lanes, refusal):
    class Refusing(torch.Tensor):
        def __setattr__(self, name, value):
            raise refusal(f"{name}: no new attributes")

    two = torch.tensor(2.0).as_subclass(Refusing)  # a CPU scalar: mixes with lane data
    doubled = torch.ones(2, device=lanes[0].torch_device) * two  # a Refusing, left untagged
    assert type(doubled) is Refusing and doubled.tolist() == [2.0, 2.0]


def test_param_data_assignments_move_a_parameter_as_on_a_gpu(lanes):
    home = lanes[0].torch_device
    weight = nn.Parameter(torch.ones(2))
    weight.data = torch.zeros(2, device=home)
    assert weight.tolist() == [0.0, 0.0] and dpkit.device_of(weight) == lanes[0]
    model = nn.Linear(3, 2).to(home).cpu()  # module.cpu() assigns host data to .data
    assert {dpkit.device_of(p).kind for p in model.parameters()} == {"host"}
    assert model(torch.zeros(4, 3)).shape == (4, 2)  # runs on host data, as on a GPU box


def test_dpkit_primitives_move_data_between_lanes_and_host_on_purpose(lanes):
    # Gradients carry no lane tag (reduce_add is told where each is from): lane 0's is plain
    # CPU data, which reduce_add adds to its copy of lane 1's, made on lane 0.
    (total,) = comm.reduce_add([[torch.ones(3)], [torch.full((3,), 2.0)]], lanes[0], lanes)
    assert total.tolist() == [3.0, 3.0, 3.0] and dpkit.device_of(total) == lanes[0]


@pytest.mark.parametrize(
    ("module", "body", "exempt"),
    [
        ("dpkit.scatter", "F.mse_loss(a, b, reduction='sum')", True),  # through torch's
        ("dpkit.tracing.recorder", "a + b", True),  # Python wrappers, or straight to torch
        ("dpkit.viz", "F.mse_loss(a, b, reduction='sum')", False),  # not a primitive
        ("learner", "a + b", False),
    ],
)
def test_only_dpkit_primitives_and_tracing_may_mix_lane_and_host_data(lanes, module, body, exempt):
    mix = _defined_in(module, f"def mix(a, b):\n    return {body}")
    on_lane, on_host = torch.ones(3, device=lanes[0].torch_device), torch.zeros(3)
    if exempt:
        assert mix(on_lane, on_host).sum().item() == 3.0
    else:
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            mix(on_lane, on_host)


def test_code_run_without_a_module_name_is_checked(lanes):
    # exec(source, {}) as a grader may run a learner's cell: its globals have no __name__
    namespace = {"torch": torch, "home": lanes[0].torch_device}
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        exec("torch.ones(3, device=home) + torch.ones(3)", namespace)


def test_turning_the_check_off_gives_plain_torch_back_in_the_thread_that_turned_it_on():
    assert not torch.overrides.has_torch_function((torch.ones(1),))
    with checking_placement():
        assert torch.overrides.has_torch_function((torch.ones(1),))  # each call followed
    assert not torch.overrides.has_torch_function((torch.ones(1),))  # no longer


def test_turning_the_check_off_from_another_thread_leaves_plain_torch_here():
    """A kernel may turn the check off in a thread other than the one that turned it on;
    that thread's torch calls then go to torch unchanged."""
    placement_check.enable()
    try:
        errors = []
        thread = threading.Thread(target=lambda: _record_errors(placement_check.disable, errors))
        thread.start()
        thread.join()
        assert errors == [] and not placement_check.active()
        summed = torch.ones(2, 3, dtype=torch.float64).sum(dim=0)  # arguments and keywords
        assert summed.dtype == torch.float64 and summed.tolist() == [2.0, 2.0, 2.0]
        mixed = torch.ones(2, device="cpu:0") + torch.ones(2)  # the check is off: no error
        assert dpkit.device_of(mixed).kind == "host"
    finally:
        placement_check.enable()  # and off again here, where this thread's mode ends
        placement_check.disable()
    assert not torch.overrides.has_torch_function((torch.ones(1),))


def _record_errors(call, errors: list[BaseException]) -> None:
    try:
        call()
    except Exception as error:  # reported to the test's thread
        errors.append(error)


def test_a_host_buffer_filled_from_a_lane_stays_on_the_host(lanes):
    # As host_buffer.copy_(cuda_tensor): an in-place op's result is its target, where it was.
    on_lane, host_buffer = torch.arange(3.0, device=lanes[0].torch_device), torch.zeros(3)
    assert host_buffer.copy_(on_lane) is host_buffer
    assert host_buffer.numpy().tolist() == [0.0, 1.0, 2.0]
    assert torch.equal(host_buffer + torch.ones(3), torch.tensor([1.0, 2.0, 3.0]))
    on_lane.add_(1)  # a lane's tensor changed in place stays on its lane
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        on_lane + torch.ones(3)
