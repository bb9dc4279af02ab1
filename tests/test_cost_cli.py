"""``dpkit predict`` end to end: in a subprocess as a learner runs it where the exit status
and the absence of a traceback are the point, else in this process through ``dpkit.cli.main``
(the same parser, the same error handling, seconds faster)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

import dpkit.cost as cost
import dpkit.cost.cli as predict_cli
from dpkit.cli import main
from dpkit.models import build_model, sample_input


def dpkit(*arguments: str, cwd=None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "DPKIT_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "dpkit", *arguments],
        capture_output=True, text=True, timeout=120, cwd=cwd, env=env,
    )  # fmt: skip


@pytest.fixture
def predict_here(capsys, monkeypatch, tmp_path, predict_models_built_once):
    """``dpkit predict ARGS`` in this process: (exit status, stdout, stderr); the figures
    and trace go to a temporary folder unless ``--out`` is given. Each model is built and
    profiled once per test module (conftest.py's predict_models_built_once)."""
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)

    def run(*arguments: str) -> tuple[int, str, str]:
        out = [] if "--out" in arguments else ["--out", str(tmp_path / "out")]
        status = main(["predict", *arguments, *out])
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run


@pytest.fixture
def spy(monkeypatch):
    """Records what ``dpkit predict`` passes to ``cost.predict`` and the trace it gets."""
    calls: list[dict] = []

    def recording(*args, **kwargs):
        trace = cost.predict(*args, **kwargs)
        calls.append({"args": args, "kwargs": kwargs, "trace": trace})
        return trace

    monkeypatch.setattr(predict_cli, "predict", recording)
    return calls


def one_line_error(stderr: str, *needles: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("dpkit: error:"), stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], (needle, stderr)


def test_list_prints_a_preset_per_line_name_first(predict_here):
    status, out, err = predict_here("--list")
    assert status == 0, err
    lines = out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == list(cost.presets())


def test_predict_prints_time_and_memory_and_writes_the_files(tmp_path):
    result = dpkit(
        "predict", "--hardware", "2x8xA100-IB-HDR", "--devices", "16", "--batch", "512",
        "--model", "cnn", "--strategy", "ddp", "--out", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("PREDICTED by dpkit's cost model, not measured: 2x8xA100-IB-HDR")
    assert "phase" in out and "allreduce" in out
    assert "predicted step time:" in out
    assert "memory per device at the step's peak, predicted" in out
    assert "predicted memory: fits: device 0 needs" in out and "of 80.00 GiB" in out
    chrome = json.loads((tmp_path / "trace.json").read_text())
    tracks = [e for e in chrome["traceEvents"] if e["name"] == "thread_name"]
    assert len(tracks) == 16
    assert "predicted:15 (A100, node 1)" in {e["args"]["name"] for e in tracks}
    process = next(e for e in chrome["traceEvents"] if e["name"] == "process_name")
    assert "predicted" in process["args"]["name"]
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert (tmp_path / "memory.png").stat().st_size > 10_000


def test_unknown_hardware_is_a_clear_error(predict_here):
    status, _, err = predict_here("--hardware", "my-laptop-gpu")
    assert status == 2
    one_line_error(err, "is not a preset", "8xA100-SXM-NVLink")


# -- the flags reach predict ---------------------------------------------------------------


def test_adam_holds_two_more_copies_of_the_gradients_on_device_0_than_sgd(predict_here, spy):
    gradient_bytes = sum(cost.profile(build_model("mlp", seed=0), sample_input()).parameter_sizes)
    for optimizer in ("sgd", "adam"):
        status, out, err = predict_here("--model", "mlp", "--devices", "4",
                                        "--optimizer", optimizer)  # fmt: skip
        assert status == 0, err
        assert f"optimizer {optimizer}" in out
    sgd, adam = (call["trace"].held[0] for call in spy)
    assert spy[1]["kwargs"]["optimizer"] == "adam"
    assert adam["optimizer"] - sgd.get("optimizer", 0) == 2 * gradient_bytes
    assert sum(adam.values()) - sum(sgd.values()) == 2 * gradient_bytes


def test_amp_gradient_as_bucket_view_and_bucket_cap_reach_predict(predict_here, spy):
    status, out, err = predict_here(
        "--model", "cnn", "--devices", "4", "--strategy", "ddp", "--amp", "bf16",
        "--gradient-as-bucket-view", "--bucket-cap-mb", "50",
    )  # fmt: skip
    assert status == 0, err
    kwargs = spy[0]["kwargs"]
    assert kwargs["amp"] == "bf16"
    assert kwargs["gradient_as_bucket_view"] is True
    assert kwargs["bucket_cap_mb"] == 50.0
    assert all(held["buckets"] == 0 for held in spy[0]["trace"].held)
    assert "autocast bf16" in out and "gradient_as_bucket_view" in out


@pytest.mark.parametrize("view", [False, True])
def test_the_step_time_not_in_the_phases_is_said_and_adds_up(predict_here, spy, view):
    # The table's step (and its shares) is the phases' span, not the step: the line under it
    # says what the rest is, and the two numbers add up to the step time printed.
    arguments = ["--model", "mlp", "--devices", "16", "--hardware", "2x8xA100-100GbE",
                 "--strategy", "ddp", *(["--gradient-as-bucket-view"] if view else [])]  # fmt: skip
    status, out, err = predict_here(*arguments)
    assert status == 0, err
    trace = spy[0]["trace"]
    span = max(e.end for e in trace.events) - min(e.start for e in trace.events)
    line = next(line for line in out.splitlines() if line.startswith("  (the table's step: the"))
    phases, rest = (float(n) for n in re.findall(r"([\d.]+) ms", line))
    assert phases == pytest.approx(span * 1e3, abs=1e-3)
    assert phases + rest == pytest.approx(trace.step_time * 1e3, abs=2e-3)
    assert rest > 0
    assert ("copied into .grad" in line) is not view
    assert trace.summary().step_s == pytest.approx(span)  # one step: the table's step row


def test_the_defaults_are_torchs(predict_here, spy):
    status, out, err = predict_here("--model", "cnn", "--devices", "2")
    assert status == 0, err
    kwargs = spy[0]["kwargs"]
    assert (kwargs["amp"], kwargs["optimizer"]) == (None, "sgd")
    assert (kwargs["gradient_as_bucket_view"], kwargs["bucket_cap_mb"]) == (False, None)
    assert spy[0]["args"][4] == cost.preset("8xA100-SXM-NVLink")
    assert "float32 (as torch runs it" in out
    status, out, err = predict_here("--hardware", "this-machine", "--devices", "2")
    assert "  float32; optimizer sgd" in out  # CPU lanes have no TF32 to speak of


@pytest.mark.parametrize(
    "arguments, needle",
    [
        (["--amp", "fp8"], "--amp: invalid choice"),
        (["--optimizer", "lion"], "--optimizer: invalid choice"),
        (["--bucket-cap-mb", "0"], "--bucket-cap-mb: must be more than 0"),
        (["--bucket-cap-mb", "nan"], "--bucket-cap-mb: must be more than 0"),
    ],
)
def test_bad_flags_are_refused_by_the_parser(predict_here, capsys, arguments, needle):
    with pytest.raises(SystemExit) as exit_:
        predict_here(*arguments)
    assert exit_.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags", [["--bucket-cap-mb", "5"], ["--gradient-as-bucket-view"],
              ["--bucket-cap-mb", "5", "--gradient-as-bucket-view"]],
)  # fmt: skip
def test_ddp_s_flags_without_strategy_ddp_are_refused_not_ignored(predict_here, spy, flags):
    status, _, err = predict_here(*flags)  # --strategy is dp by default
    assert status == 2 and not spy  # refused before any prediction
    named = " and ".join(flag for flag in flags if flag.startswith("--"))
    one_line_error(err, f"{named}: for DDP's buckets, but --strategy is dp", "--strategy ddp")


def test_a_batch_of_fewer_rows_than_devices_says_how_many_got_a_chunk(predict_here):
    status, out, err = predict_here("--batch", "3")  # 8 devices by default
    assert status == 0, err
    assert "8 device(s) (3 got a chunk, the others sit idle), strategy dp" in out
    status, out, err = predict_here("--batch", "8")
    assert "8 device(s), strategy dp" in out


def test_devices_default_to_eight_or_all_of_a_smaller_machine(predict_here, spy):
    status, out, err = predict_here("--hardware", "T4-PCIe3")  # a Colab-sized preset: 4 T4s
    assert status == 0, err
    assert spy[-1]["args"][3] == cost.preset("T4-PCIe3").max_devices == 4
    assert "4 device(s), strategy dp" in out
    status, out, err = predict_here()
    assert spy[-1]["args"][3] == 8 and "8 device(s)" in out


def test_predict_s_refusals_name_the_flags_typed_not_python_arguments(predict_here):
    status, out, err = predict_here("--strategy", "ddp", "--devices", "100")
    assert status == 2
    one_line_error(err, "--batch 256 over --devices 100 leaves 14 of 100 ranks without rows",
                   "use a multiple of 100, e.g. --batch 300")  # fmt: skip
    status, out, err = predict_here("--hardware", "T4-PCIe3", "--devices", "8")
    one_line_error(err, "--strategy dp on 8 devices", "train with --strategy ddp")


def test_more_devices_than_the_machine_has_says_the_nodes_and_network_it_adds(predict_here):
    arguments = ("--hardware", "8xA100-SXM-NVLink", "--strategy", "ddp", "--batch", "256")
    status, out, err = predict_here(*arguments, "--devices", "64")
    assert status == 0, err
    network = cost.preset("8xA100-SXM-NVLink").node_to_node
    assert (f"64 devices are 8 nodes of 8 (more than the machine's 1), joined by its network: "
            f"{network.bandwidth / 1e9:g} GB/s a port") in out  # fmt: skip
    status, out, err = predict_here(*arguments, "--devices", "8")  # the machine as named
    assert "devices are" not in out
    status, out, err = predict_here("--hardware", "2x8xA100-100GbE", "--strategy", "ddp",
                                    "--devices", "16", "--batch", "256")  # fmt: skip
    assert status == 0 and "devices are" not in out


def test_ddp_on_this_machines_lanes_says_its_all_reduce_is_gloo_not_lane_copies(predict_here):
    status, out, err = predict_here("--hardware", "this-machine", "--strategy", "ddp",
                                    "--devices", "2", "--batch", "64")  # fmt: skip
    assert status == 0, err
    assert "all-reduce over gloo (TCP on loopback)" in out
    # the bytes column counts the ring's sends, where dpkit ddp's counts the buckets
    assert "(allreduce bytes: what the ring sends, 2(n-1)/n of each bucket" in out
    status, out, err = predict_here("--hardware", "this-machine", "--devices", "2")
    assert "gloo" not in out  # DataParallel's lanes do copy in one memory


def test_amp_on_a_device_without_its_units_is_a_clear_error(predict_here):
    status, _, err = predict_here("--hardware", "8xV100-NVLink", "--amp", "bf16")
    assert status == 2
    one_line_error(err, "no bfloat16 rate", "V100")


# -- memory: the table and the verdict ------------------------------------------------------


def test_memory_table_has_every_category_total_and_capacity_and_a_fits_verdict(predict_here, spy):
    status, out, err = predict_here("--model", "mlp", "--devices", "4", "--optimizer", "momentum")
    assert status == 0, err
    trace = spy[0]["trace"]
    table = out.split("memory per device at the step's peak, predicted, in MiB:\n")[1]
    header, _, *rows = table.splitlines()[:4]
    for category in trace.held[0]:
        assert category in header
    assert header.split()[-2:] == ["total", "capacity"]
    device_0 = rows[0].split()
    assert device_0[0] == "0" and rows[1].split()[0] == "1-3"  # devices 1-3 hold the same
    assert float(device_0[-2]) == pytest.approx(trace.memory_per_device[0] / 2**20, abs=0.05)
    assert device_0[-1] == "81,920.0"  # 80 GiB in MiB
    verdict = next(line for line in out.splitlines() if line.startswith("predicted memory:"))
    assert verdict.startswith("predicted memory: fits: device 0 needs ")
    assert verdict.endswith("of 80.00 GiB (0.0 %), the fullest device")


def test_a_machine_too_small_does_not_fit_and_says_by_how_much(predict_here, spy, tmp_path):
    small = tmp_path / "small.toml"
    small.write_text('base = "8xA100-SXM-NVLink"\nmemory_capacity = 3e6\n')
    status, out, err = predict_here("--hardware-file", str(small), "--model", "mlp",
                                    "--devices", "4", "--batch", "512")  # fmt: skip
    assert status == 0, err
    trace = spy[0]["trace"]
    assert not trace.fits
    need = predict_cli.readable_bytes(trace.memory_per_device[0])
    assert f"predicted memory: does not fit: device 0 needs {need} of 2.9 MiB" in out
    assert "--strategy ddp" in out


# -- hardware files -------------------------------------------------------------------------


def same_machine(a: cost.Hardware, b: cost.Hardware) -> bool:
    """Every field equal, floats to 12 digits (the template writes 10e-6 for 10 * 1e-6)."""

    def close(x, y) -> bool:
        if isinstance(x, cost.Link):
            return isinstance(y, cost.Link) and all(
                close(getattr(x, k), getattr(y, k)) for k in ("bandwidth", "latency", "source")
            )
        if isinstance(x, dict):
            return (
                isinstance(y, dict) and x.keys() == y.keys() and all(close(x[k], y[k]) for k in x)
            )
        if isinstance(x, float) and not isinstance(y, bool):
            return math.isclose(x, y, rel_tol=1e-12)
        return type(x) is type(y) and x == y

    return all(close(getattr(a, f.name), getattr(b, f.name)) for f in fields(cost.Hardware))


def whole_machine_toml(machine: cost.Hardware, **changes: object) -> str:
    """Every field of ``machine`` as a hardware file writes it (links and tables as sections)."""
    values = {f.name: getattr(machine, f.name) for f in fields(cost.Hardware)} | changes
    values["allreduce_bandwidth"] = values["allreduce_bandwidth"] or "none"
    plain = {k: v for k, v in values.items() if not isinstance(v, (dict, cost.Link))}
    lines = [f"{key} = {json.dumps(value)}" for key, value in plain.items()]
    for key, value in values.items():
        if isinstance(value, cost.Link):
            value = {"bandwidth": value.bandwidth, "latency": value.latency, "source": value.source}
        if isinstance(value, dict):
            lines += [f"[{key}]", *(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "machine",
    [
        cost.preset("T4-PCIe3"),
        replace(cost.preset("8xH100-SXM-NVLink"), allreduce_bandwidth=None,
                op_seconds={"aten.addmm": ((1e6, 2.5e-6), (1.5e9, 1.23456789012e-3))}),
    ],
)  # fmt: skip
def test_a_whole_machine_file_loads_as_the_machine(tmp_path, machine):
    path = tmp_path / "machine.toml"
    path.write_text(whole_machine_toml(machine))
    assert same_machine(predict_cli.load_hardware_file(path), machine)


def test_whole_counts_written_as_floats_are_counts(predict_here, spy, tmp_path):
    path = tmp_path / "fours.toml"
    path.write_text('base = "2x8xA100-IB-HDR"\ndevices_per_node = 4.0\nnodes = 2.0\n')
    status, out, err = predict_here("--hardware-file", str(path), "--strategy", "ddp",
                                    "--devices", "8", "--model", "cnn")  # fmt: skip
    assert status == 0, err
    machine = spy[0]["trace"].machine
    assert type(machine.devices_per_node) is int and type(machine.nodes) is int
    assert "predicted:7 (A100, node 1)" in {e.device for e in spy[0]["trace"].events}


def test_a_toml_hardware_file_predicts_like_its_preset(predict_here, spy, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(whole_machine_toml(cost.preset("8xA100-SXM-NVLink"), name="my A100 box"))
    outs = []
    for hardware in (["--hardware-file", str(path)], ["--hardware", "8xA100-SXM-NVLink"]):
        status, out, err = predict_here(*hardware, "--model", "cnn", "--devices", "8")
        assert status == 0, err
        outs.append(out)
    mine, preset = (call["trace"] for call in spy)
    assert mine.machine.name == "my A100 box"
    assert outs[0].startswith("PREDICTED by dpkit's cost model, not measured: my A100 box")
    assert mine.step_time == pytest.approx(preset.step_time, rel=1e-9)
    assert mine.memory_per_device == preset.memory_per_device


def test_a_what_if_changes_only_what_it_names(predict_here, spy, tmp_path):
    path = tmp_path / "slow_network.toml"
    path.write_text('base = "2x8xA100-100GbE"\n[node_to_node]\nbandwidth = 1.25e9\n'
                    "[peak_flops]\nfloat32 = 20e12\n")  # fmt: skip
    status, out, err = predict_here("--hardware-file", str(path), "--strategy", "ddp",
                                    "--devices", "16", "--model", "cnn")  # fmt: skip
    assert status == 0, err
    machine, base = spy[0]["trace"].machine, cost.preset("2x8xA100-100GbE")
    assert machine.name == "slow_network" and "slow_network" in out
    assert machine.node_to_node.bandwidth == 1.25e9
    assert machine.node_to_node.latency == base.node_to_node.latency
    assert "slow_network.toml" in machine.node_to_node.source  # not the base's citation
    assert machine.peak_flops == {**base.peak_flops, "float32": 20e12}
    assert machine.device_to_device == base.device_to_device
    assert machine.memory_capacity == base.memory_capacity


def test_the_doc_example_file_predicts_through_hardware_file(predict_here, spy):
    root = Path(__file__).resolve().parents[1]
    example = root / "docs" / "examples" / "my_machine.toml"
    status, out, err = predict_here("--hardware-file", str(example), "--devices", "16",
                                    "--strategy", "ddp", "--model", "cnn")  # fmt: skip
    assert status == 0, err
    machine = spy[0]["trace"].machine
    assert machine.name == "2x8xA100-40GB-2x100GbE" and machine.nics_per_node == 2
    assert machine.node_to_node.latency == cost.preset("2x8xA100-100GbE").node_to_node.latency
    assert out.startswith("PREDICTED by dpkit's cost model, not measured: 2x8xA100-40GB-2x100GbE")
    assert "of 40.00 GiB" in out  # the file's memory_capacity, in the memory verdict


@pytest.mark.parametrize(
    "text, needles",
    [
        ('base = "8xA100-SXM-NVLink"\nmemory_capcity = 40e9\n',
         ["unknown field 'memory_capcity'", "did you mean 'memory_capacity'", "nics_per_node"]),
        ('base = "8xA100-SXM-NVLink"\nmemory_capacity = "40 GB"\n',
         ["memory_capacity='40 GB'", "plain number of bytes", "80e9 for 80 GB"]),
        ('base = "8xA100-SXM-NVLink"\nmemory_capacity = -1\n',
         ["memory_capacity=-1", "must be finite and above 0"]),
        ('base = "8xA100-SXM-NVLink"\nmemory_capacity = [40e9]\n',  # a list, shown as written
         ["memory_capacity=[40000000000.0]", "plain number of bytes"]),
        ('base = "8xA100-SXM-NVLink"\nmatmul_efficiency = 70\n',
         ["matmul_efficiency=70", "in (0, 1]"]),
        ('base = "8xA100-SXM-NVLink"\nnodes = 1.5\n', ["nodes=1.5", "whole number"]),
        ('base = "8xA100-SXM-NVLink"\npeer_to_peer = "yes"\n',
         ["peer_to_peer='yes'", "true or false"]),
        ('base = "8xA100-SXM-NVLink"\n[node_to_node]\nbandwith = 12.5e9\n',
         ["unknown key of node_to_node 'bandwith'", "did you mean 'bandwidth'"]),
        ('base = "8xA100-SXM-NVLink"\n[node_to_node]\nlatency = 0\n',
         ["node_to_node", "latency=0", "above 0"]),
        ('[node_to_node]\nbandwidth = 12.5e9\n',  # a new link, without a base's to start from
         ["node_to_node has no latency", "a link needs bandwidth"]),
        ('base = "8xA100-SXM-NVLink"\n[peak_flops]\nfp32 = 1e12\n',
         ["peak_flops['fp32'] is not a dtype", "float32"]),
        ('base = "8xA100-SXM-NVLink"\n[tensor_core_efficiency]\nfloat16 = 40\n',
         ["tensor_core_efficiency['float16']=40", "fraction in (0, 1]"]),
        ('base = "A100"\n', ["base:", "is not a preset", "8xA100-SXM-NVLink"]),
        ('name = "half"\nnodes = 1\n', ["missing description", "base =", "my_machine.toml"]),
        ("base = \n", ["not valid TOML"]),
    ],
)  # fmt: skip
def test_a_bad_hardware_file_is_refused_naming_the_field(predict_here, tmp_path, text, needles):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    status, out, err = predict_here("--hardware-file", str(path))
    assert status == 2 and out == ""
    one_line_error(err, f"--hardware-file {path}", *needles)


def test_a_missing_file_is_named(predict_here, tmp_path):
    status, _, err = predict_here("--hardware-file", str(tmp_path / "missing.toml"))
    assert status == 2
    one_line_error(err, f"--hardware-file {tmp_path / 'missing.toml'}", "no such file")


def test_without_a_toml_reader_the_error_says_to_install_tomli(monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10 without tomli
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(ValueError, match="pip install tomli"):
        predict_cli.load_hardware_file(
            Path(__file__).resolve().parents[1] / "docs" / "examples" / "my_machine.toml"
        )


def test_hardware_and_hardware_file_together_are_refused(predict_here, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('base = "8xA100-SXM-NVLink"\n')
    status, _, err = predict_here("--hardware-file", str(path), "--hardware", "T4-PCIe3")
    assert status == 2
    one_line_error(err, "--hardware and --hardware-file", 'base = "T4-PCIe3"')


# -- clean errors: --out, dp across nodes ---------------------------------------------------


def test_dp_across_nodes_exits_2_with_the_teaching_message(tmp_path):
    result = dpkit("predict", "--hardware", "2x8xA100-100GbE", "--devices", "16",
                   "--strategy", "dp", "--model", "mlp", "--out", str(tmp_path))  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    one_line_error(result.stderr, "nn.DataParallel is one process", "--strategy ddp")


def test_out_in_proc_exits_2_with_one_line(predict_here):
    status, out, err = predict_here("--model", "mlp", "--out", "/proc/dpkit-cannot-write-here")
    assert status == 2 and out == ""
    one_line_error(err, "--out /proc/dpkit-cannot-write-here", "cannot write there", "--out /tmp/")


def test_out_not_a_folder_exits_2_naming_out(predict_here, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for out, needle in ((a_file, "is a file, not a folder"),
                        (a_file / "below", "a part of it is a file")):  # fmt: skip
        status, _, err = predict_here("--out", str(out))
        assert status == 2
        one_line_error(err, f"--out {out}", needle, "choose a folder you can write to")


def test_out_where_trace_json_cannot_be_written_exits_2(predict_here, tmp_path):
    (tmp_path / "trace.json").mkdir()  # a folder where the file goes
    status, _, err = predict_here("--out", str(tmp_path), "--devices", "2")
    assert status == 2
    one_line_error(err, f"--out {tmp_path}", "cannot write trace.json")


def test_out_read_only_folder_exits_2(predict_here, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anyway: make it answer as it does anyone else

        def refused(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(locked))

        monkeypatch.setattr(predict_cli.tempfile, "NamedTemporaryFile", refused)
    try:
        status, _, err = predict_here("--out", str(locked))
    finally:
        locked.chmod(0o755)
    assert status == 2
    one_line_error(err, f"--out {locked}", "cannot write there (Permission denied)")


# -- what it prints, read back ---------------------------------------------------------------


def test_every_option_says_what_it_is_for_and_its_unit(capsys):
    from dpkit.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["predict", "--help"])
    helped = capsys.readouterr().out
    assert "--bucket-cap-mb MiB" in helped  # the unit, where a number is asked for
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    predict_parser = commands.choices["predict"]
    assert predict_parser.description and "predicted" in predict_parser.description
    listed = {action.dest: action.help for action in commands._choices_actions}
    assert listed["predict"] and "predict" in listed["predict"]  # in dpkit --help's list
    for action in predict_parser._actions:
        assert action.help and action.help.strip(), action.option_strings


def test_the_printed_step_time_and_files_are_the_traces(predict_here, spy, tmp_path):
    status, out, err = predict_here("--model", "cnn", "--devices", "4", "--out", str(tmp_path))
    assert status == 0, err
    trace = spy[0]["trace"]
    assert f"predicted step time: {trace.step_time * 1e3:.3f} ms" in out
    assert "open trace.json at https://ui.perfetto.dev" in out  # where to look at it
    for label, name in (("Chrome trace", "trace.json"), ("timeline", "timeline.png"),
                        ("memory", "memory.png")):  # fmt: skip
        line = next(line for line in out.splitlines() if line.startswith(f"{label}:"))
        assert line.split()[-1] == str(tmp_path / name)
        assert (tmp_path / name).stat().st_size > 1000, name


def test_the_memory_table_holds_each_devices_bytes_right_aligned(predict_here, spy):
    status, out, err = predict_here("--model", "mlp", "--devices", "2", "--optimizer", "adam")
    assert status == 0, err
    held = spy[0]["trace"].held[0]
    table = out.split("memory per device at the step's peak, predicted, in MiB:\n")[1]
    header, _, device_0 = table.splitlines()[:3]
    cells = dict(zip(header.split(), device_0.split()))
    for category, nbytes in held.items():  # categories are single words ("cuBLAS ..." aside)
        if category in cells:
            assert float(cells[category].replace(",", "")) == pytest.approx(
                nbytes / 2**20, abs=0.05
            ), category
    lines = table.splitlines()[:3]
    assert all(not line.endswith(" ") for line in lines)  # numbers flush right
    assert len({len(line) for line in lines}) == 1


def test_readable_bytes_picks_the_unit():
    assert predict_cli.readable_bytes(500) == "500 B"  # below a KiB: bytes
    assert predict_cli.readable_bytes(3 << 20) == "3.0 MiB"
    assert predict_cli.readable_bytes(5 << 30) == "5.00 GiB"


@pytest.mark.parametrize("lanes", [False, True])
def test_a_machine_exactly_full_fits(spy, predict_here, lanes):
    arguments = ["--model", "mlp", "--devices", "2"]
    arguments += ["--hardware", "this-machine"] if lanes else []
    status, _, err = predict_here(*arguments)
    assert status == 0, err
    trace = spy[0]["trace"]
    need = sum(trace.memory_per_device) if lanes else max(trace.memory_per_device)
    trace.machine = dataclasses.replace(trace.machine, memory_capacity=need)
    verdict = predict_cli.fit_verdict(trace)
    assert verdict.startswith("fits: ")
    if not lanes:
        assert "(100.0 %), the fullest device" in verdict
        trace.machine = dataclasses.replace(trace.machine, memory_capacity=4 * need)
        assert "(25.0 %), the fullest device" in predict_cli.fit_verdict(trace)


def test_an_error_without_a_file_name_while_writing_is_one_line(predict_here, monkeypatch):
    def full_disk(self, path):
        raise OSError("no space left on the device")  # no errno, no file name

    monkeypatch.setattr(cost.PredictedTrace, "to_chrome_trace", full_disk)
    status, _, err = predict_here("--devices", "2")
    assert status == 2
    one_line_error(err, "--out", "no space left on the device", "choose a folder")


def test_a_file_with_only_a_base_names_what_changed_nothing(tmp_path):
    path = tmp_path / "same.toml"
    path.write_text('base = "T4-PCIe3"\n')
    machine = predict_cli.load_hardware_file(path)
    assert machine.description.startswith("T4-PCIe3 with nothing from ")


def test_calibrate_measures_only_this_machine(predict_here):
    status, _, err = predict_here("--calibrate", "--hardware", "T4-PCIe3")
    assert status == 2
    one_line_error(err, "--calibrate measures this machine", "--hardware this-machine")
