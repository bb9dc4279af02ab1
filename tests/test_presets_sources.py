"""Every link of a GPU preset says where its number comes from, and a link marked measured
holds the number its cited source states: notebook 06 prints these notes as the reason to
trust each link, so a slip (GB for GiB, a mistyped figure, a citation with no entry) must
show. Fast: reads the presets and their module's docstring only."""

from __future__ import annotations

import re

import pytest

import dpkit.cost as cost
from dpkit.cost import catalog

DOC = catalog.__doc__
LINKS = ("host_to_device", "device_to_device", "node_to_node")
GPU_PRESETS = sorted(name for name in cost.presets() if name != "this-machine")


def entry(key: str) -> str:
    """The docstring's bullet for ``[key]``, up to the next bullet or blank line."""
    found = re.search(rf"^- \[{re.escape(key)}\](.*?)(?=^- \[|\n\n)", DOC, re.M | re.S)
    assert found, f"[{key}] is cited but has no entry in dpkit/cost/catalog.py's docstring"
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


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_a_devices_peaks_are_the_numbers_its_datasheet_states(name):
    hardware = cost.preset(name)
    sheet = entry(hardware.device_name.split()[0])  # [A100] for "A100 PCIe": its datasheet
    for dtype, rate in hardware.peak_flops.items():
        number = rf"(?<![\d.]){re.escape(f'{rate / 1e12:g}')}(?![\d])"
        assert re.search(number, sheet), f"{name}: {dtype} {rate / 1e12:g} TFLOP/s not in {sheet}"
    gb = hardware.memory_bandwidth / 1e9
    assert f"{gb:,g} GB/s" in sheet or f"{gb / 1000:g} TB/s" in sheet, (name, gb)


SIZED = [name for name in GPU_PRESETS if re.search(r"\d+ GB\b", cost.preset(name).description)]


def test_the_single_node_machines_name_their_memory_size():
    # (the T4's description names none: 15 GiB of its 16 GB are usable, said in the code)
    assert {"4xA100-PCIe4", "8xV100-NVLink", "8xA100-SXM-NVLink", "8xH100-SXM-NVLink"} <= set(SIZED)


def test_the_t4_holds_what_nvidia_smi_shows_of_its_16_gb_not_16_gib():
    # nvidia-smi on a T4 (public logs; Colab's among them): 15,360 MiB with ECC off, 15,079 to
    # 15,109 MiB with ECC on, of the "16 GB GDDR6" its datasheet names
    capacity = cost.preset("T4-PCIe3").memory_capacity
    assert 15_079 * 2**20 <= capacity <= 15_360 * 2**20


@pytest.mark.parametrize("name", SIZED)
def test_a_devices_memory_is_the_size_its_description_names(name):
    hardware = cost.preset(name)
    (size,) = set(re.findall(r"(\d+) GB\b", hardware.description))
    assert hardware.memory_capacity == int(size) * 2**30  # "80 GB" cards hold 80 GiB


def stated_rate(source: str) -> float | None:
    """Bytes/s a link's source states before its fraction: "100 GbE", "HDR 200 Gb/s",
    "150 GB/s", or a PCIe generation's x16 rate from the [PCIe] entry."""
    generation = re.search(r"Gen(\d) x16", source)
    if generation:
        rates = dict(re.findall(r"Gen(\d) ([\d.]+)", entry("PCIe")))
        return float(rates[generation.group(1)]) * 1e9
    found = re.search(r"([\d.]+) (GbE|Gb/s|GB/s)", source)
    if not found:
        return None
    return float(found.group(1)) * 1e9 / (1 if found.group(2) == "GB/s" else 8)


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_a_spec_link_is_its_stated_rate_times_its_stated_fraction(name):
    for field in LINKS:
        link = getattr(cost.preset(name), field)
        times = re.search(r"\bx (0\.\d+)", link.source)  # "spec x 0.8", "100 GbE x 0.5"
        halved = re.search(r" / (\d+)\b", link.source)  # "35 GB/s on PCIe 5 [...] / 2"
        if not (times or halved):
            continue  # measured outright: test_a_measured_link_holds_the_number_its_source_states
        rate = stated_rate(link.source)
        assert rate is not None, f"{name}.{field}: {link.source!r} states no rate"
        fraction = float(times.group(1)) if times else 1 / int(halved.group(1))
        assert link.bandwidth == pytest.approx(rate * fraction), (name, field)


@pytest.mark.parametrize("name", sorted(cost.presets()))
def test_every_link_waits_microseconds_not_seconds(name):
    hardware = cost.preset(name)
    for field in LINKS:
        assert 1e-6 <= getattr(hardware, field).latency <= 1e-4, (name, field)


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_a_machines_counts_are_the_ones_its_name_or_description_says(name):
    hardware = cost.preset(name)
    counted = re.match(r"(?:(\d+)x)?(\d+)x", name)  # "8xA100-...", "2x8xA100-..."
    if counted:
        nodes, per_node = int(counted.group(1) or 1), int(counted.group(2))
    else:  # "T4-PCIe3": "... as in a 4-GPU cloud VM"
        nodes, per_node = 1, int(re.search(r"(\d+)-GPU", hardware.description).group(1))
    assert (hardware.nodes, hardware.devices_per_node) == (nodes, per_node)
    # the network ports, where the description names them: "8 x 200 Gb/s per node", "one
    # 100 Gb Ethernet port each" (a port more would double what DDP gets across nodes)
    ports = re.search(r"(\d+|one) x? ?[\d.]+ Gb(?:/s| Ethernet)(?: per node| port each)",
                      hardware.description)  # fmt: skip
    if ports:
        assert hardware.nics_per_node == (1 if ports.group(1) == "one" else int(ports.group(1)))
    assert bool(ports) == (hardware.nodes > 1), name  # the machines of several nodes say it
