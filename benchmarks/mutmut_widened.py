"""``mutmut run``, with each function's tests widened to every test of their files.

mutmut links a test to the functions that run while it runs. A fixture shared by a test file
(``scope="module"``) runs inside the first test that asks for it, so the file's other tests,
which check what it made, were never run against a mutant of its functions: the audit counted
mutants of ``compare_with_data_parallel`` as surviving that its memory test catches.
``benchmarks/mutation.py`` runs this file in mutmut's place, with mutmut's arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def widened(tests_by_function: dict[str, set[str]], all_tests: Iterable[str]) -> None:
    """Each function's tests widened, in place, to every test of the files they are in (a
    function no test calls keeps none: "no tests")."""
    by_file: dict[str, set[str]] = {}
    for test in all_tests:
        by_file.setdefault(test.split("::")[0], set()).add(test)
    for tests in tests_by_function.values():
        files = {test.split("::")[0] for test in tests}
        tests.update(*(by_file.get(name, ()) for name in files))


def main() -> None:
    import mutmut.__main__ as mutmut
    from mutmut.state import state
    from mutmut.stats import save_stats

    collect = mutmut.collect_or_load_stats

    def collect_widened(runner: object, **options: object) -> None:
        collect(runner, **options)  # mutmut's stats, collected or loaded; then widened
        widened(state().tests_by_mangled_function_name, state().duration_by_test)
        save_stats()

    mutmut.collect_or_load_stats = collect_widened
    mutmut.cli()


if __name__ == "__main__":
    sys.path[0] = ""  # as ``python -c``: the working directory (mutmut's copy), not this folder
    main()
