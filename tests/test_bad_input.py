"""Bad inputs get a clear error that names the argument and says how to fix it; nothing hangs.

Each test matches the argument's name and part of the fix text, so a bare or misleading
message fails the test. The exact texts users see are pinned once, from the table in
docs/bad_input.md, by test_bad_input_table.py.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit

# --------------------------------------------------------------------------------------
# device counts


@pytest.mark.parametrize(
    "make", [dpkit.devices, dpkit.virtual_devices], ids=["devices", "virtual_devices"]
)
@pytest.mark.parametrize("count", [0, -1, -8])
def test_zero_or_negative_device_count(make, count):
    with pytest.raises(ValueError, match=rf"n must be at least 1, got {count}") as error:
        make(count)
    assert error.match(r"pass e\.g\. n=4")


@pytest.mark.parametrize(
    "make", [dpkit.devices, dpkit.virtual_devices], ids=["devices", "virtual_devices"]
)
@pytest.mark.parametrize("count", [2.0, "4", True, [4]])
def test_non_int_device_count(make, count):
    with pytest.raises(TypeError, match=r"n must be a positive int \(a device count\)"):
        make(count)


# --------------------------------------------------------------------------------------
# device lists


def test_duplicate_devices_in_device_ids():
    devices = lanes(3)
    with pytest.raises(
        ValueError, match=r"device_ids lists virtual:1 \(cpu\) more than once"
    ) as error:
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=[devices[0], devices[1], devices[1]])
    assert error.match(r"each replica needs its own device")


def test_duplicate_ints_in_device_ids():
    with pytest.raises(ValueError, match=r"device_ids lists .* more than once.*own device"):
        dpkit.data_parallel(nn.Linear(2, 2), torch.randn(4, 2), device_ids=[0, 1, 1])


def test_duplicate_devices_given_to_scatter_and_replicate():
    devices = lanes(2)
    with pytest.raises(ValueError, match=r"target_gpus lists .* more than once.*own device"):
        dpkit.scatter(torch.randn(4, 2), [devices[0], devices[0]])
    with pytest.raises(ValueError, match=r"devices lists .* more than once.*own device"):
        dpkit.replicate(nn.Linear(2, 2), [devices[1], devices[1]])


def test_single_device_instead_of_a_list():
    device = lanes(1)[0]
    with pytest.raises(TypeError, match=r"device_ids must be a list of devices") as error:
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=device)
    assert error.match(r"wrap it in a list")
    with pytest.raises(
        TypeError, match=r"target_gpus must be a list of devices.*wrap it in a list"
    ):
        dpkit.scatter(torch.randn(4, 2), device)
    with pytest.raises(TypeError, match=r"devices must be a list of devices.*wrap it in a list"):
        dpkit.replicate(nn.Linear(2, 2), device)


def test_none_device_list():
    with pytest.raises(
        ValueError, match=r"target_gpus is None; pass e\.g\. target_gpus=dpkit\.devices"
    ):
        dpkit.scatter(torch.randn(4, 2), None)
    with pytest.raises(ValueError, match=r"devices is None; pass e\.g\. devices=dpkit\.devices"):
        dpkit.replicate(nn.Linear(2, 2), None)
    with pytest.raises(ValueError, match=r"target_gpus is None.*dpkit\.devices"):
        dpkit.scatter_kwargs((torch.randn(4, 2),), None, None)


def test_empty_device_list():
    with pytest.raises(ValueError, match=r"device_ids is empty; pass at least one device"):
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=[])


def test_device_of_an_unknown_type():
    with pytest.raises(TypeError, match=r"target_gpus must be a dpkit\.Device, an int, a string"):
        dpkit.scatter(torch.randn(4, 2), [1.5, 2.5])


def test_negative_device_index_is_not_a_lane():
    # -1 is torch's old spelling of "the CPU", never a lane called virtual:-1.
    with pytest.raises(ValueError, match=r"device_ids"):
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=[-1, 0])


def test_host_cpu_cannot_run_a_replica():
    with pytest.raises(
        ValueError, match=r"device_ids contains the host CPU.*virtual_devices\(n, on='cpu'\)"
    ):
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=["cpu"])


# --------------------------------------------------------------------------------------
# parallel_apply lengths


def _identity_modules(n):
    return [nn.Identity() for _ in range(n)]


def test_parallel_apply_with_more_inputs_than_modules():
    with pytest.raises(
        ValueError, match=r"2 modules but 3 inputs; pass one entry of inputs per replica"
    ):
        dpkit.parallel_apply(_identity_modules(2), [torch.ones(1)] * 3, devices=lanes(2))


def test_parallel_apply_with_fewer_kwargs_than_modules():
    with pytest.raises(
        ValueError, match=r"3 modules but 1 kwargs_tup; pass one entry of kwargs_tup"
    ):
        dpkit.parallel_apply(
            _identity_modules(3), [torch.ones(1)] * 3, kwargs_tup=({},), devices=lanes(3)
        )


def test_parallel_apply_with_more_devices_than_modules():
    with pytest.raises(ValueError, match=r"2 modules but 4 devices; pass one entry of devices"):
        dpkit.parallel_apply(_identity_modules(2), [torch.ones(1)] * 2, devices=lanes(4))


def test_parallel_apply_without_devices_or_tensor_inputs():
    with pytest.raises(ValueError, match=r"no device was given.*pass devices=\[\.\.\.\]"):
        dpkit.parallel_apply(_identity_modules(2), [("a",), ("b",)])


# --------------------------------------------------------------------------------------
# the module is not where device_ids[0] is


def _model_on_home_lane_with_ids_starting_at_lane_one():
    model = nn.Linear(3, 2)  # plain CPU memory: the home lane, lane 0
    return model, lanes(3)[1:]


def test_module_not_on_device_ids_zero_names_device_ids_zero():
    model, device_ids = _model_on_home_lane_with_ids_starting_at_lane_one()
    dp = dpkit.DataParallel(model, device_ids=device_ids)
    with pytest.raises(RuntimeError, match=r"device_ids\[0\]") as error:
        dp(torch.randn(4, 3))
    assert error.match(r"virtual:1")  # the device it should have been on
    assert error.match(r"move it|use|pass")  # and some fix


def test_data_parallel_function_checks_device_ids_zero_too():
    model, device_ids = _model_on_home_lane_with_ids_starting_at_lane_one()
    with pytest.raises(RuntimeError, match=r"device_ids\[0\]"):
        dpkit.data_parallel(model, torch.randn(4, 3), device_ids=device_ids)


def test_a_module_off_device_ids_zero_begins_no_trace_step_in_either_entry_point():
    # DataParallel.forward and data_parallel share one pipeline: the check comes first.
    model, device_ids = _model_on_home_lane_with_ids_starting_at_lane_one()
    calls = [
        lambda: dpkit.DataParallel(model, device_ids=device_ids)(torch.randn(4, 3)),
        lambda: dpkit.data_parallel(model, torch.randn(4, 3), device_ids=device_ids),
    ]
    with dpkit.trace() as recorded:
        for call in calls:
            with pytest.raises(RuntimeError, match=r"device_ids\[0\]"):
                call()
        dpkit.DataParallel(model, device_ids=lanes(2))(torch.randn(4, 3))
    assert {e.step for e in recorded.events} == {1}, "a failed call took a step number"


def test_module_not_on_device_ids_zero_fix_is_not_a_no_op():
    # The message's suggested fix must change something: telling a learner whose model is
    # already in CPU memory to call module.to('cpu') leaves them exactly where they were.
    model, device_ids = _model_on_home_lane_with_ids_starting_at_lane_one()
    dp = dpkit.DataParallel(model, device_ids=device_ids)
    with pytest.raises(RuntimeError, match=r"device_ids\[0\]") as error:
        dp(torch.randn(4, 3))
    suggestion = re.search(r"\.to\((['\"])(.*?)\1\)", str(error.value))
    if suggestion is not None:
        model.to(suggestion.group(2))
        dp(torch.randn(4, 3))  # following the advice must work
    else:  # no .to(...) advice: it must say what to put first instead
        assert error.match(r"virtual:0|lane 0")


# --------------------------------------------------------------------------------------
# dims and batches


@pytest.mark.parametrize("dim", [2, -3, 5])
def test_scatter_along_a_dim_the_tensor_does_not_have(dim):
    with pytest.raises(ValueError, match=rf"dim={dim} is out of range") as error:
        dpkit.scatter(torch.randn(4, 3), lanes(2), dim=dim)
    assert error.match(r"use a dim between -2 and 1")


@pytest.mark.parametrize("dim", [2, -3])
def test_gather_along_a_dim_the_outputs_do_not_have(dim):
    outputs = [torch.randn(2, 3), torch.randn(2, 3)]
    with pytest.raises(ValueError, match=rf"dim={dim} is out of range") as error:
        dpkit.gather(outputs, lanes(2)[0], dim=dim)
    assert error.match(r"use a dim between -2 and 1")


def test_data_parallel_with_a_dim_the_input_does_not_have():
    dp = dpkit.DataParallel(nn.Linear(3, 2), device_ids=lanes(2), dim=3)
    with pytest.raises(ValueError, match=r"dim=3 is out of range.*use a dim between"):
        dp(torch.randn(4, 3))


def test_gather_of_scalars_along_another_dim():
    with pytest.raises(ValueError, match=r"scalars.*only along dim=0"):
        dpkit.gather([torch.tensor(1.0), torch.tensor(2.0)], lanes(2)[0], dim=1)


def test_scatter_of_a_scalar_tensor():
    with pytest.raises(ValueError, match=r"0-dim tensor.*Python number"):
        dpkit.scatter(torch.tensor(3.0), lanes(2))


def test_gather_of_outputs_with_different_shapes():
    outputs = [torch.randn(2, 3), torch.randn(2, 4)]
    with pytest.raises(ValueError, match=r"may differ only along dim=0"):
        dpkit.gather(outputs, lanes(2)[0])


def test_gather_of_no_outputs():
    with pytest.raises(ValueError, match=r"outputs is empty; pass one output per replica"):
        dpkit.gather([], lanes(2)[0])


def test_empty_batch_to_scatter():
    with pytest.raises(ValueError, match=r"empty along dim=0") as error:
        dpkit.scatter(torch.empty(0, 3), lanes(2))
    assert error.match(r"pass a batch with at least one sample")


def test_empty_batch_to_data_parallel():
    dp = dpkit.DataParallel(nn.Linear(3, 2), device_ids=lanes(2))
    with pytest.raises(ValueError, match=r"empty along dim=0.*at least one sample"):
        dp(torch.empty(0, 3))


# --------------------------------------------------------------------------------------
# modules


@pytest.mark.parametrize(
    "not_a_module", [lambda x: x, torch.relu, "linear", nn.Linear(2, 2).weight]
)
def test_non_module_to_replicate(not_a_module):
    with pytest.raises(TypeError, match=r"module must be a torch\.nn\.Module") as error:
        dpkit.replicate(not_a_module, lanes(2))
    assert error.match(r"wrap it in an nn\.Module")


@pytest.mark.parametrize("not_a_module", [lambda x: x, torch.relu])
def test_non_module_to_data_parallel(not_a_module):
    with pytest.raises(
        TypeError, match=r"module must be a torch\.nn\.Module.*wrap .* in an nn\.Module"
    ):
        dpkit.DataParallel(not_a_module, device_ids=lanes(2))
    with pytest.raises(
        TypeError, match=r"module must be a torch\.nn\.Module.*wrap .* in an nn\.Module"
    ):
        dpkit.data_parallel(not_a_module, torch.randn(4, 2), device_ids=lanes(2))


def test_lazy_parameters_to_replicate():
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU())
    with pytest.raises(ValueError, match=r"uninitialised \(lazy\) parameter '0\.weight'") as error:
        dpkit.replicate(model, lanes(2))
    assert error.match(r"run one forward on a single device first")


def test_lazy_module_works_after_one_forward():
    model = nn.LazyLinear(4)
    model(torch.randn(1, 3))
    replicas = dpkit.replicate(model, lanes(2))
    assert replicas[1].weight.shape == (4, 3)


# --------------------------------------------------------------------------------------
# chunk planning


def test_weights_of_the_wrong_length():
    with pytest.raises(ValueError, match=r"weights has 3 entries for 4 devices"):
        dpkit.weighted_chunk_sizes(10, 4, weights=[1, 1, 1])


@pytest.mark.parametrize("weights", [[1, 0], [1, -2]])
def test_weights_that_are_not_positive(weights):
    with pytest.raises(ValueError, match=r"weights must all be positive"):
        dpkit.weighted_chunk_sizes(10, 2, weights=weights)


# --------------------------------------------------------------------------------------
# issue 18: errors that were unclear, misleading or missing


@pytest.mark.parametrize("output_device", [99, 4])
def test_output_device_that_is_not_one_of_the_lanes(output_device):
    # A virtual lane of any index can be named: 99 made a lane nobody listed.
    with pytest.raises(
        ValueError, match=rf"output_device={output_device} .*not one of device_ids"
    ) as error:
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(4), output_device=output_device)
    assert error.match(r"an index among 0, 1, 2, 3\), or -1 for the host")
    with pytest.raises(ValueError, match=r"not one of device_ids"):
        dpkit.data_parallel(
            nn.Linear(2, 2), torch.randn(4, 2), device_ids=lanes(4), output_device=output_device
        )


def test_a_buffer_left_on_another_lane_is_told_a_fix_that_works():
    # module.to('cpu') copies nothing between lanes of one memory: the advice must not be it.
    devices = lanes(4)
    model = nn.Linear(2, 2)
    model.register_buffer("shift", dpkit.scatter(torch.randn(8, 2), devices)[1])  # lane 1's
    parallel = dpkit.DataParallel(model, device_ids=devices)
    with pytest.raises(RuntimeError, match=r"found one of them on device: virtual:1") as error:
        parallel(torch.randn(8, 2))
    # the whole text is docs/bad_input.md's row (tests/test_bad_input_table.py)
    message = str(error.value)
    assert "on device virtual:0 (cpu) (device_ids[0])" in message
    assert "'shift' is a copy dpkit made for virtual:1 (cpu)" in message
    assert "module.to() does not move a tensor between lanes" in message
    assert "module.shift = module.shift.detach().clone()" in message
    model.shift = model.shift.detach().clone()  # the fix the message gives
    assert parallel(torch.randn(8, 2)).shape == (8, 2)


@pytest.mark.parametrize(
    "call",
    [
        lambda: dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(2), dim="0"),
        lambda: dpkit.data_parallel(nn.Linear(2, 2), torch.randn(4, 2), lanes(2), dim="0"),
        lambda: dpkit.scatter(torch.randn(4, 2), lanes(2), dim="0"),
        lambda: dpkit.scatter_kwargs((torch.randn(4, 2),), None, lanes(2), dim=0.0),
        lambda: dpkit.gather([torch.ones(2), torch.ones(2)], lanes(2)[0], dim="0"),
    ],
    ids=["DataParallel", "data_parallel", "scatter", "scatter_kwargs", "gather"],
)
def test_dim_that_is_not_an_int(call):
    with pytest.raises(TypeError, match=r"dim must be an int .*pass e\.g\. dim=0"):
        call()


@pytest.mark.parametrize("on", ["nosuch", 3.5])
def test_virtual_devices_on_something_that_is_not_a_device(on):
    with pytest.raises(ValueError) as error:
        dpkit.virtual_devices(2, on=on)
    # the whole text is docs/bad_input.md's row (tests/test_bad_input_table.py)
    message = str(error.value)
    assert message.startswith(f"on={on!r} is not a device; ")
    assert "use on='cpu'" in message and "on='cuda'" in message and "leave it out" in message


@pytest.mark.parametrize(
    "argument, value, error_type, fix",
    [
        ("inputs", None, ValueError, r"inputs is None; pass one input per replica"),
        ("inputs", "generator", TypeError, r"inputs must be a list or tuple, got a generator"),
        ("modules", "generator", TypeError, r"modules must be a list or tuple.*replicate"),
        ("modules", None, ValueError, r"modules is None; pass the replicas"),
        ("kwargs_tup", "generator", TypeError, r"kwargs_tup must be a list or tuple"),
    ],
)
def test_parallel_apply_with_none_or_a_generator(argument, value, error_type, fix):
    arguments = {
        "modules": [nn.Identity(), nn.Identity()],
        "inputs": [torch.ones(1), torch.ones(1)],
        "kwargs_tup": [{}, {}],
    }
    arguments[argument] = (x for x in arguments[argument]) if value == "generator" else value
    with pytest.raises(error_type, match=fix):
        dpkit.parallel_apply(**arguments, devices=lanes(2))


def _nested():
    with warnings.catch_warnings():  # nested tensors warn that they are a prototype
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(3, 3)])


@pytest.mark.parametrize(
    "make, fix",
    [
        (
            lambda: torch.randn(8, 3).to_sparse(),
            r"sparse tensor \(layout torch\.sparse_coo\).*to_dense",
        ),
        (lambda: torch.randn(8, 3).to_sparse_csr(), r"sparse tensor \(layout torch\.sparse_csr\)"),
        (_nested, r"nested tensor.*to_padded_tensor"),
    ],
    ids=["coo", "csr", "nested"],
)
def test_sparse_and_nested_inputs(make, fix):
    with warnings.catch_warnings():  # CSR tensors warn that their support is in beta
        warnings.simplefilter("ignore")
        x = make()
    with pytest.raises(TypeError, match=fix):
        dpkit.scatter(x, lanes(2))
    with pytest.raises(TypeError, match=fix):
        dpkit.DataParallel(nn.Identity(), device_ids=lanes(2))(x)


class OptimizedModule(nn.Module):
    """Stands in for what torch.compile returns (torch._dynamo.eval_frame.OptimizedModule:
    the compiled module under ``_orig_mod``), whose import takes seconds; dpkit recognises it
    by these two traits. The real one was checked by hand (issue 18)."""

    def __init__(self, module):
        super().__init__()
        self._orig_mod = module

    def forward(self, x):
        return self._orig_mod(x)


def test_a_compiled_module_is_told_to_pass_the_plain_one():
    compiled = OptimizedModule(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"module was compiled with torch\.compile") as error:
        dpkit.DataParallel(compiled, device_ids=lanes(2))
    assert error.match(r"pass the plain module \(model\._orig_mod")
    with pytest.raises(TypeError, match=r"a submodule of module was compiled"):
        dpkit.replicate(nn.Sequential(compiled), lanes(2))
    output = dpkit.DataParallel(compiled._orig_mod, device_ids=lanes(2))(torch.randn(4, 2))
    assert output.shape == (4, 2)


@pytest.mark.parametrize(
    "chunk_sizes, fix",
    [
        (lambda batch, n: None, r"the chunk_sizes function returned None, not a list of sizes"),
        (lambda batch, n: [True] * batch, r"must be positive ints"),
        ([True] * 8, r"must be positive ints"),
        (lambda batch, n: 8, r"returned 8, not a list"),
    ],
    ids=["returns-None", "returns-bools", "bools", "returns-int"],
)
def test_chunk_sizes_that_are_not_a_list_of_ints(chunk_sizes, fix):
    with pytest.raises((TypeError, ValueError), match=fix) as error:
        dpkit.plan_chunks(8, 8, chunk_sizes)
    assert error.match(r"add up to the batch size 8")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_weights_that_are_not_finite(bad):
    with pytest.raises(ValueError, match=r"weights must all be positive and finite.*weights=\["):
        dpkit.weighted_chunk_sizes(8, 2, weights=[1, bad])


def test_weights_that_are_not_numbers():
    with pytest.raises(TypeError, match=r"weights must be numbers"):
        dpkit.weighted_chunk_sizes(8, 2, weights=[1, "2"])


@pytest.mark.parametrize(
    "plan", [dpkit.balanced_chunk_sizes, dpkit.torch_chunk_sizes, dpkit.plan_chunks]
)
@pytest.mark.parametrize("num_devices", [0, -1])
def test_chunk_planning_over_no_devices(plan, num_devices):
    # balanced_chunk_sizes(8, 0) was a ZeroDivisionError, plan_chunks(8, -1) returned [].
    with pytest.raises(ValueError, match=rf"num_devices must be at least 1, got {num_devices}"):
        plan(8, num_devices)


def test_chunk_planning_of_a_negative_batch():
    with pytest.raises(ValueError, match=r"size must be a number of rows \(an int >= 0\)"):
        dpkit.plan_chunks(-1, 4)
