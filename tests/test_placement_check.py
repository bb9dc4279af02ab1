"""The placement check: on CPU lanes, code that forgets to put its model or data on the devices
fails as it would on a GPU, and code that does put them there runs as it does on a GPU."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import dpkit
import dpkit.device as devices_module
from dpkit.testing import placement_check
from dpkit.testing.placement_check import checking_placement, write_kernel_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def checked_lanes():
    with checking_placement():
        yield dpkit.virtual_devices(4, on="cpu")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


def test_a_model_left_on_the_cpu_runs_on_ordinary_lanes_but_fails_under_the_check():
    dpkit.DataParallel(_mlp(), device_ids=dpkit.virtual_devices(4, on="cpu"))(torch.randn(8, 5))
    with checking_placement():
        lanes = dpkit.virtual_devices(4, on="cpu")
        with pytest.raises(RuntimeError, match=r"on device virtual:0 \(cpu\) \(device_ids\[0\]\)"):
            dpkit.DataParallel(_mlp(), device_ids=lanes)(torch.randn(8, 5))
        with pytest.raises(RuntimeError, match=r"module\.to\('cpu:0'\)"):
            dpkit.DataParallel(_mlp(), device_ids=lanes)(torch.randn(8, 5))
        with pytest.raises(ValueError, match="broadcast source must be on devices"):
            dpkit.replicate(_mlp(), lanes)


def test_to_home_places_model_and_batch_and_training_matches_one_device(checked_lanes):
    home = checked_lanes[0].torch_device
    assert home == torch.device("cpu", 0)
    model = _mlp().to(home)
    plain = copy.deepcopy(model)  # on device 0 too, as a deepcopy of a cuda:0 model is
    assert {dpkit.device_of(p) for p in (*model.parameters(), *plain.parameters())} == {
        checked_lanes[0]
    }
    parallel = dpkit.DataParallel(model, device_ids=checked_lanes)
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.1) for m in (model, plain)]
    for _ in range(3):
        inputs = torch.randn(10, 5, device=home)
        targets = torch.randint(0, 3, (10,)).to(home)
        for net, optimizer in zip((parallel, plain), optimizers):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(inputs), targets).backward()
            optimizer.step()
    for a, b in zip(model.parameters(), plain.parameters()):
        assert dpkit.device_of(a) == checked_lanes[0]  # zero_grad and step keep them there
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_scatter_copies_the_same_bytes_as_on_ordinary_lanes_once_data_is_home(checked_lanes):
    moved = []
    handle = dpkit.add_transfer_listener(lambda t: moved.append(t.nbytes))
    try:
        dpkit.scatter(torch.randn(8, 2, device=checked_lanes[0].torch_device), checked_lanes)
        home_copy = sum(moved)
        moved.clear()
        dpkit.scatter(torch.randn(8, 2), checked_lanes)  # left on the host: chunk 0 copied too
        host_copy = sum(moved)
    finally:
        handle.remove()
    assert home_copy == 3 * 2 * 2 * 4  # lanes 1..3, as on ordinary lanes and on a GPU
    assert host_copy == 4 * 2 * 2 * 4  # as a CPU batch scattered onto cuda:0 ... cuda:3


def test_a_target_left_on_the_host_fails_as_on_a_gpu_and_cpu_scalars_mix(checked_lanes):
    home = checked_lanes[0].torch_device
    model = _mlp().to(home)
    logits = dpkit.DataParallel(model, device_ids=checked_lanes)(torch.randn(6, 5, device=home))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        nn.functional.cross_entropy(logits, torch.randint(0, 3, (6,)))
    scaled = logits * torch.tensor(2.0)  # a 0-dim CPU tensor mixes with a GPU's, so here too
    assert dpkit.device_of(scaled) == checked_lanes[0]


@pytest.mark.parametrize("join", [torch.cat, torch.stack])
def test_tensors_inside_a_list_argument_are_checked_and_followed(checked_lanes, join):
    home = checked_lanes[0].torch_device
    on_lane, left_on_host = torch.ones(3, 2, device=home), torch.ones(3, 2)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        join([on_lane, left_on_host])  # a forgotten .to(): fails as on a GPU
    joined = join([on_lane, torch.zeros(3, 2, device=home)])
    assert dpkit.device_of(joined) == checked_lanes[0]  # not mistaken for host data


def test_cpu_brings_data_back_and_numpy_of_lane_data_says_how(checked_lanes):
    on_lane = torch.ones(3, device=checked_lanes[0].torch_device)
    with pytest.raises(TypeError, match=r"Use Tensor\.cpu\(\)"):
        on_lane.numpy()
    for back in (on_lane.cpu(), on_lane.to("cpu")):
        assert dpkit.device_of(back).name == "cpu"
        assert back.numpy().tolist() == [1.0, 1.0, 1.0]
    assert dpkit.device_of(on_lane) == checked_lanes[0]  # the original stays on the lane


def test_parameters_made_from_lane_data_and_state_dicts_stay_on_the_lane(checked_lanes):
    home = checked_lanes[0].torch_device
    weight = nn.Parameter(torch.randn(3, 2, device=home))
    assert dpkit.device_of(weight) == checked_lanes[0]
    model = _mlp().to(home)
    model.load_state_dict(_mlp().state_dict())  # values from the host, copied in place
    assert {dpkit.device_of(p) for p in model.parameters()} == {checked_lanes[0]}


def test_the_explorers_fail_under_the_check_when_placement_is_forgotten(monkeypatch):
    from dpkit import viz

    viz.apply_trace(devices=2, batch=16, steps=1)  # placed: runs under the check
    monkeypatch.setattr(dpkit, "to_device", lambda obj, device: obj)  # "forget" to place
    viz.apply_trace(devices=2, batch=16, steps=1)  # ordinary CPU lanes do not notice
    with checking_placement(), pytest.raises(RuntimeError, match=r"device_ids\[0\]"):
        viz.apply_trace(devices=2, batch=16, steps=1)


def _notebook_cells(name: str, upto: int) -> list[str]:
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    cells = [c.source for c in notebook.cells[: upto + 1] if c.cell_type == "code"]
    return ["\n".join(x for x in s.splitlines() if not x.startswith("%")) for s in cells]


def test_a_notebook_cell_without_to_home_fails_under_the_check():
    cells = _notebook_cells("04_gather.ipynb", upto=3)
    model_cell = cells[-1]
    assert "nn.Linear(8, 2).to(home)" in model_cell
    with checking_placement():
        namespace = {"__name__": "__notebook__"}
        for source in cells:  # as stored: runs
            exec(source, namespace)
        forgotten = [*cells[:-1], model_cell.replace(".to(home)", "")]
        namespace = {"__name__": "__notebook__"}
        with pytest.raises(RuntimeError, match=r"device_ids\[0\]"):
            for source in forgotten:
                exec(source, namespace)


def test_import_dpkit_never_turns_the_check_on_the_cli_and_kernels_read_the_switch(
    tmp_path, monkeypatch
):
    """Test tooling stays out of the runtime (issue 32): DPKIT_CHECK_PLACEMENT=1 does nothing
    at ``import dpkit``; the dpkit command reads it, and so does a Jupyter kernel whose
    IPython directory has write_kernel_config's config (``python -m dpkit.placement_check``)."""
    env = {**os.environ, "DPKIT_CHECK_PLACEMENT": "1", "IPYTHONDIR": str(tmp_path / "ipython")}
    lane = "import dpkit; print(dpkit.devices(2)[0].torch_device)"
    # One fresh Python for both (each would pay for importing torch): its first line is
    # printed right after `import dpkit`, before anything else runs in it. Then the
    # Makefile's `python -m dpkit.placement_check IPYTHONDIR` writes the kernels' config, and
    # the dpkit command turns the check on, through the names it has always used.
    run = subprocess.run(
        [sys.executable, "-c", f"{lane}; "
         "import runpy, sys, dpkit.cli, dpkit.testing.placement_check as p; "
         f"sys.argv[1:] = [{env['IPYTHONDIR']!r}]; "
         "runpy.run_module('dpkit.placement_check', run_name='__main__'); "
         "dpkit.cli.main(['devices', '-n', '1']); print(p.active())"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    printed = run.stdout.strip().splitlines()
    assert printed[:1] == ["cpu"], run.stdout + run.stderr  # import dpkit: the check is off
    assert printed[-1:] == ["True"], run.stdout + run.stderr  # the dpkit command: on
    config = tmp_path / "ipython" / "profile_default" / "ipython_kernel_config.py"
    assert config.read_text() == write_kernel_config(tmp_path / "copy").read_text()

    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("IPYTHONDIR", env["IPYTHONDIR"])  # the kernel inherits this process's
    for switch, expected in (("1", "cpu:0"), ("0", "cpu")):
        monkeypatch.setenv("DPKIT_CHECK_PLACEMENT", switch)
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(lane)])
        nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
        assert notebook.cells[0].outputs[0].text.strip() == expected, switch


def test_to_device_moves_nested_data_and_refuses_other_lanes():
    lanes = dpkit.virtual_devices(3, on="cpu")
    x = torch.randn(2)
    assert dpkit.to_device(x, lanes[0]) is x  # ordinary lanes: lane 0 is the plain memory
    with checking_placement():
        checked = dpkit.virtual_devices(3, on="cpu")
        moved = dpkit.to_device({"x": x, "pair": (x, 3)}, checked[0])
        assert dpkit.device_of(moved["x"]) == checked[0]
        assert dpkit.device_of(moved["pair"][0]) == checked[0] and moved["pair"][1] == 3
    with pytest.raises(ValueError, match="only lane 0 holds data you create"):
        dpkit.to_device(x, lanes[1])


def test_a_cuda_device_without_index_is_device_zero():
    plain = dpkit.Device(0, devices_module.REAL, torch.device("cuda"))
    indexed = dpkit.Device(0, devices_module.REAL, torch.device("cuda", 0))
    assert plain == indexed and plain.torch_device == torch.device("cuda", 0)
    assert plain.name == "cuda:0"


def test_more_lanes_than_cuda_streams_on_one_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(devices_module, "accelerator_type", lambda: "cuda")
    assert len(dpkit.virtual_devices(devices_module.MAX_GPU_LANES, on="cuda")) == 32
    with pytest.raises(ValueError, match="at most 32"):
        dpkit.virtual_devices(33, on="cuda")


def test_the_check_follows_into_a_thread_that_makes_lanes():
    """A JupyterLab widget's callback may run in a kernel thread other than the one where
    ``import dpkit`` turned the check on: the explorers must work there too."""
    import threading

    from dpkit import viz

    errors = []

    def explorer_callback():
        try:
            viz.apply_trace(devices=2, batch=16, steps=1)
        except Exception as error:  # reported to the test's thread
            errors.append(error)

    with checking_placement():
        thread = threading.Thread(target=explorer_callback)
        thread.start()
        thread.join()
    assert errors == []


def test_to_device_of_the_lanes_torch_device_puts_data_on_lane_0(checked_lanes):
    # lanes[0].torch_device is what .to(home) takes; to_device must agree with it.
    x = dpkit.to_device(torch.randn(2), checked_lanes[0].torch_device)
    assert dpkit.device_of(x) == checked_lanes[0]
    assert dpkit.device_of(dpkit.to_device(torch.randn(2), "cpu")).kind == "host"


def test_packing_a_padded_batch_takes_its_lengths_on_the_host(checked_lanes):
    # torch wants pack_padded_sequence's lengths on the CPU whatever device the batch is on.
    batch = torch.randn(2, 3, 1).to(checked_lanes[0].torch_device)
    packed = nn.utils.rnn.pack_padded_sequence(batch, torch.tensor([3, 2]), batch_first=True)
    assert dpkit.device_of(packed.data) == checked_lanes[0]


def test_to_device_under_the_check_still_refuses_other_lanes_and_bad_names(checked_lanes):
    with pytest.raises(ValueError, match="only lane 0 holds data you create"):
        dpkit.to_device(torch.randn(2), checked_lanes[1])
    with pytest.raises(ValueError, match="is not a device name"):
        dpkit.to_device(torch.randn(2), "nosuch")


@pytest.mark.parametrize(("value", "on"), [("", False), ("0", False), (" 0 ", False), ("1", True),
                                            (" yes ", True)])  # fmt: skip
def test_the_switch_in_the_environment_turns_the_check_on_unless_empty_or_0(monkeypatch, value, on):
    monkeypatch.setenv(placement_check.ENVIRONMENT_VARIABLE, value)
    try:
        placement_check.enable_from_environment()
        assert placement_check.active() is on
    finally:
        placement_check.disable()
    monkeypatch.delenv(placement_check.ENVIRONMENT_VARIABLE)
    placement_check.enable_from_environment()
    assert not placement_check.active()


def test_the_kernel_config_can_be_written_again_into_the_same_folder(tmp_path):
    first = write_kernel_config(tmp_path / "ipython")
    assert write_kernel_config(tmp_path / "ipython") == first and first.exists()


def test_moves_and_parameters_keep_their_keyword_arguments(checked_lanes):
    home = checked_lanes[0].torch_device
    moved = torch.ones(2, 3).to(device=home, dtype=torch.float64)  # keywords only
    assert dpkit.device_of(moved) == checked_lanes[0] and moved.dtype == torch.float64
    images = torch.ones(2, 3, 4, 5).to(home)
    back = images.cpu(memory_format=torch.channels_last)  # a keyword .cpu() takes
    assert back.is_contiguous(memory_format=torch.channels_last)
    assert dpkit.device_of(back).kind == "host"
    frozen = nn.Parameter(torch.ones(2, device=home), requires_grad=False)
    assert not frozen.requires_grad and dpkit.device_of(frozen) == checked_lanes[0]


def test_a_tensor_the_host_already_has_is_copied_onto_lane_0_not_shared(checked_lanes):
    host = torch.ones(3)
    on_lane = host.to(checked_lanes[0].torch_device)
    assert on_lane.data_ptr() != host.data_ptr()  # a copy, as onto cuda:0
    on_lane.add_(1)
    assert torch.equal(host, torch.ones(3))
    assert dpkit.device_of(host).kind == "host"
