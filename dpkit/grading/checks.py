"""Helpers for writing grader checks whose failures read as hints, not as pytest output."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass
class Raised:
    """What :func:`must_raise` caught: the exception, once the block has run."""

    value: BaseException | None = None


@contextmanager
def must_raise(
    expected: type[BaseException] | tuple[type[BaseException], ...], call: str, why: str
) -> Iterator[Raised]:
    """Like ``pytest.raises``, but a miss fails with a hint naming the input.

    ``call`` is what the block calls, as the student would write it
    (``"gather(['a string', 'b'], lanes[0])"``); ``why`` says what the code must do.
    "DID NOT RAISE" is pytest's text; this says "gather(['a string', 'b'], lanes[0])
    returned without raising TypeError: ...". Any other exception goes through unchanged
    (a stub's NotImplementedError still reads as "not implemented yet").
    """
    names = " or ".join(
        e.__name__ for e in (expected if isinstance(expected, tuple) else (expected,))
    )
    raised = Raised()
    try:
        yield raised
    except expected as error:
        raised.value = error
        return
    pytest.fail(f"{call} returned without raising {names}: {why}", pytrace=False)
