"""Grader for task N: the batch's mean loss from the losses of the replicas.

Each check's docstring is its name in the report; each assertion message is the hint a
student reads, so it says what was expected and what to do.
"""

import pytest
import torch

pytestmark = pytest.mark.taskN
EXERCISE = "taskN_topic.py"
# Functions that would do the task for the student, as "module.function" (task 4 lists
# "dpkit.gather.gather"): a submission that calls one, or names it in its source, fails with a
# hint. This task has none to forbid: torch has no weighted mean of means.
FORBIDDEN: tuple[str, ...] = ()


def chunk_means(values: torch.Tensor, num_devices: int) -> tuple[torch.Tensor, list[int]]:
    """Each chunk's mean and size, chunked as DataParallel's scatter does (torch.chunk)."""
    chunks = values.chunk(num_devices)
    return torch.stack([chunk.mean() for chunk in chunks]), [len(chunk) for chunk in chunks]


def test_batch_mean_example(exercise):
    """batch_mean weighs each mean by its chunk's rows"""
    got = exercise.batch_mean(torch.tensor([1.0, 2.0]), [3, 1])
    assert torch.isclose(torch.as_tensor(got), torch.tensor(1.25)), (
        f"batch_mean([1.0, 2.0], [3, 1]) returned {got}, expected 1.25 = (3 * 1.0 + 1 * 2.0) / 4: "
        "weigh each mean by its chunk's rows"
    )


@pytest.mark.parametrize("batch", [10, 7, 16])
def test_batch_mean_is_the_mean_of_the_batch(exercise, batch):
    """batch_mean equals the mean over the whole batch"""
    values = torch.randn(batch, generator=torch.Generator().manual_seed(batch))
    means, sizes = chunk_means(values, 4)
    got = exercise.batch_mean(means, sizes)
    assert torch.isclose(torch.as_tensor(got), values.mean(), atol=1e-6), (
        f"for chunks of {sizes} rows batch_mean gave {float(got):.6f}, the batch's mean is "
        f"{values.mean().item():.6f}"
    )


def test_gradients_reach_each_replica(exercise):
    """gradients flow back to each replica's mean, weighted by its rows"""
    means = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    exercise.batch_mean(means, [3, 3, 3, 1]).backward()
    want = torch.tensor([3.0, 3.0, 3.0, 1.0]) / 10
    assert means.grad is not None, "no gradient reached replica_means: avoid .item() and .detach()"
    assert torch.allclose(means.grad, want), (
        f"replica_means got gradients {means.grad.tolist()}, expected rows / batch = "
        f"{want.tolist()}"
    )


def test_mismatched_sizes_are_a_clear_error(exercise):
    """batch_mean rejects one size too few, naming chunk_sizes"""
    with pytest.raises(ValueError, match="chunk_sizes"):
        exercise.batch_mean(torch.tensor([1.0, 2.0, 3.0]), [3, 3])


def test_mean_of_means_error(exercise):
    """mean_of_means_error is zero for equal chunks and not for 3, 3, 3, 1"""
    equal = exercise.mean_of_means_error(torch.tensor([1.0, 2.0, 3.0, 4.0]), [2, 2, 2, 2])
    assert abs(equal) < 1e-6, f"equal chunks gave an error of {equal}, expected 0"
    uneven = exercise.mean_of_means_error(torch.tensor([1.0, 2.0]), [3, 1])
    assert isinstance(uneven, float), f"return a float (use .item()), not {type(uneven).__name__}"
    assert abs(uneven - 0.25) < 1e-6, f"means [1, 2] over chunks of [3, 1] gave {uneven}, not 0.25"
