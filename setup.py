"""Builds dpkit with the course inside: the wheel carries the notebooks and the exercises
(stubs, graders; never the solutions) as package data in dpkit/_course, for `dpkit course DIR`
(dpkit/course.py). Everything else is in pyproject.toml."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithCourse(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own files
        # The same patterns `dpkit course` reads, from the file itself: importing the dpkit
        # package would import torch, which the build environment does not have.
        spec = importlib.util.spec_from_file_location("course", ROOT / "dpkit" / "course.py")
        course = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(course)
        target = Path(self.build_lib) / "dpkit" / "_course"
        for path in course.course_files(ROOT):
            (target / path).parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(ROOT / path), str(target / path))


setup(cmdclass={"build_py": BuildWithCourse})
