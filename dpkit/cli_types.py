"""What the command-line tools share: argparse types (argparse names the option in its
error), the check that a folder can be written, counted nouns and a help formatter."""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path


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


def writable_folder(text: str, name: str, example: str) -> Path:
    """``text`` resolved, made if missing, and proven writable by writing a file there.

    A command calls it before any work, so a folder it cannot write is refused at once, not
    after training; the ValueError names the argument ``name`` (``--out``, ``FOLDER``) and
    shows ``example`` as the fix. An empty ``text`` is refused too: ``Path("")`` is the
    current folder, which nobody means by an empty argument (an unset shell variable).
    """
    if not text.strip():
        raise ValueError(f"{name} is empty; give a folder, e.g. {example}")
    folder = Path(text).expanduser().resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dpkit-write-test-"):
            pass
    except FileExistsError:  # mkdir's answer when a file has the folder's name
        raise ValueError(
            f"{name} {text}: is a file, not a folder; give a folder, e.g. {example}"
        ) from None
    except OSError as error:
        raise ValueError(
            f"{name} {text}: cannot write there ({error.strerror or error}); give a folder "
            f"you can write, e.g. {example}"
        ) from None
    return folder


def in_flags(message: str, flags: Mapping[str, str]) -> str:
    """``message`` of a Python API's check with the arguments it names written as the
    command's ``flags``: "nproc=4 ...; use nproc<=2" becomes "--nproc 4 ...; use --nproc 2 or
    fewer", "strategy='dp'" becomes "--strategy dp"."""
    names = "|".join(map(re.escape, flags))
    pattern = re.compile(r"\b(" + names + r")(<=|=)'?([\w.+-]+)'?")

    def flag(match: re.Match) -> str:
        name, sign, value = match.groups()
        return f"{flags[name]} {value}" + (" or fewer" if sign == "<=" else "")

    return pattern.sub(flag, message)


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, with an s unless there is one: "1 SGD step", "3 SGD steps"."""
    return f"{count:,d} {noun}" + ("" if count == 1 else "s")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default, except a default of None: "(default:
    None)" tells nothing, so such an option's own help says what None picks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)
