"""dpkit.cost.catalog against what the course shows of it: notebook 06's stored outputs, the
example hardware file's comments, and the commands that read a preset's counts."""

from __future__ import annotations

import argparse
import html
import json
import re
from pathlib import Path

import pytest

import dpkit.cost as cost
from dpkit.chunk_plans import torch_chunk_sizes
from dpkit.cost import catalog

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06_communication_and_scaling.ipynb"


def _outputs(source_start: str) -> list[dict]:
    """The stored outputs of notebook 06's code cell whose source starts so."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (cell,) = [c for c in cells if "".join(c["source"]).startswith(source_start)]
    return cell["outputs"]


def _html_rows(table: str) -> dict[str, list[str]]:
    """The cells of each row of an HTML table, by the row's first cell (the preset)."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        cells = [html.unescape(c.strip()) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        if cells:  # not the header's
            rows[cells[0]] = cells
    return rows


def _shows(cells: list[str], text: str) -> bool:
    """Whether a cell holds ``text``, or its first characters and "..." (pandas cuts a
    cell's text at 50 characters)."""
    return any(c == text or (c.endswith("...") and text.startswith(c[:-3])) for c in cells)


def test_notebook_06s_table_of_machines_shows_each_links_source_as_the_code_has_it():
    # the "from" columns are a learner's reason to trust each link (measured or assumed)
    (shown,) = [o for o in _outputs("scaling.hardware_table()") if "data" in o]
    rows = _html_rows("".join(shown["data"]["text/html"]))
    assert set(rows) == {name for name in cost.presets() if name != "this-machine"}
    for name, cells in rows.items():
        machine = cost.preset(name)
        assert _shows(cells, machine.device_to_device.source), (name, cells)
        assert _shows(cells, machine.node_to_node.source), (name, cells)


def test_notebook_06s_dataparallel_step_on_8_a100_is_what_the_preset_predicts():
    # "DataParallel: 3.51 ms per step (predicted)": wide-mlp, batch 512 on 8xA100-SXM-NVLink,
    # its host terms (the GIL handed between 8 replica threads among them) included
    from dpkit.models import build_model, sample_input

    printed = "".join("".join(o.get("text", "")) for o in _outputs("dp, ddp = side_by_side"))
    shown = re.search(r"DataParallel: ([\d.]+) ms per step", printed)
    assert shown, printed
    a100 = cost.preset("8xA100-SXM-NVLink")
    step = cost.predict(build_model("wide-mlp", seed=0), sample_input(), 512, 8, a100)
    assert f"{step.step_time * 1e3:.2f}" == shown.group(1)


def test_a_gpu_machines_numbers_first_cite_its_spec_sheet_in_words():
    # "numbers from: spec sheet [T4], PCIe [PCIe]" (dpkit predict's header): the reader is
    # told in words that [T4] is the GPU's datasheet, as docs/hardware_file.md shows it
    for name, machine in cost.presets().items():
        if machine.virtual_lanes:
            continue
        sheet = machine.device_name.split()[0]  # "A100" of "A100 PCIe"
        assert re.match(rf"spec sheets? \[{sheet}\][ ,]", machine.source), (name, machine.source)


def test_every_100_gbe_port_has_the_latency_the_example_hardware_file_states():
    # docs/examples/my_machine.toml, on the 2x8xA100-100GbE port: "latency stays the
    # base's (25e-6 s)"; every preset whose network is that port ("100 GbE x 0.5", as
    # nccl#398 measured over TCP) is the same port: same bandwidth, same latency
    example = (ROOT / "docs" / "examples" / "my_machine.toml").read_text()
    stated = float(re.search(r"latency stays the base's \(([\d.e-]+) s\)", example).group(1))
    port = cost.preset("2x8xA100-100GbE").node_to_node
    assert port.latency == pytest.approx(stated, rel=1e-12)
    same = [m for m in cost.presets().values() if "100 GbE x 0.5" in m.node_to_node.source]
    assert {m.name for m in same} >= {"4xA100-PCIe4", "2x8xA100-100GbE"}
    for machine in same:
        link = machine.node_to_node
        assert (link.bandwidth, link.latency) == (port.bandwidth, port.latency), machine.name


def test_dpkit_plan_s_defaults_give_every_device_of_every_preset_rows():
    # `dpkit plan --hardware NAME` plans the global batch (default 256) over all of the
    # preset's devices; DDP refuses a device count that leaves a rank without rows
    # (torch.chunk), so the defaults must split evenly: 256 / 64 lanes = 4 rows each
    from dpkit.ddp import plan

    defaults = plan._arguments(argparse.ArgumentParser()).parse_args([])
    assert defaults.devices is None and defaults.batch == 256
    for name, machine in catalog.presets().items():
        devices = machine.devices_per_node * machine.nodes
        assert len(torch_chunk_sizes(defaults.batch, devices)) == devices, (name, devices)


@pytest.mark.parametrize("name", ["this-machine"])
def test_the_default_plan_on_the_lanes_predicts_ddp_on_all_of_them(name):
    from dpkit.models import build_model, sample_input

    machine = cost.preset(name)
    devices = machine.devices_per_node * machine.nodes
    trace = cost.predict(build_model("mlp", seed=0), sample_input(), 256, devices, machine, "ddp")
    assert trace.device_count == devices


def test_the_default_s_stated_accuracy_is_the_recorded_check():
    """``dpkit predict --hardware this-machine`` prints how close the uncalibrated preset came
    to measured steps; those numbers are benchmarks/this_machine_preset.py's recorded ones."""
    recorded = json.loads((ROOT / "benchmarks/results/this_machine_preset.json").read_text())
    errors = recorded["step_errors"]
    shipped, calibrated = (
        errors["preset as shipped (no op curves)"],
        errors["last calibration, with its op curves"],
    )
    stated = re.search(
        r"median error (\d+) % on the course models, (\d+) % on others "
        r"\((\d+)-(\d+) % once calibrated",
        cost.preset("this-machine").source,
    )
    assert stated, cost.preset("this-machine").source
    percent = [round(100 * e["median_abs_error"]) for e in (shipped["course"], shipped["heldout"])]
    assert [int(stated[1]), int(stated[2])] == percent
    low, high = sorted(round(100 * e["median_abs_error"]) for e in calibrated.values())
    assert [int(stated[3]), int(stated[4])] == [low, high]
