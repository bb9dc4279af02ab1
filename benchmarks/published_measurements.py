"""Published measurements of GPU data-parallel training, for judging ``dpkit.cost``.

Each row is one number somebody measured (or, marked so in ``note``, stated as the expected
measurement) on real hardware and published, with its conditions in machine-readable form,
the source, its address and a short verbatim quote of the number. None of them was used to
set a preset in ``dpkit/cost/catalog.py`` except where ``note`` says so, so they can check
it. The rows were chosen thus:

- only primary sources: NVIDIA's own READMEs and engineers' answers, PyTorch's DDP
  benchmark, the measurement's author posting the log (nccl-tests and NCCL issues), the
  Hugging Face docs whose author ran the benchmark;
- the number and its conditions quoted from the stored text of the page; a number that
  showed only in an image, an attachment or a log that could not be read is left out;
- the conditions as stated; what a source leaves unstated is ``None`` or said in ``note``
  (nccl-tests prints out-of-place and in-place columns: ``op_mode`` says which one;
  ``bytes`` is one message size, a ``[smallest, largest]`` sweep whose best is quoted, or
  ``None``);
- ratios (mixed precision over TF32/FP32, 8 GPUs over 1, DP over DDP, without NVLink over
  with) are what the cost model is judged on, as they cancel most of what a model of one
  machine gets wrong: where the source prints the ratio it is a row of its own, otherwise
  both raw rows are here and the ratio is left to the reader.

Copy bandwidths (``copy_bandwidth``) are CUDA's ``p2pBandwidthLatencyTest`` matrices or a
vendor's own copy benchmark: one GPU's bytes to another per second, one way unless ``what``
says both ways (the two directions at once, summed).

Bus bandwidth (busbw) is nccl-tests' number: algbw x 2(n-1)/n for all-reduce, algbw for
broadcast and reduce, in GB/s (1e9 bytes/s). With NVLink SHARP (NVLS) the all-reduce busbw
is the ring-equivalent bandwidth, not the bandwidth on any wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = (
    "allreduce_busbw", "broadcast_busbw", "reduce_busbw", "copy_bandwidth", "throughput",
    "speedup", "ratio",
)  # fmt: skip


@dataclass(frozen=True)
class Measurement:
    key: str
    what: str
    kind: str
    value: float
    unit: str
    conditions: dict = field(hash=False)
    source: str
    url: str
    quote: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.key}: kind {self.kind!r} is not one of {KINDS}")


GiB = 1 << 30

# Sources, each used by several rows.
_NCCL_TESTS = "https://github.com/NVIDIA/nccl-tests/issues/"
_NCCL = "https://github.com/NVIDIA/nccl/issues/"
_CUDA_SAMPLES = "https://github.com/NVIDIA/cuda-samples/issues/"
# Two RTX 2080 Ti (TU102) without peer to peer: nccl-tests and CUDA samples' raw output,
# posted by the user who ran them on a rented server (AutoDL), pinned to the commit read.
_TU102_NO_P2P = (
    "https://github.com/Anthony-Hoo/Anthony-Hoo.github.io/blob/"
    "37e805e8e56f839f6557756d76503d45af6ab47e/posts/AutoDL_Multi-GPU_Interconnection_Test.md"
)
_TU102_NO_P2P_MACHINE = (
    "2 GeForce RTX 2080 Ti 11 GB (TU102, the TITAN RTX's die) on one PCIe Gen3 x16 switch "
    "('nvidia-smi topo -m': PIX; 'topo -p2p': NS, so NCCL goes through host memory), one "
    "NUMA node, CUDA 12.4, driver 550.90.07, in a container; NCCL version not printed; "
    "cuda-samples bandwidthTest on the same machine: pinned host to device 12.2 GB/s, "
    "device to host 13.2 GB/s"
)
_DEEPEP = "https://github.com/deepseek-ai/DeepEP/issues/"
_DLE_RN50 = (
    "https://github.com/NVIDIA/DeepLearningExamples/blob/"
    "291f0d02e815b148fa5c2b81bf07aa3552142895/"
    "PyTorch/Classification/ConvNets/resnet50v1.5/README.md"
)
_DLE_RNX101 = (
    "https://github.com/NVIDIA/DeepLearningExamples/blob/"
    "48dc9adacd401a3f414400bee061dc9e0fc86b3f/"
    "PyTorch/Classification/ConvNets/resnext101-32x4d/README.md"
)
_DLE_NOTE = (
    "NGC pytorch-21.03 container, DALI data loading, ImageNet 224x224, NHWC for AMP; batch "
    "per GPU from PyTorch/Classification/ConvNets/configs.yml (benchmark_training mode)"
)
_DDP_BENCH = (
    "https://github.com/pytorch/pytorch/blob/bf69c149b872e3c19ad493406a6d67ce3e97d716/"
    "benchmarks/distributed/ddp/README.md"
)
_DDP_COND = dict(
    gpu="V100-SXM2 (DGX-1)", interconnect="NVLink hybrid cube mesh; 4x 100Gb IB per machine",
    precision="fp32", batch_per_gpu=32, image=[3, 224, 224], framework="PyTorch 1.4.0a0",
    backend="nccl", bucket_cap_mb=25, statistic="p50",
)  # fmt: skip
_HF = (
    "https://github.com/huggingface/transformers/blob/032b32abfb07ba36e8fc1a8e5251514523edce34/"
    "docs/source/en/perf_train_gpu_many.md"
)
_HF_COND = dict(
    model="gpt2", gpu="TITAN RTX 24GB", gpus=2, nodes=1, precision="fp32", batch_per_gpu=4,
    seq_len=1024, steps=200, framework="pytorch-1.8-to-be, cuda-11.0, transformers 4.3.0.dev0",
    script="examples/pytorch/language-modeling/run_clm.py (wikitext-2-raw-v1)",
)  # fmt: skip
_HF_NOTE = (
    "Trainer's 'train_samples_per_second' is 200 steps / train_runtime here, i.e. steps/s "
    "(200 / 101.9003 = 1.963); seq_len is run_clm's default block size for gpt2 (1024), not "
    "stated on the page; fp32 because no --fp16 flag is passed."
)

MEASUREMENTS: list[Measurement] = [
    # --- all-reduce on one NVLink/NVSwitch node --------------------------------------------
    Measurement(
        key="a100_8gpu_nvswitch_allreduce_nvidia_expected",
        what="8 A100 SXM4 80GB all-reduce bus bandwidth at 8 GiB, as NVIDIA says it should be",
        kind="allreduce_busbw",
        value=230.0,
        unit="GB/s",
        conditions=dict(
            gpu="A100-SXM4-80GB",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch",
            bytes=8 * GiB,
            algorithm=None,
            op_mode=None,
            nccl="2.18.1",
        ),
        source="NVIDIA/nccl-tests#149, S. Jeaugey (NVIDIA)",
        url=_NCCL_TESTS + "149",
        quote="The total effective bandwidth should therefore be 240GB/s on A100, but some "
        "other bottlenecks on the GPUs limits it to ~230GB/s. [...] replace `1G` by `8G`. "
        "That should reach 230 GB/s.",
        note="A statement of the expected peak by NCCL's lead, answering a user whose run "
        "stopped at 1 GiB ('At 512M the bandwidth is still increasing'); 12 NVLinks x 25 GB/s "
        "line rate, ~20 GB/s effective each with 128 B payloads.",
    ),
    Measurement(
        key="a100_8gpu_nvswitch_allreduce_1gib",
        what="8 A100 SXM4 80GB (HPE Apollo 6500) all-reduce bus bandwidth, sizes up to 1 GiB",
        kind="allreduce_busbw",
        value=200.0,
        unit="GB/s",
        conditions=dict(
            gpu="A100-SXM4-80GB",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch",
            bytes=1 * GiB,
            algorithm=None,
            op_mode=None,
            nccl="2.18.1",
            command="all_reduce_perf -b 8 -e 1G -f 4 -g 1 -t 8",
        ),
        source="NVIDIA/nccl-tests#149 (user's run)",
        url=_NCCL_TESTS + "149",
        quote="the nccl tests show a busbw of ~200 GB/s",
        note="Approximate ('~200'); below peak because 1 GiB is too small (see "
        "a100_8gpu_nvswitch_allreduce_nvidia_expected). The preset's A100 device link "
        "(200 GB/s) is this number.",
    ),
    Measurement(
        key="a100_8gpu_allreduce_4gib",
        what="8 A100 (one node of 2x8 with 4x 200Gb IB) all-reduce bus bandwidth, -e 4G",
        kind="allreduce_busbw",
        value=232.54,
        unit="GB/s",
        conditions=dict(
            gpu="A100",
            gpus=8,
            nodes=1,
            interconnect="NVLink (8-GPU A100 board)",
            bytes=4 * GiB,
            algorithm=None,
            op_mode=None,
            command="all_reduce_perf -b 8 -e 4G -f 2 -g 8",
        ),
        source="NVIDIA/nccl-tests#175 (user's run)",
        url=_NCCL_TESTS + "175",
        quote="singleNode, ./build/all_reduce_perf -b 8 -e 4G -f 2 -g 8, result: 232.54GB/s",
        note="GPU memory size and whether this is the peak or the largest size are not "
        "stated; agrees with NVIDIA's ~230 GB/s.",
    ),
    Measurement(
        key="a100_2gpu_nvlink_bridge_allreduce",
        what="2 A100 joined by 12 NVLinks (NV12 pair, no NVSwitch) all-reduce bus bandwidth",
        kind="allreduce_busbw",
        value=208.0,
        unit="GB/s",
        conditions=dict(
            gpu="A100",
            gpus=2,
            nodes=1,
            interconnect="NVLink pair (NV12)",
            bytes=12 * GiB,
            algorithm=None,
            op_mode=None,
            redop="avg",
            command="all_reduce_perf -b 8 -e 12G -f 2 -g 1 -t 2 -o avg",
        ),
        source="NVIDIA/nccl-tests#178 (user's run)",
        url=_NCCL_TESTS + "178",
        quote="When I run all-reduce test like this, the test finishes quickly (as one would "
        "expect since there is a direct NVLink connection). Bus_BW: 208 GBps",
        note="TWO GPUs (-t 2), not 8: the machine's nvidia-smi topo shows NV12 pairs "
        "(GPU0-GPU1, GPU2-GPU3, ...) and PCIe (NODE/SYS) between pairs. presets.py cites "
        "this as 8 A100 on NVSwitch, which it is not.",
    ),
    Measurement(
        key="a100_3gpu_pairs_over_pcie_allreduce",
        what="3 A100 of the same NV12-paired machine: the ring must cross PCIe",
        kind="allreduce_busbw",
        value=20.0,
        unit="GB/s",
        conditions=dict(
            gpu="A100",
            gpus=3,
            nodes=1,
            interconnect="NVLink pair + PCIe (NODE) between pairs",
            bytes=12 * GiB,
            algorithm=None,
            op_mode=None,
            redop="avg",
            command="all_reduce_perf -b 8 -e 12G -f 2 -g 1 -t 3 -o avg",
        ),
        source="NVIDIA/nccl-tests#178 (user's run)",
        url=_NCCL_TESTS + "178",
        quote="When I run all-reduce test like below, the test takes a long time. bus_bw "
        "drops to 20 GBps.",
        note="A ring runs at its slowest link: one PCIe hop takes 208 GB/s to 20.",
    ),
    Measurement(
        key="h100_8gpu_nvls_allreduce_nvidia",
        what="8 H100 SXM all-reduce bus bandwidth with NVLink SHARP (NCCL's default), peak",
        kind="allreduce_busbw",
        value=480.0,
        unit="GB/s",
        conditions=dict(
            gpu="H100-SXM5-80GB",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NVLink4)",
            bytes=None,
            algorithm="NVLS",
            op_mode=None,
            algbw_GBps=275.0,
        ),
        source="NVIDIA/nccl-tests#212, S. Jeaugey (NVIDIA)",
        url=_NCCL_TESTS + "212",
        quote="On 8 GPUs, you should reach a peak busBw of ~480GB/s (algbw ~275GB/s). You "
        "need to run on larger sizes though; 256M is too small to reach peak bandwidth.",
        note="Expected peak stated by NVIDIA; the user's own run reached algbw ~250 GB/s at "
        "256 MiB.",
    ),
    Measurement(
        key="h100_8gpu_ring_allreduce_nvidia",
        what="8 H100 SXM all-reduce bus bandwidth with the ring (NCCL_ALGO=RING)",
        kind="allreduce_busbw",
        value=370.0,
        unit="GB/s",
        conditions=dict(
            gpu="H100-SXM5-80GB",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NVLink4)",
            bytes=None,
            algorithm="ring",
            op_mode=None,
        ),
        source="NVIDIA/nccl-tests#212, S. Jeaugey (NVIDIA)",
        url=_NCCL_TESTS + "212",
        quote="450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an "
        'effective NVLink bandwidth of 370GB/s, which you can observe as "BusBw" when '
        "running non-allreduce operations, or when running with `NCCL_ALGO=RING`.",
        note="The preset's H100 device link is this number.",
    ),
    Measurement(
        key="h100_4gpu_nvls_allreduce",
        what="4 H100 SXM all-reduce with NVLS forced: no gain over the ring below 5 GPUs",
        kind="allreduce_busbw",
        value=370.0,
        unit="GB/s",
        conditions=dict(
            gpu="H100-SXM",
            gpus=4,
            nodes=1,
            interconnect="NVSwitch (NVLink4)",
            bytes=[2 * GiB, 4 * GiB],
            algorithm="NVLS",
            op_mode=None,
            command="NCCL_ALGO=NVLS all_reduce_perf -b 2G -e 4G -f 2 -g 4",
        ),
        source="NVIDIA/nccl#1455 (user's run)",
        url=_NCCL + "1455",
        quote="Busbw remains about 365-370 GBps when gpus from 2 to 4. However, Busbw increase "
        "from 370 to 420, 440, 460, and 480 GBps when gpus increase from 4 to 5, 6, 7, and 8.",
        note="Reported as 'about 365-370'. Same post: with NCCL_ALGO=RING 'busbw is about "
        "365-370 GBps when gpus from 2 to 8'; NVLS at 8 GPUs 480 (algbw ~273).",
    ),
    Measurement(
        key="h100_8gpu_nvls_allreduce_measured",
        what="8 H100 SXM all-reduce with NVLS forced, 2-4 GiB",
        kind="allreduce_busbw",
        value=480.0,
        unit="GB/s",
        conditions=dict(
            gpu="H100-SXM",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NVLink4)",
            bytes=[2 * GiB, 4 * GiB],
            algorithm="NVLS",
            op_mode=None,
            command="NCCL_ALGO=NVLS all_reduce_perf -b 2G -e 4G -f 2 -g 8",
        ),
        source="NVIDIA/nccl#1455 (user's run)",
        url=_NCCL + "1455",
        quote="Busbw increase from 370 to 420, 440, 460, and 480 GBps when gpus increase from "
        "4 to 5, 6, 7, and 8.",
    ),
    Measurement(
        key="h100_8gpu_nvls_over_ring_ratio",
        what="all-reduce NVLS over ring on 8 H100 (AWS p5.48xlarge thread)",
        kind="ratio",
        value=1.30,
        unit="x",
        conditions=dict(
            gpu="H100-SXM5-80GB",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NVLink4)",
            numerator="NVLS all-reduce busbw",
            denominator="ring busbw (370 GB/s)",
        ),
        source="NVIDIA/nccl#1442, S. Jeaugey (NVIDIA)",
        url=_NCCL + "1442",
        quote="The app-level bandwidth is 370GB/s in each direction, which is the real target "
        "for NCCL BusBW intra-node, except for the Allreduce operation where we can get a 30% "
        "improvement using NVLink SHARP.",
    ),
    Measurement(
        key="h200_8gpu_allreduce",
        what="8 H200 (NVLink4, NCCL 2.20.3 defaults) all-reduce bus bandwidth, peak up to 4 GiB",
        kind="allreduce_busbw",
        value=475.0,
        unit="GB/s",
        conditions=dict(
            gpu="H200",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NVLink4)",
            bytes=4 * GiB,
            algorithm=None,
            op_mode=None,
            nccl="2.20.3",
            command="srun -N 1 -n 8 all_reduce_perf -b 64k -e 4G -f 2 -g 1",
        ),
        source="NVIDIA/nccl-tests#272 (user's run)",
        url=_NCCL_TESTS + "272",
        quote="The output shows peak bandwidth of 475 GB/s",
        note="Default algorithm on this machine is NVLS (the thread's subject is busbw above "
        "the NVLink4 line rate).",
    ),
    Measurement(
        key="h800_8gpu_allreduce",
        what="8 H800 (NVLink 400 GB/s both directions) all-reduce bus bandwidth",
        kind="allreduce_busbw",
        value=215.0,
        unit="GB/s",
        conditions=dict(
            gpu="H800",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NVLink4, 8 links)",
            bytes=None,
            algorithm=None,
            op_mode=None,
        ),
        source="NVIDIA/nccl#1374 (user's run)",
        url=_NCCL + "1374",
        quote="I have also conducted a test on H800 * 8 node, and the reported allreduce budBW "
        "is 215 GB/s, which is bigger than unidirectional peak BW 200GB/s",
        note="Sizes and algorithm not stated (shown in an image).",
    ),
    Measurement(
        key="h100pcie_2gpu_nvlink_bridge_allreduce_4gib",
        what="2 H100 PCIe joined by an NVLink bridge, all-reduce bus bandwidth at 4 GiB",
        kind="allreduce_busbw",
        value=116.26,
        unit="GB/s",
        conditions=dict(
            gpu="H100-PCIe",
            gpus=2,
            nodes=1,
            interconnect="NVLink bridge",
            bytes=4 * GiB,
            algorithm=None,
            op_mode="out-of-place",
            command="all_reduce_perf -b 1G -e 8G -f 2 -g 2",
        ),
        source="NVIDIA/nccl#1161 (= nccl-tests#194), user's run",
        url=_NCCL + "1161",
        quote="4294967296    1073741824     float     sum      -1    36943  116.26  116.26",
        note="For 2 GPUs busbw = algbw. In-place 116.34.",
    ),
    Measurement(
        key="tu102_2gpu_nvlink_bridge_allreduce",
        what="2 RTX 2080 Ti (TU102, 2 NVLinks) on an NVLink bridge, all-reduce bus bandwidth",
        kind="allreduce_busbw",
        value=21.40,
        unit="GB/s",
        conditions=dict(
            gpu="GeForce RTX 2080 Ti",
            gpus=2,
            nodes=1,
            interconnect="NVLink bridge (TU102: two links); each GPU on PCIe 3.0 x8",
            bytes=64 * 1024 * 1024,
            algorithm=None,
            op_mode="out-of-place",
            nccl="2.6.4",
            command="all_reduce_perf -b 8 -e 128M -f 2 -g 2",
        ),
        source="NVIDIA/nccl-tests#44 (= nccl#340), user's run",
        url=_NCCL_TESTS + "44",
        quote="67108864       8388608   float   1568.3   21.40   21.40",
        note="The largest sizes read 20.05 (16 MiB), 20.51, 21.40 (64 MiB), 20.34 (128 MiB) "
        "out of place, 21.86 in place at 128 MiB. Each GPU sits on PCIe 3.0 x8 (7.9 GB/s a "
        "direction), so 21 GB/s is the bridge. TU102 is the TITAN RTX's die with the same "
        "two NVLinks: the source of the TITAN RTX pair's NVLink in cost_published.py, so "
        "its row checks the formula only.",
    ),
    # --- copies between two GPUs (held out: no preset number comes from these) ------------
    Measurement(
        key="h100_nvswitch_p2p_copy",
        what="H100 SXM to H100 SXM through NVSwitch, one way (p2pBandwidthLatencyTest, P2P "
        "writes, GPU 0 to GPU 1)",
        kind="copy_bandwidth",
        value=371.02,
        unit="GB/s",
        conditions=dict(
            gpu="H100 80GB HBM3 (SXM5)",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NV18)",
            p2p=True,
            direction="one way",
            cuda="12.4",
            driver="550.54.15",
        ),
        source="NVIDIA/nccl#1264 (user's run)",
        url=_NCCL + "1264",
        quote="0 2494.76 371.02 376.65 376.60 376.82 375.59 375.94",
        note="Row 0 of 'Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)' on a "
        "Supermicro 8xH100 SXM server; GPU 0's other peers read 375.6-376.8. The thread's "
        "title: 'Only ~783GByte/s out of theoretical 900GB/s' (both ways).",
    ),
    Measurement(
        key="h100_no_p2p_copy",
        what="H100 SXM to H100 SXM with peer-to-peer off (staged through host memory over "
        "PCIe 5), one way (p2pBandwidthLatencyTest, GPU 0 to GPU 1)",
        kind="copy_bandwidth",
        value=37.19,
        unit="GB/s",
        conditions=dict(
            gpu="H100 80GB HBM3 (SXM5)",
            gpus=8,
            nodes=1,
            interconnect="PCIe 5 through host",
            p2p=False,
            direction="one way",
            cuda="12.4",
            driver="550.54.15",
        ),
        source="NVIDIA/nccl#1264 (user's run)",
        url=_NCCL + "1264",
        quote="0 2474.76  37.19  37.20  36.91  37.06  37.16  37.28  37.24",
        note="Row 0 of 'Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)', the same "
        "machine as h100_nvswitch_p2p_copy: CUDA stages the copy through host memory.",
    ),
    Measurement(
        key="tu102_no_p2p_copy",
        what="RTX 2080 Ti to RTX 2080 Ti without peer to peer (staged through host memory over "
        "PCIe 3 x16), one way (p2pBandwidthLatencyTest, GPU 0 to GPU 1)",
        kind="copy_bandwidth",
        value=5.71,
        unit="GB/s",
        conditions=dict(
            gpu="GeForce RTX 2080 Ti",
            gpus=2,
            nodes=1,
            interconnect="PCIe 3 x16 through host",
            p2p=False,
            direction="one way",
            cuda="12.4",
            driver="550.90.07",
            machine=_TU102_NO_P2P_MACHINE,
        ),
        source="Anthony-Hoo, 'AutoDL GPU container multi-GPU interconnect test, 2080Ti x2' "
        "(raw cuda-samples output)",
        url=_TU102_NO_P2P,
        quote="Unidirectional P2P=Disabled Bandwidth Matrix (GB/s) [...] 0 541.84   5.71",
        note="GPU 1 to GPU 0 reads 5.70; both ways at once 6.10-6.12. The same machine's "
        "pinned host-to-device copy reads 12.2 GB/s, so the staged copy gets 0.47 of one "
        "PCIe hop here, where the H100 row (h100_no_p2p_copy) gets 0.59 of PCIe 5's 63.",
    ),
    Measurement(
        key="h100_4gpu_nv6_p2p_bidirectional",
        what="H100 to H100 over direct NVLinks (a 4-GPU board, no NVSwitch), both ways at "
        "once (p2pBandwidthLatencyTest, GPU 0 and GPU 1)",
        kind="copy_bandwidth",
        value=260.89,
        unit="GB/s",
        conditions=dict(
            gpu="H100-80GB",
            gpus=4,
            nodes=1,
            interconnect="direct NVLink 4 (6 links a pair)",
            p2p=True,
            direction="both ways",
        ),
        source="NVIDIA/cuda-samples#392 (user's run)",
        url=_CUDA_SAMPLES + "392",
        quote="GPU0-GPU1 = 260.89 (GB/s)",
        note="The user: 'The spec says GPU0-GPU1 NVlink bandwidth is 300 GB/s', i.e. 6 NVLink "
        "4 links of 50 GB/s both ways (25 each way): a 4-GPU HGX board's pair.",
    ),
    Measurement(
        key="h800_nvlink_copy_deepseek",
        what="H800 to H800 over NVLink (8 links, 200 GB/s a direction nominal), one way, "
        "peak achievable",
        kind="copy_bandwidth",
        value=160.0,
        unit="GB/s",
        conditions=dict(
            gpu="H800",
            gpus=8,
            nodes=1,
            interconnect="NVSwitch (NVLink 4, 8 links)",
            p2p=True,
            direction="one way",
        ),
        source="deepseek-ai/DeepEP#16, DeepSeek's answer",
        url=_DEEPEP + "16",
        quote="H800 GPU servers are equipped with a reduced configuration of NVLink, featuring "
        "a nominal bandwidth of 200GB/s. Our benchmarks show that the actual achievable "
        "bandwidth peaks at approximately 160GB/s.",
        note="DeepSeek's own kernels (DeepEP), not NCCL; the DeepSeek-V3 report's 'NVLink "
        "offers a bandwidth of 160 GB/s' is the same figure (deepseek-ai/DeepSeek-V3#28: "
        "'our unidirectional measurement').",
    ),
    # --- all-reduce on PCIe without NVLink -------------------------------------------------
    Measurement(
        key="rtx5090_8gpu_pcie5_allreduce",
        what="8 RTX 5090 on PCIe 5 (2x Xeon 8480+), no NVLink, all-reduce bus bandwidth, max",
        kind="allreduce_busbw",
        value=28.0,
        unit="GB/s",
        conditions=dict(
            gpu="RTX 5090",
            gpus=8,
            nodes=1,
            interconnect="PCIe 5 (no NVLink)",
            bytes=[1 * GiB, 8 * GiB],
            algorithm=None,
            op_mode=None,
            command="NCCL_NTHREADS=256 NCCL_MIN_NCHANNELS=8 all_reduce_perf -b 1g -e 8g -f 2 -g 8",
        ),
        source="NVIDIA/nccl#1639 (user's run; NVIDIA's answer)",
        url=_NCCL + "1639",
        quote="8 GPU max performance  ：bwbus  28GB/s",
        note="S. Jeaugey: 'On PCI systems, the performance you get is usually determined by "
        "the bandwidth your CPU and memory can deliver.' Not an A100: the 4xA100-PCIe4 preset "
        "has no direct measurement.",
    ),
    Measurement(
        key="rtx5090_4gpu_pcie5_allreduce",
        what="4 RTX 5090 on the same PCIe 5 machine, all-reduce bus bandwidth, max",
        kind="allreduce_busbw",
        value=35.0,
        unit="GB/s",
        conditions=dict(
            gpu="RTX 5090",
            gpus=4,
            nodes=1,
            interconnect="PCIe 5 (no NVLink)",
            bytes=[1 * GiB, 8 * GiB],
            algorithm=None,
            op_mode=None,
        ),
        source="NVIDIA/nccl#1639 (user's run)",
        url=_NCCL + "1639",
        quote="4GPU max performance : bwbus  35GB/s",
    ),
    Measurement(
        key="pcie3_2gpu_shm_allreduce",
        what="2 GPUs on PCIe 3 x16, NCCL peer-to-peer off (SHM: through host memory), one "
        "channel, all-reduce bus bandwidth",
        kind="allreduce_busbw",
        value=3.9,
        unit="GB/s",
        conditions=dict(
            gpu=None,
            gpus=2,
            nodes=1,
            interconnect="PCIe Gen3 x16, NCCL_P2P_DISABLE=1 (SHM transport)",
            bytes=None,
            algorithm=None,
            op_mode=None,
            nccl="2.4.8",
            env="NCCL_MAX_NCHANNELS=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=0",
        ),
        source="NVIDIA/nccl#384 (user's run; NVIDIA's answer)",
        url=_NCCL + "384",
        quote="Allreduce: 3.9GB/s",
        note="Broadcast 10.31 and Reduce 9.62 GB/s on the same machine. S. Jeaugey: 'On 2 "
        "GPUs, Broadcast and Reduce are unidirectional [...] Some components (in particular "
        "some CPUs) do not handle bidirectional traffic well'. GPU model and sizes not "
        "stated; one channel (NCCL_MAX_NCHANNELS=1). The source of the T4-PCIe3 preset's "
        "host-memory NCCL link; the TITAN RTX pair of cost_published.py takes TU102's own "
        "measurement (tu102_2gpu_shm_allreduce), so this row checks that one against it.",
    ),
    Measurement(
        key="tu102_2gpu_shm_allreduce",
        what="2 RTX 2080 Ti (TU102) on PCIe 3 x16 without peer to peer (NCCL through host "
        "memory), NCCL's defaults, all-reduce bus bandwidth at 1 GiB",
        kind="allreduce_busbw",
        value=4.00,
        unit="GB/s",
        conditions=dict(
            gpu="GeForce RTX 2080 Ti",
            gpus=2,
            nodes=1,
            interconnect="PCIe Gen3 x16 switch (PIX); GeForce: no PCIe peer to peer",
            bytes=GiB,
            algorithm=None,
            op_mode="out-of-place",
            nccl=None,
            command="all_reduce_perf -b 8 -e 1024M -f 2 -g2",
            machine=_TU102_NO_P2P_MACHINE,
        ),
        source="Anthony-Hoo, 'AutoDL GPU container multi-GPU interconnect test, 2080Ti x2' "
        "(raw nccl-tests output)",
        url=_TU102_NO_P2P,
        quote="1073741824     268435456     float     sum      -1   268588    4.00    4.00",
        note="Flat from 16 MiB (3.99) to 1 GiB (4.00), in place the same. On the same run: "
        "broadcast 11.09 and reduce 11.14 GB/s one way, all-gather 3.79: the pattern of "
        "nccl#384's pair (3.9 all-reduce, 10.31 broadcast, one channel, GPU not stated). "
        "The source of the TITAN RTX pair's NCCL link without peer to peer in "
        "cost_published.py (TU102, the TITAN RTX's die, through host memory as "
        "NCCL_P2P_DISABLE=1 forces), so its row checks the formula only. A server, not "
        "Hugging Face's desktop, whose PCIe lanes and NCCL (2.7.x with torch 1.8) are not "
        "stated.",
    ),
    # --- all-reduce across nodes -----------------------------------------------------------
    Measurement(
        key="a100_3x8_ib_hdr_allreduce_127mib",
        what="3 nodes x 8 A100 SXM4 40GB, 4 HDR IB ports per node, all-reduce bus bandwidth",
        kind="allreduce_busbw",
        value=95.74,
        unit="GB/s",
        conditions=dict(
            gpu="A100-SXM4-40GB",
            gpus=24,
            nodes=3,
            interconnect="NVSwitch",
            network="InfiniBand HDR 200 Gb/s",
            nics_per_node=4,
            bytes=133169160,
            algorithm=None,
            op_mode="out-of-place",
            command="mpirun -np 24 all_reduce_perf -b 8 -e 128M -g 1",
        ),
        source="NVIDIA/nccl-tests#119 (user's run; NVIDIA's answer)",
        url=_NCCL_TESTS + "119",
        quote="133169160      33292290     float     sum      -1   2666.0   49.95   95.74",
        note="In-place 95.94; 'Avg bus bandwidth : 84.8558' over all sizes 8 B..128 MiB. "
        "S. Jeaugey: 'We usually consider 24GB/s is the peak performance per 200G NIC (12 GB/s "
        "for 100G NICs), so in your case 96GB/s is the target'.",
    ),
    Measurement(
        key="a100_2x8_ib_allreduce",
        what="2 nodes x 8 A100, 4x 200Gb IB (dual-port) per node, all-reduce bus bandwidth",
        kind="allreduce_busbw",
        value=86.0,
        unit="GB/s",
        conditions=dict(
            gpu="A100",
            gpus=16,
            nodes=2,
            interconnect="NVLink",
            network="InfiniBand 200 Gb/s, dual-port NICs",
            nics_per_node=4,
            bytes=None,
            algorithm=None,
            op_mode=None,
        ),
        source="NVIDIA/nccl-tests#175 (= nccl#1048), user's run",
        url=_NCCL_TESTS + "175",
        quote="nccl all-reduce between two nodes  only 86GB/s",
        note="The user expected 100 GB/s (#175) or 96 (#1048); S. Jeaugey: 'not clear [...] "
        "whether the peak theoretical is 100GB/s or 200GB/s (as NICs are dual port'. Sizes "
        "not stated (log attached).",
    ),
    Measurement(
        key="v100_2x8_tcp_100gbe_allreduce",
        what="2 AWS p3dn nodes (8 V100-SXM2-32GB each, 100 Gb/s network) over NCCL's TCP "
        "sockets, all-reduce bus bandwidth with 16 ranks",
        kind="allreduce_busbw",
        value=6.0,
        unit="GB/s",
        conditions=dict(
            gpu="V100-SXM2-32GB",
            gpus=16,
            nodes=2,
            interconnect="NVLink",
            network="100 Gb/s Ethernet, NCCL socket transport",
            nics_per_node=1,
            bytes=[262144, 536870912],
            algorithm="ring",
            op_mode=None,
            nccl="2.4.8",
            env="NCCL_TREE_THRESHOLD=0",
        ),
        source="NVIDIA/nccl#398 (user's run)",
        url=_NCCL + "398",
        quote="# 8 processes on each node, 16 in total, the bus can sustain around 6GB/s",
        note="'around 6': 48% of the 12.5 GB/s line rate, against the 70% that presets.py "
        "assumes for NCCL over 100 GbE. Old NCCL (2.4.8); the same post finds one process "
        "per node slower.",
    ),
    # --- one GPU: NVIDIA DeepLearningExamples ResNeXt-101 32x4d (PyTorch) ------------------
    # These four set the presets' tensor_core_efficiency (benchmarks/tensor_core_efficiency.py):
    # they are not checks of the model; ResNet-50's rows below check what was read from them.
    *[
        Measurement(
            key=f"rnx101_{tag}_1gpu_{prec}",
            what=f"ResNeXt-101 32x4d training throughput, 1x {gpu}, {prec.upper()}",
            kind="throughput",
            value=value,
            unit="img/s",
            conditions=dict(
                model="resnext101-32x4d",
                gpu=gpu,
                gpus=1,
                nodes=1,
                precision=prec,
                batch_per_gpu=batch,
                image=[3, 224, 224],
            ),  # fmt: skip
            source=f"NVIDIA DeepLearningExamples, ResNeXt101-32x4d for PyTorch: {table}",
            url=_DLE_RNX101,
            quote=quote,
            note=_DLE_NOTE + "; sets presets.py's tensor_core_efficiency (not a check)",
        )
        for tag, gpu, table, prec, batch, value, quote in (
            (
                "a100",
                "A100-SXM4-80GB",
                "Training performance: NVIDIA DGX A100 (8x A100 80GB)",
                "tf32",
                128,
                456.0,
                "|    1     |       456 img/s       |            1211 img/s",
            ),
            (
                "a100",
                "A100-SXM4-80GB",
                "Training performance: NVIDIA DGX A100 (8x A100 80GB)",
                "amp",
                128,
                1211.0,
                "|    1     |       456 img/s       |            1211 img/s",
            ),
            (
                "v100",
                "V100-SXM2-16GB",
                "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)",
                "fp32",
                64,
                147.0,
                "|    1     |       147 img/s       |            587 img/s",
            ),
            (
                "v100",
                "V100-SXM2-16GB",
                "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)",
                "amp",
                128,
                587.0,
                "|    1     |       147 img/s       |            587 img/s",
            ),
        )
    ],  # fmt: skip
    # --- one GPU and one DGX: NVIDIA DeepLearningExamples ResNet-50 v1.5 (PyTorch) --------
    *[
        Measurement(
            key=f"rn50_{tag}_{n}gpu_{prec}",
            what=f"ResNet-50 v1.5 training throughput, {n}x {gpu}, {prec.upper()}",
            kind="throughput",
            value=value,
            unit="img/s",
            conditions=dict(
                model="resnet50",
                gpu=gpu,
                gpus=n,
                nodes=1,
                precision=prec,
                batch_per_gpu=batch,
                image=[3, 224, 224],
                interconnect=link,
                parallel="DDP (torch.distributed, one process per GPU)",
            ),
            source=f"NVIDIA DeepLearningExamples, ResNet50 v1.5 for PyTorch: {table}",
            url=_DLE_RN50,
            quote=quote,
            note=_DLE_NOTE,
        )
        for tag, gpu, link, table, rows in (
            (
                "a100",
                "A100-SXM4-80GB",
                "NVSwitch",
                "Training performance: NVIDIA DGX A100 (8x A100 80GB)",
                (
                    (1, "tf32", 256, 938.0, "|    1     | 938 img/s  |            2470 img/s"),
                    (1, "amp", 256, 2470.0, "|    1     | 938 img/s  |            2470 img/s"),
                    (8, "tf32", 256, 7248.0, "|    8     | 7248 img/s |           16621 img/s"),
                    (8, "amp", 256, 16621.0, "|    8     | 7248 img/s |           16621 img/s"),
                ),
            ),
            (
                "v100",
                "V100-SXM2-16GB",
                "NVLink hybrid cube mesh",
                "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)",
                (
                    (1, "fp32", 112, 367.0, "|    1     | 367 img/s  |            1200 img/s"),
                    (1, "amp", 256, 1200.0, "|    1     | 367 img/s  |            1200 img/s"),
                    (8, "fp32", 112, 2855.0, "|    8     | 2855 img/s |            8322 img/s"),
                    (8, "amp", 256, 8322.0, "|    8     | 2855 img/s |            8322 img/s"),
                ),
            ),
        )
        for n, prec, batch, value, quote in rows
    ],  # fmt: skip
    *[
        Measurement(
            key=key,
            what=what,
            kind=kind,
            value=value,
            unit="x",
            conditions=cond,
            source="NVIDIA DeepLearningExamples, ResNet50 v1.5 for PyTorch (printed ratio)",
            url=_DLE_RN50,
            quote=quote,
            note=_DLE_NOTE,
        )
        for key, what, kind, value, cond, quote in (
            (
                "rn50_a100_1gpu_amp_over_tf32",
                "ResNet-50 throughput AMP / TF32, 1 A100 80GB",
                "ratio",
                2.63,
                dict(
                    model="resnet50",
                    gpu="A100-SXM4-80GB",
                    gpus=1,
                    batch_per_gpu=256,
                    numerator="amp",
                    denominator="tf32",
                ),
                "|    1     | 938 img/s  |            2470 img/s            |                      "
                "2.63 x",
            ),
            (
                "rn50_a100_tf32_8gpu_speedup",
                "ResNet-50 TF32 8-GPU / 1-GPU throughput, DGX A100",
                "speedup",
                7.72,
                dict(
                    model="resnet50",
                    gpu="A100-SXM4-80GB",
                    precision="tf32",
                    batch_per_gpu=256,
                    numerator_gpus=8,
                    denominator_gpus=1,
                    interconnect="NVSwitch",
                ),
                "|    8     | 7248 img/s |           16621 img/s            |                      "
                "2.29 x                      |         7.72 x",
            ),
            (
                "rn50_a100_amp_8gpu_speedup",
                "ResNet-50 AMP 8-GPU / 1-GPU throughput, DGX A100",
                "speedup",
                6.72,
                dict(
                    model="resnet50",
                    gpu="A100-SXM4-80GB",
                    precision="amp",
                    batch_per_gpu=256,
                    numerator_gpus=8,
                    denominator_gpus=1,
                    interconnect="NVSwitch",
                ),
                "|         7.72 x          |               6.72 x",
            ),
            (
                "rn50_v100_1gpu_amp_over_fp32",
                "ResNet-50 throughput AMP / FP32, 1 V100 16GB",
                "ratio",
                3.26,
                dict(
                    model="resnet50",
                    gpu="V100-SXM2-16GB",
                    gpus=1,
                    numerator="amp (batch 256)",
                    denominator="fp32 (batch 112)",
                ),
                "|    1     | 367 img/s  |            1200 img/s            |                      "
                "3.26 x",
            ),
            (
                "rn50_v100_fp32_8gpu_speedup",
                "ResNet-50 FP32 8-GPU / 1-GPU throughput, DGX-1",
                "speedup",
                7.76,
                dict(
                    model="resnet50",
                    gpu="V100-SXM2-16GB",
                    precision="fp32",
                    batch_per_gpu=112,
                    numerator_gpus=8,
                    denominator_gpus=1,
                    interconnect="NVLink hybrid cube mesh",
                ),
                "|         7.76 x          |               6.93 x",
            ),
            (
                "rn50_v100_amp_8gpu_speedup",
                "ResNet-50 AMP 8-GPU / 1-GPU throughput, DGX-1",
                "speedup",
                6.93,
                dict(
                    model="resnet50",
                    gpu="V100-SXM2-16GB",
                    precision="amp",
                    batch_per_gpu=256,
                    numerator_gpus=8,
                    denominator_gpus=1,
                    interconnect="NVLink hybrid cube mesh",
                ),
                "|         7.76 x          |               6.93 x",
            ),
        )
    ],  # fmt: skip
    *[
        Measurement(
            key=f"rn50_t4_inference_{prec}_b256",
            what=f"ResNet-50 v1.5 INFERENCE throughput, 1 T4, {prec.upper()}, batch 256",
            kind="throughput",
            value=value,
            unit="img/s",
            conditions=dict(
                model="resnet50",
                gpu="T4",
                gpus=1,
                precision=prec,
                batch_per_gpu=256,
                image=[3, 224, 224],
                mode="inference",
            ),
            source="NVIDIA DeepLearningExamples, ResNet50 v1.5 for PyTorch: Inference "
            "performance: NVIDIA T4",
            url=_DLE_RN50,
            quote=quote,
            note="Forward only (no training table for T4 in this README); AMP/FP32 = "
            "1198/415 = 2.89, far from the 65/8.1 = 8x of the T4 peaks.",
        )
        for prec, value, quote in (
            ("fp32", 415.0, "|      256       |     415 img/s      |    635.98 ms"),
            ("amp", 1198.0, "|      256       |     1198 img/s     |    225.95 ms"),
        )
    ],  # fmt: skip
    # --- DDP on DGX-1 machines: PyTorch's own benchmark ------------------------------------
    *[
        Measurement(
            key=f"ddp_bench_{model}_{label}",
            what=f"{model} per-GPU training throughput, {label.replace('_', ' ')}, V100 DGX-1",
            kind="throughput",
            value=value,
            unit="img/s per GPU",
            conditions=dict(_DDP_COND, model=model, gpus=gpus, nodes=nodes, ddp=ddp),
            source="pytorch/pytorch benchmarks/distributed/ddp/README.md (example output)",
            url=_DDP_BENCH,
            quote=quote,
            note="ex/sec is per GPU (32 / sec per iter). The ResNet-50 1-, 8- and 16-GPU "
            "rows are already compared in benchmarks/results/cost_published.md.",
        )
        for model, label, gpus, nodes, ddp, value, quote in (
            (
                "resnet50",
                "1gpu_no_ddp",
                1,
                1,
                False,
                329.0,
                "1 GPUs --   no ddp:  p50:  0.097s     329/s",
            ),
            (
                "resnet50",
                "1gpu_ddp",
                1,
                1,
                True,
                319.0,
                "1 GPUs --    1M/1G:  p50:  0.100s     319/s",
            ),
            (
                "resnet50",
                "8gpu_ddp",
                8,
                1,
                True,
                307.0,
                "8 GPUs --    1M/8G:  p50:  0.104s     307/s",
            ),
            (
                "resnet50",
                "16gpu_ddp",
                16,
                2,
                True,
                306.0,
                "16 GPUs --    2M/8G:  p50:  0.104s     306/s",
            ),
            (
                "resnet101",
                "1gpu_no_ddp",
                1,
                1,
                False,
                197.0,
                "1 GPUs --   no ddp:  p50:  0.162s     197/s",
            ),
            (
                "resnet101",
                "1gpu_ddp",
                1,
                1,
                True,
                187.0,
                "1 GPUs --    1M/1G:  p50:  0.171s     187/s",
            ),
            (
                "resnet101",
                "8gpu_ddp",
                8,
                1,
                True,
                179.0,
                "8 GPUs --    1M/8G:  p50:  0.179s     179/s",
            ),
            (
                "resnet101",
                "16gpu_ddp",
                16,
                2,
                True,
                178.0,
                "16 GPUs --    2M/8G:  p50:  0.179s     178/s",
            ),
        )
    ],  # fmt: skip
    Measurement(
        key="ddp_bench_resnet50_16gpu_bucket1mb_over_25mb",
        what="ResNet-50 DDP throughput with bucket_cap_mb=1 over the default 25, 16 V100",
        kind="ratio",
        value=0.962,
        unit="x",
        conditions=dict(
            _DDP_COND,
            model="resnet50",
            gpus=16,
            nodes=2,
            ddp=True,
            statistic="p75",
            numerator="bucket_cap_mb=1",
            denominator="bucket_cap_mb=25",
        ),
        source="pytorch/pytorch benchmarks/distributed/ddp/README.md (diff.py example)",
        url=_DDP_BENCH,
        quote="16 GPUs:  p75:    0.108s     294/s     -3.8%  p95:    0.122s     262/s    -16.4%",
        note="value = 1 - 3.8%. The text says the comparison ran 'on 8 DGX machines with V100 "
        "GPUs'; the table goes to 16 GPUs (2 machines). At p95 the loss is 16.4%.",
    ),
    # --- DataParallel vs DDP, NVLink vs PCIe: Hugging Face ---------------------------------
    *[
        Measurement(
            key=f"hf_gpt2_2gpu_{label}",
            what=f"GPT-2 fine-tuning, 2 TITAN RTX, {desc}: steps per second over 200 steps",
            kind="throughput",
            value=value,
            unit="steps/s",
            conditions=dict(
                _HF_COND, parallel=parallel, interconnect=link, train_runtime_s=runtime
            ),
            source="Hugging Face Transformers docs, perf_train_gpu_many.md (DP vs DDP)",
            url=_HF,
            quote=quote,
            note=_HF_NOTE,
        )
        for label, desc, parallel, link, runtime, value, quote in (
            (
                "dp_nvlink",
                "DataParallel, NVLink",
                "DataParallel",
                "NVLink (NV2)",
                110.5948,
                1.808,
                "{'train_runtime': 110.5948, 'train_samples_per_second': 1.808, 'epoch': 0.69}",
            ),
            (
                "ddp_nvlink",
                "DDP, NVLink",
                "DDP",
                "NVLink (NV2)",
                101.9003,
                1.963,
                "{'train_runtime': 101.9003, 'train_samples_per_second': 1.963, 'epoch': 0.69}",
            ),
            (
                "ddp_pcie",
                "DDP, NVLink off (NCCL_P2P_DISABLE=1)",
                "DDP",
                "PCIe, NCCL peer-to-peer disabled",
                131.4367,
                1.522,
                "{'train_runtime': 131.4367, 'train_samples_per_second': 1.522, 'epoch': 0.69}",
            ),
        )
    ],  # fmt: skip
    Measurement(
        key="hf_gpt2_2gpu_ddp_pcie_over_nvlink",
        what="GPT-2, 2 TITAN RTX, DDP step time without NVLink over with NVLink",
        kind="ratio",
        value=131.4367 / 101.9003,
        unit="x",
        conditions=dict(
            _HF_COND,
            parallel="DDP",
            numerator="NCCL_P2P_DISABLE=1 (PCIe)",
            denominator="NVLink (NV2)",
        ),
        source="Hugging Face Transformers docs, perf_train_gpu_many.md",
        url=_HF,
        quote="| 2:DDP  | Y      | 101s |\n| 2:DDP  | N      | 131s |",
        note="1.29x: the 'measured 1.29x' of the project's issue. perf_hardware.md of the same "
        "docs: 'NVLink completes the training ~23% faster'. NCCL_P2P_DISABLE=1 also stops "
        "PCIe peer-to-peer, so copies go through host memory.",
    ),
    Measurement(
        key="hf_gpt2_2gpu_dp_over_ddp",
        what="GPT-2, 2 TITAN RTX with NVLink, DataParallel step time over DDP's",
        kind="ratio",
        value=110.5948 / 101.9003,
        unit="x",
        conditions=dict(
            _HF_COND, interconnect="NVLink (NV2)", numerator="DataParallel", denominator="DDP"
        ),
        source="Hugging Face Transformers docs, perf_train_gpu_many.md",
        url=_HF,
        quote="As you can see, in this case DP is ~10% slower than DDP with NVlink, but ~15% "
        "faster than DDP without NVlink.",
        note="1.085x. The DP run is one process through Trainer (torch.nn.DataParallel), "
        "with per_device_train_batch_size 4, i.e. 8 per step as for DDP.",
    ),
]
