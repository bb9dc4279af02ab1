"""What every rank trains (dpkit.ddp.workload), checked before any rank starts: the named
workloads, the random batch, and the refusal of functions a fresh process cannot import."""

from __future__ import annotations

import functools
import threading

import pytest
import torch

from dpkit.ddp import workload
from dpkit.models import build_model, wide_mlp


def test_the_named_workloads_build_the_course_models():
    wide = workload.named_workload("wide")
    assert (wide.model, wide.name) == (wide_mlp, "wide")
    for name in ("mlp", "cnn", "transformer"):
        named = workload.named_workload(name)
        assert named.name == name and named.model.func is build_model
        assert named.model.args == (name,)
        assert type(named.model()) is type(build_model(name))
    with pytest.raises(
        ValueError, match="model='resnet' is not one of mlp, cnn, transformer, wide"
    ):
        workload.named_workload("resnet")
    assert workload.as_workload("mlp").name == "mlp"
    with pytest.raises(TypeError, match="got int"):
        workload.as_workload(3)


def test_the_random_batch_is_images_and_labels_of_ten_classes():
    torch.manual_seed(0)
    images, labels = workload.random_images(512)
    assert images.shape == (512, 1, 28, 28) and labels.shape == (512,)
    assert labels.dtype == torch.int64 and set(labels.tolist()) == set(range(10))


def module_level_model():
    return torch.nn.Linear(2, 2)


class CallableModel:
    """A picklable callable object: it has a module but, being no function, no __qualname__."""

    def __call__(self):
        return torch.nn.Linear(2, 2)


def test_functions_a_fresh_process_cannot_import_are_refused_naming_the_field():
    fine = workload.Workload(model=functools.partial(build_model, "mlp"), name="fine")
    workload.check_importable(fine)  # a partial of a module-level function is fine
    workload.check_importable(workload.Workload(model=module_level_model))
    workload.check_importable(workload.Workload(model=CallableModel()))

    def local_model():
        return torch.nn.Linear(2, 2)

    main_model = type(module_level_model)(module_level_model.__code__, {"__name__": "__main__"})
    main_model.__module__ = "__main__"
    lock = threading.Lock()
    cases = [
        ("model", dict(model=lambda: None), "is a lambda or a function defined inside another"),
        ("model", dict(model=local_model), "is a lambda or a function defined inside another"),
        ("model", dict(model=main_model), "is defined in __main__ (a notebook"),
        ("data", dict(model=module_level_model, data=functools.partial(print, lock)),
         "cannot be pickled (TypeError"),
        ("step", dict(model=module_level_model, step=lambda *a: None), "is a lambda"),
    ]  # fmt: skip
    for field, fields, problem in cases:
        with pytest.raises(ValueError) as refused:
            workload.check_importable(workload.Workload(**fields))
        message = str(refused.value)
        assert message.startswith(f"workload.{field}=") and problem in message, message
        assert "define it in a .py file, import it, and pass that function" in message
