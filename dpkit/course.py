"""The course's files for a pip install: ``dpkit course DIR`` writes them where a learner works.

A wheel of dpkit carries the notebooks, the exercises (stubs, graders, their README; never
the solutions) and the examples notebook 09 runs as package data in ``dpkit/_course``
(``setup.py`` copies them there when the wheel is built), so ``pip install dpkit`` then
``dpkit course my-course`` and ``jupyter lab`` in it give the whole course without git. From
a checkout (an editable install) the files come from the checkout itself. ``dpkit grade N``
run inside the folder finds its ``exercises/``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# What a learner gets, by folder: the same patterns setup.py packs into the wheel.
COURSE_FILES: dict[str, tuple[str, ...]] = {
    "notebooks": ("*.ipynb", "README.md", "GLOSSARY.md"),
    "exercises": ("README.md", "task*_*.py", "graders/*.py"),
    "examples": ("*.py", "cluster/*"),  # the DDP recipe notebook 09 runs, and its launch files
}
PACKED = Path(__file__).resolve().parent / "_course"  # in a built wheel
CHECKOUT = Path(__file__).resolve().parent.parent  # an editable install's repository


def course_source() -> Path:
    """Where the course's files are: the wheel's package data, else the checkout."""
    for root in (PACKED, CHECKOUT):
        if (root / "notebooks").is_dir() and (root / "exercises" / "graders").is_dir():
            return root
    raise FileNotFoundError(
        f"this dpkit has no course files (looked in {PACKED} and {CHECKOUT}); install dpkit "
        "from a wheel built by `pip wheel .` in a checkout, or clone the repository"
    )


def course_files(root: Path) -> list[Path]:
    """The course's files under ``root``, relative to it, sorted."""
    found = {
        path.relative_to(root)
        for folder, patterns in COURSE_FILES.items()
        for pattern in patterns
        for path in (root / folder).glob(pattern)
        if path.is_file()
    }
    return sorted(found)


def write_course(target: str | Path, overwrite: bool = False) -> list[Path]:
    """Copy the notebooks and exercises into ``target`` (made if missing) and return what was
    written. Files already there are left alone and reported unless ``overwrite``: a
    learner's edited notebook or exercise must not be lost to a second run. What is in the
    way is refused (a ValueError) before anything is written."""
    if not str(target).strip():  # Path("") is the current folder: nobody means that by ""
        raise ValueError("target is empty; give a folder for the course, e.g. 'my-course'")
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"target={str(target)!r} is a file; give a folder for the course")
    source = course_source()
    files = course_files(source)
    # Checked before anything is written: a file where the course needs a folder (or a
    # folder where it needs a file) would stop the copy halfway, and --overwrite only
    # replaces files.
    folders = {parent for path in files for parent in path.parents if parent != Path(".")}
    blocked = [f for f in sorted(folders) if (target / f).exists() and not (target / f).is_dir()]
    blocked += [path for path in files if (target / path).is_dir()]
    if blocked:
        there, needed = ("a folder", "file") if blocked[0] in files else ("a file", "folder")
        raise ValueError(
            f"{target}: {blocked[0]} is {there}, and the course needs a {needed} there; "
            "move it away or choose another folder for the course"
        )
    clashes = [path for path in files if (target / path).exists()]
    if clashes and not overwrite:
        shown = ", ".join(str(path) for path in clashes[:3])
        more = f" and {len(clashes) - 3} more" if len(clashes) > 3 else ""
        raise ValueError(
            f"{target} already holds {shown}{more}; choose an empty folder, or pass "
            "--overwrite to replace them with the originals (your edits to them are lost)"
        )
    for path in files:
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / path, target / path)
    return files
