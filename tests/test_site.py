"""The course as a static site (scripts/course_site.py, ``make site``): a page per notebook with its
stored outputs, an index in course order, launch links for a GitHub copy, and every image
without a text alternative reported."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("site_builder", ROOT / "scripts" / "course_site.py")
site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(site)

FIRST, SECOND = ROOT / "notebooks" / "00_start_here.ipynb", ROOT / "notebooks" / "01_scatter.ipynb"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    repository = "https://github.com/example-school/dp-course"
    course = sorted(str(path) for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    # The whole course, as make site builds it: --strict holds every figure of every notebook
    # to a text alternative.
    status = site.main([str(out), "--strict", "--repository", repository, *course])
    return out, status


def test_a_page_per_notebook_with_its_stored_outputs_and_an_index_in_order(built):
    out, status = built
    assert status == 0  # --strict: every figure kept its text alternative
    index = (out / "index.html").read_text()
    for notebook in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        assert f'href="{notebook.stem}.html"' in index and (out / f"{notebook.stem}.html").exists()
    assert index.index('href="00_start_here.html"') < index.index('href="01_scatter.html"')
    page = (out / "01_scatter.html").read_text()
    stored = "".join(
        "".join(o.get("text", "")) for c in site.nbformat.read(SECOND, 4).cells
        for o in c.get("outputs", []) if o.get("output_type") == "stream"
    )  # fmt: skip
    line = next(text for text in stored.splitlines() if len(text.strip()) > 20)
    assert site.html.escape(line.strip()) in page  # an output the notebook stored
    assert 'href="index.html"' in page


def test_launch_links_open_the_notebook_of_the_given_repository(built):
    out, _ = built
    page = (out / "00_start_here.html").read_text()
    assert (
        "https://colab.research.google.com/github/example-school/dp-course/blob/main/"
        "notebooks/00_start_here.ipynb" in page
    )
    assert (
        "https://mybinder.org/v2/gh/example-school/dp-course/main?labpath=notebooks%2F00_start_here.ipynb"
        in page
    )


def test_without_a_repository_the_pages_say_how_to_get_links():
    text = site.launch_links(None, "main", "00_start_here.ipynb")
    assert "REPOSITORY=https://github.com/OWNER/NAME" in text and "colab" not in text


def test_an_address_that_is_not_on_github_is_refused_before_anything_is_written(tmp_path, capsys):
    status = site.main([str(tmp_path / "out"), "--repository", "gitlab.com/x/y", str(FIRST)])
    assert status == 2 and not (tmp_path / "out").exists()
    assert "https://github.com/OWNER/NAME" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tag", "missing"),
    [
        ('<img src="a.png">', 1),
        ('<img src="a.png" alt="  ">', 1),
        ('<img src="a.png" alt="No description has been provided for this image">', 1),
        ('<img src="a.png" alt="Timeline of step 2 on 4 virtual lanes">', 0),
    ],
)
def test_images_without_a_text_alternative_are_counted(tag, missing):
    assert site.images_without_alt(f"<p>{tag}</p>") == missing
