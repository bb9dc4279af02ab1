"""Named machines for the cost model: :func:`presets` and :func:`preset`.

The surprise first: the fastest links are the ones measured least often, so most numbers
here are spec-sheet peaks times a fraction, and the fraction is an assumption, said next to
it with its reason. Where a published measurement exists (nccl-tests bus bandwidths posted by
NVIDIA engineers and users, PyTorch's own DDP benchmark), the achieved number is taken from
it instead. ``benchmarks/cost_accuracy.py`` compares predictions with a few of them.

Sources, cited by key in the comments below:

- [A100] NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4):
  FP32 19.5 TFLOP/s, TF32 156, BF16/FP16 312 (dense); HBM2e 2,039 GB/s (80 GB SXM),
  1,935 GB/s (80 GB PCIe); NVLink 600 GB/s (both directions, so 300 GB/s each way);
  PCIe Gen4 64 GB/s (both directions).
- [H100] NVIDIA H100 Tensor Core GPU datasheet: SXM5 FP32 67 TFLOP/s, TF32 494.7, BF16
  989.5 (dense; twice that with sparsity); HBM3 3.35 TB/s; NVLink 900 GB/s (both
  directions); PCIe Gen5 128 GB/s (both directions).
- [V100] NVIDIA Tesla V100 datasheet: SXM2 FP32 15.7 TFLOP/s, tensor (FP16) 125; HBM2 900
  GB/s; NVLink 300 GB/s (both directions); PCIe Gen3.
- [T4] NVIDIA T4 datasheet: FP32 8.1 TFLOP/s, FP16 (tensor, mixed precision) 65; GDDR6 320
  GB/s; PCIe Gen3 x16.
- [PCIe] PCI-SIG: x16 Gen3 8 GT/s with 128b/130b coding = 15.75 GB/s per direction, Gen4
  31.5 GB/s, Gen5 63 GB/s. Pinned cudaMemcpy typically reaches about 80% of that (packet
  headers), which is the fraction assumed for host copies.
- [nccl-212] github.com/NVIDIA/nccl-tests/issues/212, S. Jeaugey (NVIDIA): NVLink4's 450
  GB/s per direction is the line rate; "with the protocol overhead (~20%) NCCL can get an
  effective NVLink bandwidth of 370GB/s" (ring bus bandwidth on 8 H100).
- [nccl-149] github.com/NVIDIA/nccl-tests/issues/149 and [nccl-178] .../issues/178: 8
  A100-SXM4-80GB on NVLink/NVSwitch, all_reduce_perf bus bandwidth about 200 and 208 GB/s.
- [nccl-119] github.com/NVIDIA/nccl-tests/issues/119: 3 nodes of 8 A100 SXM4 with 4 HDR
  InfiniBand ports each: bus bandwidth 84.8 GB/s on average, about 96 GB/s at the largest
  sizes, against 100 GB/s theoretical (4 x 200 Gb/s / 8 GPUs): 85-96% of line rate.
- [nccl-1639] github.com/NVIDIA/nccl/issues/1639, S. Jeaugey: on PCIe systems without NVLink
  "the performance you get is usually determined by the bandwidth your CPU and memory can
  deliver" (8 GPUs on PCIe 5: 28 GB/s bus bandwidth, 4 GPUs: 35 GB/s).
- [ddp-bench] pytorch/pytorch benchmarks/distributed/ddp/README.md: DGX-1 (8 V100, NVLink
  hybrid cube mesh) machines with "4x 100Gb InfiniBand per machine".
- [DGX] NVIDIA DGX A100 and DGX H100 user guides: eight compute network ports per node,
  one per GPU (ConnectX-6 HDR 200 Gb/s on DGX A100, ConnectX-7 NDR 400 Gb/s on DGX H100).
- [eth] IEEE 802.3: 10 GbE is 1.25 GB/s, 100 GbE 12.5 GB/s of line rate; TCP over a tuned
  link delivers about 90% of it (iperf's usual 9.4 Gb/s on 10 GbE), less through NCCL's
  socket transport, so 70% is assumed for 100 GbE and 90% for 10 GbE.

Host overheads on GPU machines (per op, per copy, per thread) are not on any spec sheet:
they are PyTorch's eager-mode costs, assumed from this machine's calibration (a Python
thread starts in about 0.1 ms, an op costs a few microseconds of Python and dispatch) plus
a CUDA launch (about 5 us, as NVIDIA's CUDA Graphs posts quote). They matter only where
the model is tiny; for every real layer the device's work hides them.
"""

from __future__ import annotations

from dataclasses import replace

from dpkit.cost.hardware import Hardware, Link

GB = 1e9
TFLOPS = 1e12
US = 1e-6

# Host overheads of PyTorch eager mode driving GPUs (see the module docstring).
_GPU_HOST = dict(
    launch_overhead=10 * US,
    autograd_overhead=6 * US,
    gil_contention=3 * US,
    thread_start=100 * US,
    replica_overhead=10 * US,
    copy_overhead=10 * US,
    event_overhead=5 * US,
    step_overhead=150 * US,  # the loss, autograd's start and end, DataParallel's checks
    dp_overhead=100 * US,
    graph_overhead=1 * US,
    asynchronous=True,
    serial_backward=False,
    funnel_through_device0=True,  # dpkit's copies run on one stream, through device 0's link
)
# Large cuBLAS GEMMs reach 70-90% of peak, the small and oddly shaped layers of real
# models less: 0.6 is assumed for matmul-like work. HBM streams at 80-90% of its peak
# (NVIDIA quotes 95% DRAM utilisation efficiency for A100's HBM2e): 0.85 is assumed.
_GPU_EFFICIENCY = dict(compute_efficiency=0.6, memory_efficiency=0.85)

_PCIE3 = Link(15.75 * GB * 0.8, 10 * US)  # [PCIe] Gen3 x16, 80% reached; ~10 us per cudaMemcpy
_PCIE4 = Link(31.5 * GB * 0.8, 10 * US)  # [PCIe] Gen4 x16
_PCIE5 = Link(63.0 * GB * 0.8, 10 * US)  # [PCIe] Gen5 x16

_A100_SXM = dict(
    device_name="A100",
    # [A100]; float32 is the CUDA-core rate: torch leaves TF32 off for matmuls by default.
    peak_flops={
        "float32": 19.5 * TFLOPS,
        "tfloat32": 156 * TFLOPS,
        "bfloat16": 312 * TFLOPS,
        "float16": 312 * TFLOPS,
    },  # fmt: skip
    memory_bandwidth=2039 * GB,  # [A100] 80 GB SXM4
    host_to_device=_PCIE4,
    # [nccl-149], [nccl-178]: ~200 GB/s bus bandwidth measured on 8 GPUs (2/3 of the
    # 300 GB/s per direction); 2 us per ring step (nccl-tests' small all-reduces take
    # ~25 us on 8 GPUs, 14 steps).
    device_to_device=Link(200 * GB, 2 * US),
    # [DGX] one HDR 200 Gb/s port per GPU; [nccl-119]: 85-96% of line rate reached, 90%
    # assumed; ~5 us per message across an InfiniBand switch with NCCL's protocol.
    node_to_node=Link(25 * GB * 0.9, 5 * US),
    devices_per_node=8,
    nics_per_node=8,
    peer_to_peer=True,
    compute_units=8,
)


def _gpu(name: str, description: str, source: str, **numbers: object) -> Hardware:
    return Hardware(
        name=name, description=description, source=source, **_GPU_HOST, **_GPU_EFFICIENCY,
        **numbers,
    )  # fmt: skip


def _presets() -> list[Hardware]:
    a100 = _gpu(
        "8xA100-SXM-NVLink",
        "one DGX/HGX A100 node: 8 A100 SXM4 80 GB on NVLink 3 through NVSwitch",
        "spec sheets [A100], nccl-tests bus bandwidth [nccl-149]",
        nodes=1,
        **_A100_SXM,
    )
    return [
        this_machine_default(),
        _gpu(
            "T4-PCIe3",
            "NVIDIA T4s on PCIe 3 without NVLink, copies staged through host memory "
            "(a Colab T4; several as in a 4-GPU cloud VM)",
            "spec sheet [T4], PCIe [PCIe]",
            device_name="T4",
            peak_flops={"float32": 8.1 * TFLOPS, "float16": 65 * TFLOPS},  # [T4]
            memory_bandwidth=320 * GB,  # [T4] GDDR6
            host_to_device=_PCIE3,
            # Cloud VMs usually disable PCIe peer-to-peer, so device copies go through host
            # memory (peer_to_peer=False: down and up over PCIe 3); this link is unused then.
            device_to_device=Link(15.75 * GB * 0.8, 10 * US),
            # One network port per VM (50 Gb/s on a 4-GPU g4dn.12xlarge); 70% over TCP [eth].
            node_to_node=Link(6.25 * GB * 0.7, 30 * US),
            devices_per_node=4,
            nodes=1,
            nics_per_node=1,
            peer_to_peer=False,
            compute_units=4,
        ),
        _gpu(
            "4xA100-PCIe4",
            "4 A100 80 GB PCIe on PCIe 4 without NVLink bridges, peer to peer through the CPU",
            "spec sheet [A100], PCIe [PCIe], NCCL on PCIe [nccl-1639]",
            device_name="A100 PCIe",
            peak_flops=_A100_SXM["peak_flops"],  # [A100]: the PCIe card has the same peaks
            memory_bandwidth=1935 * GB,  # [A100] 80 GB PCIe
            host_to_device=_PCIE4,
            # [nccl-1639]: bus bandwidth over PCIe is bounded by the CPU's root complex and
            # memory (35 GB/s on 4 GPUs of PCIe 5); for PCIe 4, 2/3 of the 31.5 GB/s line rate
            # is assumed.
            device_to_device=Link(21 * GB, 5 * US),
            node_to_node=Link(12.5 * GB * 0.7, 25 * US),  # one 100 GbE port, 70% [eth]
            devices_per_node=4,
            nodes=1,
            nics_per_node=1,
            peer_to_peer=True,
            compute_units=4,
        ),
        _gpu(
            "8xV100-NVLink",
            "one DGX-1 node: 8 V100 SXM2 on NVLink 2 (hybrid cube mesh)",
            "spec sheet [V100], NCCL protocol overhead [nccl-212], network [ddp-bench]",
            device_name="V100",
            peak_flops={"float32": 15.7 * TFLOPS, "float16": 125 * TFLOPS},  # [V100]
            memory_bandwidth=900 * GB,  # [V100]
            host_to_device=_PCIE3,
            # [V100] 300 GB/s both ways = 150 GB/s per direction; ~20% protocol overhead
            # [nccl-212] leaves 120 GB/s of ring bus bandwidth.
            device_to_device=Link(150 * GB * 0.8, 2 * US),
            # [ddp-bench] 4 x 100 Gb/s InfiniBand EDR per machine; 90% reached [nccl-119].
            node_to_node=Link(12.5 * GB * 0.9, 5 * US),
            devices_per_node=8,
            nodes=1,
            nics_per_node=4,
            peer_to_peer=True,
            compute_units=8,
        ),
        a100,
        _gpu(
            "8xH100-SXM-NVLink",
            "one DGX/HGX H100 node: 8 H100 SXM5 on NVLink 4 through NVSwitch",
            "spec sheet [H100], nccl-tests bus bandwidth [nccl-212]",
            device_name="H100",
            peak_flops={
                "float32": 67 * TFLOPS,
                "tfloat32": 494.7 * TFLOPS,
                "bfloat16": 989.5 * TFLOPS,
                "float16": 989.5 * TFLOPS,
            },  # fmt: skip
            memory_bandwidth=3350 * GB,  # [H100] HBM3
            host_to_device=_PCIE5,
            # [nccl-212]: 370 GB/s effective NVLink bandwidth with NCCL's ring (line 450).
            device_to_device=Link(370 * GB, 2 * US),
            node_to_node=Link(50 * GB * 0.9, 5 * US),  # [DGX] one NDR 400 Gb/s port per GPU
            devices_per_node=8,
            nodes=1,
            nics_per_node=8,
            peer_to_peer=True,
            compute_units=8,
        ),
        replace(
            a100,
            name="2x8xA100-IB-HDR",
            description="2 DGX A100 nodes (16 A100) over InfiniBand HDR, 8 x 200 Gb/s per node",
            source="spec sheets [A100] [DGX], nccl-tests [nccl-149] [nccl-119]",
            nodes=2,
        ),
        replace(
            a100,
            name="2x8xA100-100GbE",
            description="2 nodes of 8 A100 (NVLink inside) over one 100 Gb Ethernet port each",
            source="spec sheets [A100], Ethernet [eth]",
            nodes=2,
            nics_per_node=1,
            node_to_node=Link(12.5 * GB * 0.7, 25 * US),  # [eth] 70% through NCCL's sockets
        ),
        replace(
            a100,
            name="2x8xA100-10GbE",
            description="2 nodes of 8 A100 (NVLink inside) over one 10 Gb Ethernet port each",
            source="spec sheets [A100], Ethernet [eth]",
            nodes=2,
            nics_per_node=1,
            node_to_node=Link(1.25 * GB * 0.9, 50 * US),  # [eth] 90%, TCP's usual 9.4 Gb/s
        ),
    ]


def this_machine_default() -> Hardware:
    """Virtual CPU lanes on a 2-core x86 machine with one torch thread per lane: the numbers
    :func:`dpkit.cost.calibrate` measured on the machine dpkit is developed on (a 2-core
    AVX-512 Xeon VM, torch 2.13), rounded. Use ``calibrate()`` for your own machine."""
    memory = Link(8 * GB, 2 * US)  # a clone between lanes: a memcpy in one memory
    return Hardware(
        name="this-machine",
        description="virtual CPU lanes on 2 cores, one torch thread each (documented default; "
        "`dpkit predict --hardware this-machine --calibrate` measures yours)",
        device_name="CPU lane",
        source="calibrate() on a 2-core AVX-512 Xeon VM with torch 2.13, rounded",
        peak_flops={"float32": 60e9},
        compute_efficiency=1.0,  # calibrated: the peak is the FLOP/s measured, so all of it
        memory_bandwidth=8 * GB,
        memory_efficiency=1.0,
        compute_units=1.8,
        host_to_device=memory,
        device_to_device=memory,
        node_to_node=memory,
        devices_per_node=64,  # lanes are virtual: any number share one machine
        nodes=1,
        nics_per_node=1,
        peer_to_peer=True,
        funnel_through_device0=True,
        asynchronous=False,
        serial_backward=True,
        launch_overhead=6 * US,
        autograd_overhead=4 * US,
        gil_contention=4 * US,
        thread_start=120 * US,
        replica_overhead=8 * US,
        copy_overhead=6 * US,
        event_overhead=4 * US,
        step_overhead=600 * US,
        dp_overhead=500 * US,
        graph_overhead=10 * US,
    )


def presets() -> dict[str, Hardware]:
    """Every named machine, by name: this machine's documented default first, then GPU boxes
    from one T4 to two nodes of eight A100. Numbers and sources: this module's docstring."""
    return {hardware.name: hardware for hardware in _presets()}


def preset(name: str) -> Hardware:
    """The preset called ``name`` (case-insensitive), or a ValueError listing them."""
    chosen = {key.lower(): value for key, value in presets().items()}.get(name.lower())
    if chosen is None:
        raise ValueError(
            f"hardware={name!r} is not a preset; choose one of: {', '.join(presets())} "
            "(dpkit predict --list describes them)"
        )
    return chosen
