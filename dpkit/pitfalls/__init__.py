"""DataParallel's classic surprises, each reproduced on dpkit's devices (notebook 08).

The surprise first: almost every one of them comes from three facts. The module is
replicated on every forward and the replicas are thrown away; each replica runs in a thread
of its own on a chunk of the batch; and the outputs are gathered by a function that knows
tensors and a few containers only. This package holds what the notebook's sections share:

- :mod:`~dpkit.pitfalls.catalogue`: one entry per pitfall (symptom, title, reports behind
  it), printed as the notebook's table of contents and reading list;
- :func:`attempt`: run one call and show what it returned or raised, as a user sees it;
  :func:`replicas_run`: how many replicas a call ran (0: it bypassed DataParallel);
- :func:`compare_step_times`: DataParallel's step time against one device's, with the
  run-to-run spread;
- :mod:`~dpkit.pitfalls.models`: small modules in a broken and a fixed form.
"""

from dpkit.pitfalls.catalogue import (
    PITFALLS,
    Link,
    Pitfall,
    contents,
    pitfall,
    reading_list,
)
from dpkit.pitfalls.models import (
    ChunkLoss,
    Classifier,
    LabelledOutput,
    PackedEncoder,
    RemembersFeatures,
)
from dpkit.pitfalls.outcome import Outcome, attempt, describe, replicas_run
from dpkit.pitfalls.timing import StepComparison, Timing, compare_step_times

__all__ = [
    "PITFALLS",
    "ChunkLoss",
    "Classifier",
    "LabelledOutput",
    "Link",
    "Outcome",
    "PackedEncoder",
    "Pitfall",
    "RemembersFeatures",
    "StepComparison",
    "Timing",
    "attempt",
    "compare_step_times",
    "contents",
    "describe",
    "pitfall",
    "reading_list",
    "replicas_run",
]
