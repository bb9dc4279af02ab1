"""The cost model: predict a DataParallel or DDP step on hardware you may not have.

The surprise first: a prediction is a :class:`~dpkit.tracing.Trace`, the same kind of object
``dpkit.trace()`` records, with every event marked predicted. Its bytes are exact (they follow
from the model's tensors); its times come from FLOPs, bytes, link bandwidths and latencies,
and host overheads, each either measured on this machine (:func:`calibrate`) or taken from
a spec sheet or a published measurement (:func:`presets`, every number cited)::

    import dpkit.cost as cost
    tr = cost.predict(model, x[:1], batch_size=256, devices=8, hardware="8xA100-SXM-NVLink")
    print(tr.summary()); dpkit.viz.timeline(tr)            # titled "predicted devices ..."
    here = cost.calibrate()                               # this machine's virtual CPU lanes
    cost.predict(model, x[:1], 256, 4, here).step_time    # seconds, to set beside a measurement

Its parts, a file each: ``hardware``, ``catalog`` (the presets, cited), ``profiling`` (FLOPs
and bytes), ``collectives`` and ``compute`` (the formulas), ``memory``, ``prediction`` (the
step), ``calibration``, ``cli`` (``dpkit predict``). Its accuracy: ``benchmarks/README.md``.
"""

from dpkit.cost.calibration import calibrate
from dpkit.cost.catalog import preset, presets
from dpkit.cost.collectives import (
    allreduce,
    broadcast,
    bus_bandwidth,
    reduce,
    ring_allreduce,
    ring_bytes_sent,
)
from dpkit.cost.hardware import Hardware, Link
from dpkit.cost.prediction import PredictedTrace, allreduce_schedule, ddp_buckets, predict
from dpkit.cost.profiling import Profile, profile

__all__ = ["Hardware", "Link", "PredictedTrace", "Profile", "allreduce", "allreduce_schedule",
           "broadcast", "bus_bandwidth", "calibrate", "ddp_buckets", "predict", "preset",
           "presets", "profile", "reduce", "ring_allreduce", "ring_bytes_sent"]  # fmt: skip
