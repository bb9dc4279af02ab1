"""argparse types the command-line tools share (argparse names the option in its error)."""

from __future__ import annotations

import argparse


def at_least_one(text: str) -> int:
    """An argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def more_than_zero(text: str) -> float:
    """An argparse type: a number > 0 (not NaN); an infinite one is for the option's own check
    to refuse in its words."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value
