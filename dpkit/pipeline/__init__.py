"""dpkit.pipeline: model parallelism, by contrast with data parallelism.

The surprise first: a model split over devices keeps only one of them busy at a time
unless the batch is cut into micro-batches, and even then a *bubble* of idle time remains,
``(p - 1) / (m + p - 1)`` of the step for p equal stages and m micro-batches (GPipe). Data
parallelism has no bubble: every device runs the whole model on its share of the batch.
The price of each is in what it sends (:mod:`dpkit.pipeline.contrast`)::

    import dpkit
    from dpkit import pipeline as pp
    model = pp.mlp_blocks(width=512, blocks=4)                  # an nn.Sequential
    pipe = pp.pipeline(model, dpkit.virtual_devices(2), micro_batches=4)
    with dpkit.trace() as tr:
        pipe.step(x, y)                                           # forward + backward
    pp.idle_fraction(tr), pp.bubble_formula(2, 4)                 # measured, formula
    dpkit.viz.timeline(tr)                                        # a track per stage

=================  ==================================================================
``stages``         cutting an ``nn.Sequential`` into balanced stages, placing them
``schedule``       :class:`Pipeline`: a thread per stage, GPipe's schedule, traced
``bubble``         idle share measured from a trace, the formula, a predicted schedule
``contrast``       DataParallel vs DDP vs a model split: holds, sends, bytes, fits
=================  ==================================================================

Not built on ``torch.distributed`` point-to-point: the stages are lanes (threads) in one
process, like DataParallel's, so a learner sees the schedule without starting processes.
"""

from dpkit.pipeline.bubble import (
    bubble_formula,
    bubble_sweep,
    idle_fraction,
    measure_steps,
    predict_schedule,
    single_device_gradients,
    stage_times,
)
from dpkit.pipeline.contrast import contrast_table
from dpkit.pipeline.schedule import StageFailed, pipeline
from dpkit.pipeline.stages import mlp_blocks

# isort: split
# Reachable as dpkit.pipeline.name, not in __all__: the class pipeline() returns, and the
# parts behind the functions above (cutting a model, busy time, the bytes at a cut).
from dpkit.pipeline.bubble import busy_seconds as busy_seconds
from dpkit.pipeline.contrast import cut_activation_bytes as cut_activation_bytes
from dpkit.pipeline.schedule import Pipeline as Pipeline
from dpkit.pipeline.stages import split_model as split_model
from dpkit.pipeline.stages import split_points as split_points

# What notebook 07 calls, and the error a failing stage raises.
__all__ = [
    "StageFailed",
    "bubble_formula",
    "bubble_sweep",
    "contrast_table",
    "idle_fraction",
    "measure_steps",
    "mlp_blocks",
    "pipeline",
    "predict_schedule",
    "single_device_gradients",
    "stage_times",
]
