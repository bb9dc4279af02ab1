"""Named machines for the cost model: :func:`presets` and :func:`preset`.

The surprise first: the fastest links are the ones measured least often. Where a published
measurement exists (nccl-tests bus bandwidths posted by NVIDIA engineers and users), the
link's number *is* that measurement, cited with its conditions; elsewhere it is a spec
sheet's line rate times a fraction, and the fraction is marked *assumed*, with its reason.
Each :class:`~dpkit.cost.Link` carries that note in its ``source``. Notebook 06 prints them.

Sources, cited by key below:

- [A100] NVIDIA A100 datasheet: FP32 19.5 TFLOP/s, TF32 156, BF16/FP16 312 (dense);
  HBM2e 2,039 GB/s (80 GB SXM4), 1,935 GB/s (80 GB PCIe); NVLink 600 GB/s both ways.
- [H100] NVIDIA H100 datasheet, SXM5: FP32 67 TFLOP/s, TF32 494.7, BF16/FP16 989.5 (dense,
  half the sparsity figures); HBM3 3.35 TB/s; NVLink 900 GB/s both ways.
- [V100] NVIDIA V100 datasheet, SXM2: FP32 15.7 TFLOP/s, FP16 tensor 125; HBM2 900 GB/s;
  NVLink 300 GB/s both ways. No TF32, no BF16.
- [T4] NVIDIA T4 datasheet: FP32 8.1 TFLOP/s, FP16 tensor 65; GDDR6 320 GB/s; 16 GB.
- [PCIe] PCI-SIG: x16 Gen3 15.75 GB/s per direction, Gen4 31.5, Gen5 63 (128b/130b).
- [nccl-175] github.com/NVIDIA/nccl-tests/issues/175 (8 A100, ``-e 4G``: 232.54 GB/s) and
  [nccl-149]: ``all_reduce_perf`` bus bandwidth about 230 GB/s at large sizes.
  (nccl-tests#178's 208 GB/s is a 2-GPU run over an NVLink bridge, not 8 on NVSwitch.)
- [nccl-149] github.com/NVIDIA/nccl-tests/issues/149, S. Jeaugey (NVIDIA): 8 A100-SXM4 on
  NVSwitch "should reach 230 GB/s" at 8 GiB; an NVLink's "line rate of 25GB/s" gives
  "~20GB/s effective" (0.8).
- [nccl-212] github.com/NVIDIA/nccl-tests/issues/212, S. Jeaugey (NVIDIA): 8 H100, about
  370 GB/s with the ring, about 480 GB/s with NVLink SHARP (NVLS, NCCL's default there).
- [nccl-119] github.com/NVIDIA/nccl-tests/issues/119: 3 nodes of 8 A100, 4 HDR ports each
  (4 x 200 Gb/s = 100 GB/s per node): bus bandwidth about 96 GB/s at the largest sizes;
  S. Jeaugey there: "24GB/s is the peak performance per 200G NIC" (96 % of line rate).
- [nccl-1639] github.com/NVIDIA/nccl/issues/1639: RTX 5090s on PCIe 5 without NVLink, 28
  GB/s bus bandwidth on 8 GPUs, 35 on 4 (posted by a user); S. Jeaugey: there it "is
  usually determined by the bandwidth your CPU and memory can deliver".
- [nccl-398] github.com/NVIDIA/nccl/issues/398: 2 AWS p3dn nodes (8 V100 each), 100 Gb/s
  over TCP sockets: about 6 GB/s bus bandwidth (48 % of line rate).
- [nccl-384] github.com/NVIDIA/nccl/issues/384: 2 GPUs on PCIe Gen3 x16, peer to peer off
  (NCCL_P2P_DISABLE=1: NCCL's SHM transport, through host memory), one channel:
  "Allreduce: 3.9GB/s" (posted by a user; broadcast, one way, 10.3). S. Jeaugey (NVIDIA):
  "Some components (in particular some CPUs) do not handle bidirectional traffic well".
- [nccl-src] NCCL's topology model, src/graph/topo.h (github.com/NVIDIA/nccl): per NVLink,
  one way, 20.0 GB/s on V100 and A100 (``SM70_NVLINK_BW``, ``SM80_NVLINK_BW``), 20.6 on H100
  (``SM90_NVLINK_BW``). Times the links: V100's 6 give 120 GB/s (the V100 preset's 150 x
  0.8), A100's 12 give 240 ([nccl-149]: "limits it to ~230"), H100's 18 give 371 (370).
- [DGX] NVIDIA DGX A100 / H100 user guides: eight compute ports per node, one per GPU
  (HDR 200 Gb/s on DGX A100, NDR 400 Gb/s on DGX H100).
- [ddp-bench] pytorch/pytorch benchmarks/distributed/ddp/README.md: DGX-1 nodes with 4 x
  100 Gb/s InfiniBand.
- [eth] IEEE 802.3 line rates (10 GbE 1.25 GB/s, 100 GbE 12.5 GB/s).
- [dle-rnx101] NVIDIA DeepLearningExamples, ResNeXt-101 32x4d for PyTorch (pytorch-21.03),
  one GPU's training throughput: A100 80GB TF32 456 img/s, AMP 1211; V100 16GB FP32 147,
  AMP 587. ``benchmarks/tensor_core_efficiency.py`` finds the fraction of each unit's peak
  at which this model predicts them: A100 TF32 0.33, FP16 0.60; V100 FP32 0.94, FP16 0.69
  (``benchmarks/results/tensor_core_efficiency.json``). A convolutional network's fractions:
  a transformer's large matmuls reach more. ResNet-50's published rows check them.

Host overheads on GPU machines are PyTorch eager mode's, not on any spec sheet: *assumed*
(a few microseconds of Python and dispatch per op, about 5 us per CUDA launch, 0.1 ms to
start a Python thread). They matter only where the model is tiny. Large cuBLAS/cuDNN
kernels reach 70-90 % of their units' peak, a real model's smaller layers less: 0.7 of the
matmul peak, 0.8 of HBM's (which streams at 80-90 %), *assumed* where [dle-rnx101] has not
measured a unit (tensor cores reach less of theirs).
"""

from dataclasses import replace

from dpkit.cost.hardware import Hardware, Link

GB, GIB, TFLOPS, US = 1e9, 1 << 30, 1e12, 1e-6


def _tflops(**peaks: float) -> dict[str, float]:
    return {dtype: peak * TFLOPS for dtype, peak in peaks.items()}


_PCIE3, _PCIE4, _PCIE5 = (Link(rate * GB * 0.8, 10 * US, f"[PCIe] Gen{generation} x16 spec x "
                               "0.8, assumed (pinned cudaMemcpy reaches about 80 % of PCIe)")
                          for generation, rate in ((3, 15.75), (4, 31.5), (5, 63.0)))  # fmt: skip
_A100_PEAKS = _tflops(float32=19.5, tfloat32=156, bfloat16=312, float16=312)  # [A100]
# [dle-rnx101]: ResNeXt-101 on one A100 (bfloat16 runs on float16's units: assumed the same)
_A100_TENSOR_CORES = {"tfloat32": 0.33, "float16": 0.60, "bfloat16": 0.60}


def _gpu(name: str, description: str, source: str, **numbers: object) -> Hardware:
    """A GPU machine: the defaults below (assumed, see this module's docstring) but ``numbers``."""
    defaults = dict(
        name=name, description=description, source=source, op_overhead=10 * US,
        backward_op_overhead=6 * US, gil_handoff=3 * US, thread_start=100 * US,
        module_overhead=10 * US, copy_overhead=10 * US, step_overhead=150 * US,
        matmul_efficiency=0.7, memory_efficiency=0.8, nodes=1, peer_to_peer=True,
        compute_units=numbers["devices_per_node"], virtual_lanes=False,
    )  # fmt: skip
    return Hardware(**{**defaults, **numbers})  # type: ignore[arg-type]


def this_machine_default() -> Hardware:
    """The documented default of virtual CPU lanes, one torch thread each, which ``dpkit
    predict --hardware this-machine`` uses without ``--calibrate``: a roofline, no op curves.

    Its numbers are an earlier ``calibrate()``'s where dpkit is developed, rounded: effective
    rates (60 GFLOP/s where a matmul now measures about 100 there; 8 GB/s, a lane copy of the
    steps' chunks) and host terms that today's ``calibrate()``, which fits them together with
    op curves, no longer gives (``gil_handoff`` 17-26 us there, not 4). Checked against
    measured steps by ``benchmarks/this_machine_preset.py``: median step error 17 % on the
    course models, 39 % on held-out ones, where a fresh calibration gives 9 % and 10 %
    (``benchmarks/results/this_machine_preset.json``). Calibrate for your own machine."""
    memory = Link(8 * GB, 2 * US, "an earlier calibrate(): a clone between lanes, one memory")
    return Hardware(
        name="this-machine", device_name="CPU lane",
        description="virtual CPU lanes on 2 cores, one torch thread each (documented default; "
        "`dpkit predict --hardware this-machine --calibrate` measures yours)",
        source="an earlier calibrate() on a 2-core AVX-512 Xeon VM with torch 2.13, rounded; "
        "checked there against measured steps: median error 17 % on the course models, 39 % "
        "on others (9-10 % once calibrated; benchmarks/this_machine_preset.py)",
        # effective rates, reached in full: a roofline without op curves
        peak_flops={"float32": 60e9}, matmul_efficiency=1.0,
        memory_bandwidth=8 * GB, memory_efficiency=1.0, compute_units=1.8,
        memory_capacity=16 * GIB,  # host memory, which the lanes share
        host_to_device=memory, device_to_device=memory, node_to_node=memory,
        devices_per_node=64,  # lanes are virtual: any number share one machine
        nodes=1, nics_per_node=1, peer_to_peer=True, virtual_lanes=True,
        op_overhead=6 * US, backward_op_overhead=4 * US, gil_handoff=4 * US, thread_start=120 * US,
        module_overhead=8 * US, copy_overhead=6 * US, step_overhead=1100 * US,
    )  # fmt: skip


def presets() -> dict[str, Hardware]:
    """Every named machine, by name: this machine's documented default first, then GPU boxes
    from one T4 to two nodes of eight A100. Numbers and sources: this module's docstring."""
    # Without peer to peer, NCCL's collectives go through host memory (SHM), measured
    # [nccl-384]; DataParallel's copies take host_to_device down and up (device_link: 6.3 GB/s)
    t4 = _gpu(
        "T4-PCIe3",
        "NVIDIA T4s on PCIe 3 without peer to peer, copies through host memory "
        "(a Colab T4; several as in a 4-GPU cloud VM)",
        "spec sheet [T4], PCIe [PCIe]",
        device_name="T4", devices_per_node=4, nics_per_node=1, peer_to_peer=False,
        peak_flops=_tflops(float32=8.1, float16=65),  # [T4]
        memory_bandwidth=320 * GB, memory_capacity=15 * GIB,  # 16 GB GDDR6, 15,360 MiB usable
        host_to_device=_PCIE3,
        device_to_device=Link(3.9 * GB, 10 * US, "measured: NCCL through host memory, PCIe 3 "
                              "[nccl-384]"),
        node_to_node=Link(6.25 * GB * 0.5, 30 * US, "50 Gb/s port x 0.5, as [nccl-398]"),
    )  # fmt: skip
    a100_pcie = _gpu(
        "4xA100-PCIe4",
        "4 A100 80 GB PCIe on PCIe 4 without NVLink bridges, peer to peer through the CPU",
        "spec sheet [A100], PCIe [PCIe], NCCL on PCIe [nccl-1639]",
        device_name="A100 PCIe", devices_per_node=4, nics_per_node=1,
        peak_flops=_A100_PEAKS,  # [A100]: the PCIe card has the same peaks
        tensor_core_efficiency=_A100_TENSOR_CORES,
        memory_bandwidth=1935 * GB, memory_capacity=80 * GIB, host_to_device=_PCIE4,
        # [nccl-1639] measured 35 GB/s on 4 GPUs of PCIe 5; for PCIe 4, half: assumed
        device_to_device=Link(17.5 * GB, 5 * US, "35 GB/s on PCIe 5 [nccl-1639] / 2, assumed"),
        node_to_node=Link(12.5 * GB * 0.5, 25 * US, "[eth] 100 GbE x 0.5, as [nccl-398]"),
    )  # fmt: skip
    v100 = _gpu(
        "8xV100-NVLink",
        "one DGX-1 node: 8 V100 SXM2 32 GB on NVLink 2 (hybrid cube mesh)",
        "spec sheet [V100], network [ddp-bench]",
        device_name="V100", devices_per_node=8, nics_per_node=4,
        peak_flops=_tflops(float32=15.7, float16=125),  # [V100]
        matmul_efficiency=0.94,  # [dle-rnx101]: ResNeXt-101 on one V100, FP32
        tensor_core_efficiency={"float16": 0.69},  # [dle-rnx101], AMP
        memory_bandwidth=900 * GB, memory_capacity=32 * GIB, host_to_device=_PCIE3,
        # no DGX-1 all-reduce measurement found: the 0.8 of [nccl-149] and [nccl-src], assumed
        device_to_device=Link(150 * GB * 0.8, 2 * US, "[V100] 150 GB/s x 0.8 [nccl-149], assumed"),
        node_to_node=Link(12.5 * GB * 0.9, 5 * US, "[ddp-bench] EDR 100 Gb/s x 0.9, assumed"),
    )  # fmt: skip
    a100 = _gpu(
        "8xA100-SXM-NVLink",
        "one DGX/HGX A100 node: 8 A100 SXM4 80 GB on NVLink 3 through NVSwitch",
        "spec sheet [A100], nccl-tests bus bandwidth [nccl-175]",
        device_name="A100", devices_per_node=8, nics_per_node=8,
        peak_flops=_A100_PEAKS, tensor_core_efficiency=_A100_TENSOR_CORES, host_to_device=_PCIE4,
        memory_bandwidth=2039 * GB, memory_capacity=80 * GIB,  # [A100] 80 GB SXM4: 81,920 MiB
        # ~2 us per ring step: assumed
        device_to_device=Link(230 * GB, 2 * US, "measured: nccl-tests, 8 A100 [nccl-175]"),
        node_to_node=Link(25 * GB * 0.96, 5 * US, "[DGX] HDR 200 Gb/s x 0.96, measured [nccl-119]"),
    )  # fmt: skip
    h100 = _gpu(
        "8xH100-SXM-NVLink",
        "one DGX/HGX H100 node: 8 H100 SXM5 80 GB on NVLink 4 through NVSwitch",
        "spec sheet [H100], nccl-tests bus bandwidth [nccl-212]",
        device_name="H100", devices_per_node=8, nics_per_node=8,
        peak_flops=_tflops(float32=67, tfloat32=494.7, bfloat16=989.5, float16=989.5),
        tensor_core_efficiency=_A100_TENSOR_CORES,  # A100's [dle-rnx101]: assumed
        memory_bandwidth=3350 * GB, memory_capacity=80 * GIB, host_to_device=_PCIE5,
        device_to_device=Link(370 * GB, 2 * US, "measured: ring, 8 H100 [nccl-212]"),
        # NVLS's algorithm bandwidth: "~480 GB/s busbw, ~275 algbw" on 8 GPUs [nccl-212]
        allreduce_bandwidth=275 * GB,
        node_to_node=Link(50 * GB * 0.96, 5 * US, "[DGX] NDR 400 Gb/s x 0.96, as [nccl-119]"),
    )  # fmt: skip
    ethernet = "2 nodes of 8 A100 (NVLink inside) over one {} Gb Ethernet port each"
    changed = ("name", "description", "source", "nics_per_node", "node_to_node")  # a100's, per row
    across = [replace(a100, nodes=2, **dict(zip(changed, values))) for values in [
        ("2x8xA100-IB-HDR",
         "2 DGX A100 nodes (16 A100) over InfiniBand HDR, 8 x 200 Gb/s per node",
         "spec sheets [A100] [DGX], nccl-tests [nccl-175] [nccl-119]", 8, a100.node_to_node),
        ("2x8xA100-100GbE", ethernet.format(100), "spec sheets [A100], Ethernet [eth]", 1,
         Link(12.5 * GB * 0.5, 25 * US, "[eth] 100 GbE x 0.5, as measured [nccl-398]")),
        ("2x8xA100-10GbE", ethernet.format(10), "spec sheets [A100], Ethernet [eth]", 1,
         Link(1.25 * GB * 0.5, 50 * US, "[eth] 10 GbE x 0.5, as [nccl-398]")),
    ]]  # fmt: skip
    return {h.name: h for h in [this_machine_default(), t4, a100_pcie, v100, a100, h100, *across]}


def preset(name: str) -> Hardware:
    """The preset called ``name`` (case-insensitive), or a ValueError listing them."""
    chosen = {key.lower(): value for key, value in presets().items()}.get(name.lower())
    if chosen is None:
        raise ValueError(
            f"hardware={name!r} is not a preset; choose one of: {', '.join(presets())} "
            "(dpkit predict --list describes them)"
        )
    return chosen
