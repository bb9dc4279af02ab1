"""Every preset machine fully set, positive and cited; names as the CLI lists them."""

from __future__ import annotations

import dataclasses
import re

import pytest

import dpkit.cost as cost
from dpkit.cost import Hardware, Link, catalog
from dpkit.cost.hardware import HOST_TERMS

REQUIRED = {
    "this-machine", "T4-PCIe3", "4xA100-PCIe4", "8xV100-NVLink", "8xA100-SXM-NVLink",
    "8xH100-SXM-NVLink", "2x8xA100-IB-HDR", "2x8xA100-100GbE", "2x8xA100-10GbE",
}  # fmt: skip
SOURCES = catalog.__doc__
CITED = set(re.findall(r"^- \[([\w-]+)\]", SOURCES, flags=re.MULTILINE))


def test_the_issue_s_machines_are_all_there():
    assert REQUIRED <= set(cost.presets())


# Fields that calibrate() fills from measurements on this machine; empty in the presets.
CALIBRATED_ONLY = ("op_seconds", "allreduce_bandwidth")


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_field_is_set_and_positive(name):
    hardware = cost.presets()[name]
    for field in dataclasses.fields(Hardware):
        value = getattr(hardware, field.name)
        if field.name in CALIBRATED_ONLY:
            continue  # filled by calibrate() only
        if field.name == "tensor_core_efficiency":
            continue  # by dtype, where measured: test_tensor_core_fractions_are_the_measured_ones
        if isinstance(value, Link):
            assert value.bandwidth > 0 and value.latency > 0, field.name
        elif isinstance(value, bool):
            continue
        elif isinstance(value, (int, float)):
            assert value > 0, field.name
        elif isinstance(value, str):
            assert value.strip(), field.name
        else:
            assert value and all(rate > 0 for rate in value.values()), field.name
    assert "float32" in hardware.peak_flops
    assert 0 < hardware.matmul_efficiency <= 1 and 0 < hardware.memory_efficiency <= 1
    for link in (hardware.host_to_device, hardware.device_to_device, hardware.node_to_node):
        assert link.source.strip()  # measured (cited) or spec x a fraction (marked assumed)


@pytest.mark.parametrize("name", sorted(REQUIRED - {"this-machine"}))
def test_a_gpu_machines_host_terms_are_eager_pytorchs_microseconds(name):
    # presets' docstring: a few us of Python and dispatch per op, about 5 us a CUDA launch,
    # 0.1 ms to start a thread. Seconds, not microseconds written as seconds (or divided).
    hardware = cost.presets()[name]
    for term in HOST_TERMS:
        assert 1e-6 <= getattr(hardware, term) <= 1e-3, term


@pytest.mark.parametrize("name", sorted(REQUIRED - {"this-machine"}))
def test_every_gpu_machine_cites_its_sources(name):
    keys = set(re.findall(r"\[([\w-]+)\]", cost.presets()[name].source))
    assert keys and keys <= CITED, keys - CITED


def test_preset_names_are_case_insensitive_and_unknown_names_list_the_choices():
    assert cost.preset("t4-pcie3").name == "T4-PCIe3"
    with pytest.raises(ValueError, match="8xA100-SXM-NVLink"):
        cost.preset("a-laptop-gpu")


def test_hardware_refuses_numbers_that_are_not_positive():
    good = cost.preset("8xA100-SXM-NVLink")
    with pytest.raises(ValueError, match="thread_start"):
        dataclasses.replace(good, thread_start=0.0)
    with pytest.raises(ValueError, match="float64"):
        good.flops_per_second("float64")
    assert good.flops_per_second("float32") == pytest.approx(19.5e12 * good.matmul_efficiency)


@pytest.mark.parametrize("name", ["description", "memory_capacity", "peer_to_peer"])
def test_none_is_refused_where_a_field_needs_a_value(name):
    with pytest.raises(TypeError, match=f"{name}=None must be"):
        dataclasses.replace(cost.preset("8xA100-SXM-NVLink"), **{name: None})


def test_none_is_the_all_reduce_rate_where_it_is_not_known():
    machine = dataclasses.replace(cost.preset("8xH100-SXM-NVLink"), allreduce_bandwidth=None)
    assert machine.allreduce_bandwidth is None  # NCCL's ring then, from the device link


def test_tensor_core_fractions_are_the_measured_ones():
    """The A100 and V100 presets' fractions of peak are what
    benchmarks/tensor_core_efficiency.py read from ResNeXt-101's published steps (its
    results file), rounded to 2 digits; a preset edited by hand without re-running it fails."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    found = json.loads((results / "tensor_core_efficiency.json").read_text())
    for row in found.values():
        hardware = cost.preset(row["preset"])
        unit, fraction = row["unit"], row["implied fraction of peak"]
        if unit == "float32":  # CUDA cores
            assert hardware.matmul_efficiency == round(fraction, 2), row
        else:
            assert hardware.tensor_core_efficiency[unit] == round(fraction, 2), row
    a100 = cost.preset("8xA100-SXM-NVLink")
    assert a100.flops_per_second("tfloat32") == pytest.approx(156e12 * 0.33)
    # every machine of the measured GPU uses them: the PCIe card and the two-node ones too
    for row in found.values():
        measured = cost.preset(row["preset"])
        same_gpu = [h for h in cost.presets().values()
                    if h.device_name.split()[0] == measured.device_name]  # fmt: skip
        assert len(same_gpu) > 1 or measured.device_name == "V100", row
        for hardware in same_gpu:
            rates = (hardware.matmul_efficiency, hardware.tensor_core_efficiency)
            assert rates == (measured.matmul_efficiency, measured.tensor_core_efficiency)


def test_the_course_models_fit_the_default_machine_with_room_to_spare():
    # what a learner without a GPU predicts first: 4 lanes, as the course's notebooks run
    from dpkit.models import COURSE_MODELS, build_model, sample_input

    for name in COURSE_MODELS:
        trace = cost.predict(build_model(name, seed=0), sample_input(), 256, 4, "this-machine")
        assert trace.fits and max(trace.memory_per_device) < 0.01 * trace.machine.memory_capacity
