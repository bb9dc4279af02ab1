"""The course as a static site: ``make site`` (or ``python scripts/course_site.py OUT``).

Every notebook in ``notebooks/`` rendered to HTML with its stored outputs (nbconvert's classic
template: its images carry the ``alt`` stored with them, which the lab template of nbconvert
7.17 leaves out), plus ``index.html`` listing them in
order with each notebook's title and first paragraph. Nothing is executed: the pages show
what ``make notebooks`` stored, which the tests keep fresh. Widgets show the state stored
with the notebook (nbconvert's widget manager, loaded from a CDN when the page is opened
online; the stored text otherwise), so the pages read without a kernel.

Figures keep their text alternatives: ``dpkit.viz`` stores each figure's description as
the image's ``alt`` (nbconvert writes it into the ``<img>``), and the build reports every
image left without one (``--strict`` makes that an error).

Launch links: with ``--repository https://github.com/OWNER/NAME`` (and ``--branch``), each
page and the index get "Open in Colab" and "Launch Binder" links for that repository's copy
of the notebook. Without it the pages say how to add them: the course has no address of its
own, an instructor's fork or hand-out does.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# what nbconvert writes into an <img> whose output had no alt of its own
NO_ALT = "No description has been provided"
GITHUB = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+?)(\.git)?/?$")


class _Images(HTMLParser):
    """Collects each ``<img>``'s ``alt`` (None when it has none)."""

    def __init__(self) -> None:
        super().__init__()
        self.alts: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.alts.append(dict(attrs).get("alt"))


def images_without_alt(page: str) -> int:
    """How many images of an HTML page have no text alternative: no ``alt``, an empty one,
    or nbconvert's placeholder for an output that gave none."""
    parser = _Images()
    parser.feed(page)
    return sum(1 for alt in parser.alts if not (alt or "").strip() or alt.startswith(NO_ALT))


def launch_links(repository: str | None, branch: str, notebook: str) -> str:
    """The page's launch links as HTML: Colab and Binder for ``repository``'s copy."""
    if repository is None:
        return (
            "<p>Launch links: build with <code>make site REPOSITORY=https://github.com/OWNER/"
            "NAME</code> to link each page to your copy on Colab and Binder.</p>"
        )
    owner, name = parse_repository(repository)
    path = f"notebooks/{notebook}"
    colab = f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/{path}"
    binder = f"https://mybinder.org/v2/gh/{owner}/{name}/{branch}?labpath={quote(path, safe='')}"
    return (
        f'<p><a href="{html.escape(colab)}">Open in Colab</a> · '
        f'<a href="{html.escape(binder)}">Launch Binder</a></p>'
    )


def parse_repository(repository: str) -> tuple[str, str]:
    """``(owner, name)`` of a GitHub repository URL, or a ValueError that shows the form."""
    match = GITHUB.match(repository)
    if match is None:
        raise ValueError(
            f"--repository {repository!r} is not a GitHub repository URL; give it as "
            "https://github.com/OWNER/NAME (Colab and Binder open notebooks from GitHub)"
        )
    return match.group(1), match.group(2)


def title_and_summary(notebook: nbformat.NotebookNode) -> tuple[str, str]:
    """The first markdown cell's heading and its first paragraph after the heading."""
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.strip().splitlines()
        if not lines or not lines[0].startswith("#"):
            continue
        title = lines[0].lstrip("#").strip()
        paragraph = []
        for line in lines[1:]:
            if line.strip():
                paragraph.append(line.strip())
            elif paragraph:
                break
        return title, " ".join(paragraph)
    return "", ""


def build(out: Path, repository: str | None, branch: str, notebooks: list[Path]) -> dict[str, int]:
    """Write a page per notebook and the index into ``out``; images without alt per page."""
    if repository is not None:
        parse_repository(repository)  # refuse a bad address before writing anything
    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="classic")
    missing: dict[str, int] = {}
    entries = []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        title, summary = title_and_summary(notebook)
        body, _ = exporter.from_notebook_node(notebook, resources={"metadata": {"name": title}})
        links = launch_links(repository, branch, path.name)
        nav = f'<nav style="margin:1em 2em"><a href="index.html">All notebooks</a>{links}</nav>'
        opening = re.search(r"<body[^>]*>", body)
        if opening is not None:  # the navigation first in the page's body
            body = body[: opening.end()] + nav + body[opening.end() :]
        page = out / f"{path.stem}.html"
        page.write_text(body, encoding="utf-8")
        missing[page.name] = images_without_alt(body)
        entries.append(
            f'<li><a href="{page.name}">{html.escape(title or path.stem)}</a>'
            f"<p>{html.escape(summary)}</p>{launch_links(repository, branch, path.name)}</li>"
        )
    index = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>dpkit: data parallelism in PyTorch, the course</title></head>"
        '<body style="max-width:50em;margin:2em auto;font-family:sans-serif">'
        "<h1>dpkit: data parallelism in PyTorch</h1>"
        "<p>The course's notebooks with the outputs stored when they last ran on CPU lanes; "
        "run them yourself to see your machine's numbers.</p>"
        f"<ol>{''.join(entries)}</ol></body></html>\n"
    )
    (out / "index.html").write_text(index, encoding="utf-8")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write the site into")
    parser.add_argument("--repository", help="https://github.com/OWNER/NAME, for launch links")
    parser.add_argument("--branch", default="main", help="the branch the links open (main)")
    parser.add_argument("--strict", action="store_true", help="fail on an image without alt")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook")
    args = parser.parse_intermixed_args(argv)
    notebooks = args.notebooks or sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    try:
        missing = build(args.out, args.repository, args.branch, notebooks)
    except ValueError as error:
        print(f"site: {error}", file=sys.stderr)
        return 2
    without = {page: count for page, count in missing.items() if count}
    print(f"site: {len(missing)} pages and index.html in {args.out}")
    for page, count in without.items():
        print(f"site: {page}: {count} image(s) without a text alternative", file=sys.stderr)
    return 1 if without and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
