"""dpkit.ddp: torch's real DistributedDataParallel, run and traced into dpkit's trace format.

The surprise first: this is not a re-implementation. The ranks are real processes running
``torch.nn.parallel.DistributedDataParallel`` over ``torch.distributed`` (gloo on the CPU,
NCCL with a GPU per rank); dpkit only starts them, watches them, and records them from
the hooks DDP offers, into one :class:`dpkit.Trace` whose devices are the ranks, so the
figures, summaries and Chrome traces of a DataParallel run work on it unchanged.

From a notebook or a script (functions the ranks run must be importable, see
:mod:`dpkit.ddp.workload`; a script must start ranks under ``if __name__ == "__main__":``)::

    from dpkit import ddp
    result = ddp.run_ddp("mlp", nproc=2, batch=64, steps=3)     # or "cnn", "transformer"
    result.trace.summary(); result.trace.memory_summary(); dpkit.viz.timeline(result.trace)
    print(ddp.compare_with_data_parallel("mlp", nproc=2, batch=64))  # DP vs DDP, interleaved
    both = ddp.compare_with_data_parallel("mlp", sweep_caps_mb=(0.1, 0.001))  # + more caps,
    print(both.sweep_rows())                                  # by the same ranks: one launch
    print(ddp.bucket_sweep((0.001, 0.1, 25)))                       # all-reduces per cap

From the shell::

    dpkit ddp --nproc 2 --batch 64 --model mlp --bucket-mb 25 --out runs/ddp
    dpkit ddp --nnodes 2 --nproc 2 --out runs/nodes     # two "nodes", a torchrun each
    torchrun --nproc_per_node=2 -m dpkit.ddp.train --out runs/ddp     # as clusters launch
    bash scripts/two_nodes_localhost.sh runs/two_nodes                # two nodes, one machine
    torchrun --nproc_per_node=4 examples/ddp_recipe.py    # the migration recipe (notebook 09)
    python -m dpkit.ddp.plan --model wide-mlp --hardware 2x8xA100-10GbE --batch 512

Safe by default: the ranks of ``run_ddp`` and the comparisons meet through a file, and
their own connections stay on the loopback interface; nothing a run started outlives it
(docs/ddp_clusters.md: ``dpkit ddp --nnodes`` and ``run_ddp(port=P)`` host torch's store
on 127.0.0.1 alone; a plain ``torchrun`` listens on every interface).

=================  ==================================================================
``workload``       what every rank trains: model, data, optimizer, step (importable)
``checks``         world size, backend and port checked before anything starts
``launch``         the rank processes: started, watched, stopped; errors name the rank
``process``        a rank process's life: its stage, its error, its parent's death
``rank``           inside a rank: the group, then a DDP model per run, trained
``record``         the recorder on DDP's and autograd's hooks: phases, memory, clock
``hook``           the communication hook: one ``allreduce`` event per bucket (or PowerSGD)
``run``            ``run_ddp``: the ranks' records merged into one Trace
``compare``        DataParallel vs DDP side by side; the bucket size sweep
``settings``       DDP's settings side by side, one launch: forward cost, bytes, error
``command``        ``dpkit ddp``
``train``          the script ``torchrun`` starts, one per rank
``nodes``          several "nodes" on this machine: a ``torchrun`` per node, on 127.0.0.1
``script``         a script's ``main`` on N ranks from the fork server, as torchrun runs it
``sharding``       ZeRO-1 and FSDP beside DDP: each rank's bytes measured and predicted
``plan``           which engine for a model, batch and machine: predicted, and the choice
=================  ==================================================================
"""

from dpkit.ddp.compare import (
    assign_buckets,
    bucket_sweep,
    compare_with_data_parallel,
    single_process_gradients,
    step_rows,
    traffic_per_device,
)
from dpkit.ddp.launch import RankFailed, RanksTimedOut
from dpkit.ddp.process import child_processes
from dpkit.ddp.run import run_ddp
from dpkit.ddp.workload import named_workload, wide_mlp

# isort: split
# Reachable as dpkit.ddp.name, not in __all__: the results' types, and the pieces of a run
# (its workload's parts, the port, merging the ranks' records) that the tests reach.
from dpkit.ddp.checks import free_port as free_port
from dpkit.ddp.compare import Comparison as Comparison
from dpkit.ddp.run import DDPResult as DDPResult
from dpkit.ddp.run import merged_trace as merged_trace
from dpkit.ddp.workload import DDP_MODELS as DDP_MODELS
from dpkit.ddp.workload import MODELS as MODELS
from dpkit.ddp.workload import Workload as Workload
from dpkit.ddp.workload import random_images as random_images
from dpkit.ddp.workload import sgd as sgd
from dpkit.ddp.workload import training_step as training_step

# What a learner calls (notebook 09 and docs/ddp_clusters.md), and the errors a run raises.
__all__ = [
    "RankFailed",
    "RanksTimedOut",
    "assign_buckets",
    "bucket_sweep",
    "child_processes",
    "compare_with_data_parallel",
    "named_workload",
    "run_ddp",
    "single_process_gradients",
    "step_rows",
    "traffic_per_device",
    "wide_mlp",
]
