"""Every link of a GPU preset says where its number comes from, and a link marked measured
holds the number its cited source states: notebook 06 prints these notes as the reason to
trust each link, so a slip (GB for GiB, a mistyped figure, a citation with no entry) must
show. Fast: reads the presets and their module's docstring only."""

from __future__ import annotations

import importlib
import re

import pytest

import dpkit.cost as cost

# the module, not the function of the same name that dpkit.cost exports
DOC = importlib.import_module("dpkit.cost.presets").__doc__
LINKS = ("host_to_device", "device_to_device", "node_to_node")
GPU_PRESETS = sorted(name for name in cost.presets() if name != "this-machine")


def entry(key: str) -> str:
    """The docstring's bullet for ``[key]``, up to the next bullet or blank line."""
    found = re.search(rf"^- \[{re.escape(key)}\](.*?)(?=^- \[|\n\n)", DOC, re.M | re.S)
    assert found, f"[{key}] is cited but has no entry in dpkit/cost/presets.py's docstring"
    return found.group(1)


def keys(source: str) -> list[str]:
    return re.findall(r"\[([\w-]+)\]", source)


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_every_link_cites_a_source_and_says_measured_or_a_stated_fraction(name):
    hardware = cost.preset(name)
    for field in LINKS:
        source = getattr(hardware, field).source
        cited = keys(source)
        assert cited, f"{name}.{field}: {source!r} cites no [source]"
        for key in cited:
            entry(key)
        measured = "measured" in source
        fraction = re.search(r"(\bx|/) \d", source)  # spec x 0.8, 35 GB/s / 2
        assert measured or fraction, f"{name}.{field}: {source!r} is neither"


def measured_links() -> list[tuple[str, str]]:
    """(preset, field) of every link whose own number was measured: "measured", not a
    fraction borrowed "as measured" on another machine."""
    return [
        (name, field)
        for name in GPU_PRESETS
        for field in LINKS
        if re.search(r"(?<!as )measured", getattr(cost.preset(name), field).source)
    ]


def test_the_measured_links_include_the_ones_this_module_is_built_on():
    found = set(measured_links())
    assert {
        ("8xA100-SXM-NVLink", "device_to_device"),
        ("8xH100-SXM-NVLink", "device_to_device"),
        ("T4-PCIe3", "device_to_device"),
        ("2x8xA100-IB-HDR", "node_to_node"),
    } <= found


@pytest.mark.parametrize(("name", "field"), measured_links())
def test_a_measured_link_holds_the_number_its_source_states(name, field):
    link = getattr(cost.preset(name), field)
    number = f"{link.bandwidth / 1e9:g}"  # GB/s, as nccl-tests and the sources print them
    alone = rf"(?<![\d.]){re.escape(number)}(?!\d)"  # 3.9, not 13.9 or 3.95
    stated = [key for key in keys(link.source) if re.search(alone, entry(key))]
    assert stated, (
        f"{name}.{field} holds {number} GB/s; its sources {keys(link.source)} say otherwise"
    )


@pytest.mark.parametrize(
    "name", [name for name in GPU_PRESETS if not cost.preset(name).peer_to_peer]
)
def test_without_peer_to_peer_device_to_device_is_nccl_through_host_memory(name):
    """There it is what NCCL's collectives get (its SHM transport), not a PCIe or NVLink
    rate: said so in its source, and below the two copies' host_to_device / 2."""
    hardware = cost.preset(name)
    link = hardware.device_to_device
    assert "through host memory" in link.source, f"{name}: {link.source!r}"
    assert link.bandwidth <= hardware.host_to_device.bandwidth / 2
