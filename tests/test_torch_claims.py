"""What the course says torch does, checked by running torch (on the CPU, where it runs):
an upgrade that changes torch's behaviour fails here, not in front of a learner."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch.nn.parallel.scatter_gather import gather as torch_gather


@dataclass
class Output:
    logits: torch.Tensor
    features: torch.Tensor


@dataclass
class IterableOutput(Output):
    def __iter__(self):
        return iter((self.logits, self.features))


def _two_replicas(kind):
    return [kind(torch.ones(2, 2), torch.ones(2, 2)) for _ in range(2)]


def test_torch_gather_of_a_plain_dataclass_says_it_is_not_iterable():
    """Notebook 04: torch's gather_map zips the outputs, so a plain dataclass fails there."""
    with pytest.raises(TypeError, match="'Output' object is not iterable"):
        torch_gather(_two_replicas(Output), "cpu")


def test_torch_gather_of_strings_returns_the_text_of_a_map_object():
    """docs/bad_input.md, "replicas return strings": no error, a string that is no output."""
    gathered = torch_gather(["cat", "dog"], "cpu")
    assert gathered.startswith("<map object at 0x")


def test_torch_gather_of_an_iterable_dataclass_misses_constructor_arguments():
    """Notebook 04 and pytorch/pytorch#41327: an iterable dataclass (a ModelOutput) is
    rebuilt from one iterable, so its constructor misses the other fields."""
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'features'"):
        torch_gather(_two_replicas(IterableOutput), "cpu")


def test_torch_chunk_gives_every_device_an_empty_chunk_for_an_empty_batch():
    """Exercise 1: chunk_sizes(0, 4) == [] on purpose, where torch gives four empty chunks."""
    assert [len(chunk) for chunk in torch.empty(0).chunk(4)] == [0, 0, 0, 0]


def _torch_message(call) -> str:
    try:
        call()
    except Exception as error:  # the claim is about which error, with which words
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return "no error"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the claim is about a CPU-only machine")
def test_torchs_primitives_fail_on_cpu_tensors_as_the_readme_says():
    from torch import nn
    from torch.nn import parallel

    x, model = torch.randn(4, 3), nn.Linear(3, 2)
    assert _torch_message(lambda: parallel.replicate(model, [0, 1])) == (
        "AssertionError: Broadcast function not implemented for CPU tensors"
    )
    assert _torch_message(lambda: parallel.gather([x, x], "cpu")) == (
        "AssertionError: Gather function not implemented for CPU tensors"
    )
    assert _torch_message(lambda: parallel.scatter(x, [0, 1])) == (
        "AttributeError: module 'torch._C' has no attribute '_scatter'"
    )
    assert _torch_message(lambda: parallel.parallel_apply([model, model], [x, x])) == (
        "RuntimeError: Cannot access accelerator device when none is available."
    )


def test_replica_0_shares_storage_buffers_are_the_modules_parameters_are_views():
    """Notebook 02 and dpkit.replicate's docstring, for dpkit's replicate as for torch's:
    storage is shared; buffers are the same objects; parameters are non-leaf views."""
    from torch import nn

    import dpkit

    module = nn.BatchNorm1d(3)
    replica = dpkit.replicate(module, dpkit.virtual_devices(2, on="cpu"))[0]
    assert replica.running_mean is module.running_mean
    assert replica.weight is not module.weight
    assert replica.weight.data_ptr() == module.weight.data_ptr()
    assert not replica.weight.is_leaf
    assert type(replica.weight.grad_fn).__name__ == "BroadcastBackward"


def test_a_replicas_exception_keeps_its_type_only_when_one_message_rebuilds_it():
    """Notebook 03: torch's ExceptionWrapper (which parallel_apply uses) re-raises with the
    original type when it takes one message string, else as RuntimeError."""
    from torch._utils import ExceptionWrapper

    class TwoArguments(Exception):
        def __init__(self, first, second):
            super().__init__(first, second)

    raised = {}
    for error in (ValueError("bad row"), KeyError("missing"), TwoArguments(1, 2)):
        try:
            raise error
        except Exception:
            wrapper = ExceptionWrapper(where="in replica 1 on device virtual:1")
        try:
            wrapper.reraise()
        except Exception as again:
            raised[type(error).__name__] = type(again).__name__
    assert raised == {
        "ValueError": "ValueError",
        "KeyError": "KeyError",
        "TwoArguments": "RuntimeError",
    }


def test_the_no_argument_autocast_flag_torchs_workers_read_is_cudas():
    """README and parallel_apply's docstring: torch's parallel_apply reads
    ``torch.is_autocast_enabled()``, which inside ``autocast("cpu")`` is False."""
    import inspect

    from torch.nn.parallel import parallel_apply

    assert "torch.is_autocast_enabled()," in inspect.getsource(parallel_apply)
    with torch.autocast("cpu"):
        assert torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled()


def test_torch_coalesces_broadcasts_into_10_mib_buffers():
    """README: torch packs parameters into buffers of 10 MiB before broadcasting them."""
    import inspect

    from torch.nn.parallel import comm

    default = inspect.signature(comm.broadcast_coalesced).parameters["buffer_size"].default
    assert default == 10 * 1024 * 1024


def test_ddp_broadcasts_buffers_at_every_forward_by_default(tmp_path):
    """Notebook 05: DDP does not re-send parameters, but syncs buffers from rank 0 at every
    forward by default (torch 2.13: ``forward_sync_buffers``, which replaces the deprecated
    ``broadcast_buffers``)."""
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        ddp = DistributedDataParallel(nn.BatchNorm1d(3))
        synced = getattr(ddp, "forward_sync_buffers", None)
        if synced is None:  # torch before 2.13 called it broadcast_buffers
            synced = ddp.broadcast_buffers
        assert synced is True
    finally:
        dist.destroy_process_group()


def test_torchs_gather_hands_replica_outputs_to_the_c_gather_not_to_torch_cat():
    """Notebook 08 §8: torch's ``Gather.forward`` calls ``comm.gather``, which calls
    ``torch._C._gather``; that C++ function (torch/csrc/cuda/comm.cpp, ``gather``) checks every
    shape before copying, so outputs of different lengths fail with "Input tensor at index 1
    has invalid shape", never inside ``torch.cat``. The C++ check needs CUDA tensors: see
    ``test_torchs_gather_names_the_output_of_another_shape`` for the run on a GPU."""
    import inspect

    from torch.nn.parallel import _functions, comm

    forward = inspect.getsource(_functions.Gather.forward)
    assert "comm.gather(inputs, ctx.dim, ctx.target_device)" in forward
    assert "torch.cat" not in forward
    assert "torch._C._gather(tensors, dim, destination)" in inspect.getsource(comm.gather)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch._C._gather needs CUDA tensors")
def test_torchs_gather_names_the_output_of_another_shape():
    from torch.nn.parallel import comm

    longer, shorter = torch.zeros(2, 5, 3, device="cuda"), torch.zeros(2, 4, 3, device="cuda")
    with pytest.raises(RuntimeError, match=r"Input tensor at index 1 has invalid shape"):
        comm.gather([longer, shorter], dim=0, destination=0)


def test_torchs_parallel_apply_workers_run_cudas_default_autocast_dtype():
    """Notebook 08 §13: torch's worker enters ``torch.amp.autocast(device_type,
    enabled=autocast_enabled)`` with no dtype, and the autocast dtype is per thread, so a
    worker computes in CUDA's default float16 even under ``dtype=torch.bfloat16``; the CPU's
    autocast is not carried (the flag read is CUDA's, see the test above). parallel_apply
    itself needs an accelerator, so its worker's autocast call is read from its source and
    then run as the worker runs it, in a new thread."""
    import ast
    import inspect
    import textwrap
    import threading
    import warnings

    from torch.nn.parallel import parallel_apply

    tree = ast.parse(textwrap.dedent(inspect.getsource(parallel_apply)))
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.amp.autocast"
    ]
    assert ast.unparse(call) == "torch.amp.autocast(device_type, enabled=autocast_enabled)"

    seen = {}

    def worker():
        with warnings.catch_warnings():  # a CPU-only torch turns CUDA's autocast off, saying so
            warnings.simplefilter("ignore")
            seen["cuda dtype"] = torch.amp.autocast("cuda", enabled=True).fast_dtype
        seen["cpu autocast on"] = torch.is_autocast_enabled("cpu")

    previous = torch.get_autocast_dtype("cuda")
    torch.set_autocast_dtype("cuda", torch.bfloat16)  # what autocast("cuda", dtype=...) sets
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            thread = threading.Thread(target=worker)
            thread.start()
            thread.join()
    finally:
        torch.set_autocast_dtype("cuda", previous)
    assert seen == {"cuda dtype": torch.float16, "cpu autocast on": False}


def test_torchs_data_parallel_with_a_keyword_tensor_of_another_batch_size_fails_its_assertion(
    monkeypatch,
):
    """docs/bad_input.md: a keyword tensor of 6 rows against a batch of 8 on 4 devices.
    torch chunks each tensor by itself (torch/csrc/cuda/comm.cpp's ``scatter`` calls
    ``tensor.chunk(devices)``): 4 chunks of the batch, 3 of the keyword tensor.
    ``scatter_kwargs`` pads the keywords only when they are fewer than the *positional
    arguments* (1 here), so parallel_apply gets 4 modules and 3 keyword dicts. Its CUDA
    scatter is replaced by that chunking; scatter_kwargs and parallel_apply are torch's."""
    from torch import nn
    from torch.nn.parallel import parallel_apply, scatter_gather

    class ChunkOnly:
        @staticmethod
        def apply(target_gpus, chunk_sizes, dim, tensor):
            return tensor.chunk(len(target_gpus), dim)

    monkeypatch.setattr(scatter_gather, "Scatter", ChunkOnly)
    inputs, kwargs = scatter_gather.scatter_kwargs(
        (torch.randn(8, 3),), {"scale": torch.randn(6, 1)}, [0, 1, 2, 3]
    )
    assert (len(inputs), len(kwargs)) == (4, 3)
    replicas = [nn.Identity()] * len(inputs)  # DataParallel replicates onto len(inputs) devices
    assert _torch_message(lambda: parallel_apply(replicas, inputs, kwargs)) == (
        "AssertionError: The number of modules 4 is not equal to the number of kwargs_tup 3"
    )
