"""Task N: the batch's mean loss from the losses of the replicas.

Goal: turn the losses DataParallel gathers, one per replica, into the mean loss of the
whole batch. The surprise: ``loss.mean()`` of the gathered vector averages per-replica
means, and that is the batch's mean only when every chunk has the same size. 10 rows over
4 devices make chunks of 3, 3, 3 and 1 rows, so the row alone in the last chunk weighs
three times as much as any other row.

You may use torch, but not ``dpkit.DataParallel``. Grade your work with ``dpkit grade N``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def batch_mean(replica_means: torch.Tensor, chunk_sizes: Sequence[int]) -> torch.Tensor:
    """The mean over the whole batch, from each replica's mean over its chunk.

    ``replica_means[i]`` is the mean over chunk ``i``, which had ``chunk_sizes[i]`` rows, so
    ``batch_mean(torch.tensor([1.0, 2.0]), [3, 1])`` is ``(3 * 1.0 + 1 * 2.0) / 4 = 1.25``,
    not ``1.5``. Gradients flow back to ``replica_means``. Raises ``ValueError`` naming
    ``chunk_sizes`` when it does not have one size per mean.
    """
    # TODO N.1: weigh each replica's mean by its chunk's rows and divide by the batch size
    raise NotImplementedError(
        "TODO N.1: weigh each replica's mean by its chunk's rows and divide by the batch size"
    )


def mean_of_means_error(replica_means: torch.Tensor, chunk_sizes: Sequence[int]) -> float:
    """How far ``replica_means.mean()`` is from :func:`batch_mean`, as a Python float.

    Zero when every chunk has the same size; ``mean_of_means_error(torch.tensor([1.0, 2.0]),
    [3, 1])`` is ``1.5 - 1.25 = 0.25``.
    """
    # TODO N.2: return replica_means.mean() minus batch_mean(...), as a float
    raise NotImplementedError(
        "TODO N.2: return replica_means.mean() minus batch_mean(...), as a float"
    )
