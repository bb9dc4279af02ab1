"""A figure shown in a notebook carries its text alternative, as an explorer's does.

An explorer shows its figure's text alternative (:mod:`dpkit.viz.alt_text`) under the image
in a collapsed "Text description of the figure". A figure a cell returns directly
(``viz.memory_figure(run)``) is shown by the kernel's own formatter, as a bare PNG: no alt
text, since JupyterLab's image output has none to give (JupyterLab 4.6 sets only ``src``,
``width`` and ``height``). :func:`describe_figures` makes the kernel show every matplotlib
figure with the same two things:

- the image, with the text as its ``alt`` in the output's metadata (what nbconvert's HTML
  export and Voila write into the ``<img>``, nbconvert#1112);
- under it, the collapsed description the explorers show, as an ``ipywidgets.HTML`` as in an
  explorer (without ipywidgets: as HTML). Its plain-text form is a fixed line naming it, so
  that stored outputs compare equal on every machine (nbval compares text, never metadata or
  a widget's view): the description holds measured times and the hardware's name.

``import dpkit.viz`` calls it when a kernel is running, so no notebook cell has to.
"""

from __future__ import annotations

import sys
from typing import Any

from matplotlib.figure import Figure

from dpkit.viz.alt_text import alt_text_html, figure_alt_text

# The description's text/plain, what a text-only view and nbval read: fixed (see above)
DESCRIPTION_PLAIN = "[Text description of the figure: under it, as in the explorers]"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")


def _running_shell() -> Any:
    """The IPython shell this code runs in, or None (IPython is not imported for the asking)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def describe_figures(shell: Any = None) -> bool:
    """Show every matplotlib figure in ``shell`` (default: the running kernel) with its text
    alternative; whether there was a shell to do it in. Calling it again changes nothing."""
    shell = shell if shell is not None else _running_shell()
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    shell.display_formatter.ipython_display_formatter.for_type(Figure, show_described)
    return True


def figure_bundle(figure: Figure, shell: Any, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figure as the kernel's own formatters write it (the inline backend's PNG, its
    ``<Figure ...>`` text), with ``text`` as each image's ``alt``."""
    display_formatter = shell.display_formatter
    ours = display_formatter.ipython_display_formatter
    ours.enabled = False  # format it as if this module were not there
    try:
        data, metadata = display_formatter.format(figure)
    finally:
        ours.enabled = True
    for mime in IMAGE_TYPES:
        if mime in data:
            metadata[mime] = {**metadata.get(mime, {}), "alt": text}
    return data, metadata


def description_bundle(text: str) -> dict[str, Any]:
    """The collapsed description an explorer shows under its image, as a display bundle."""
    try:
        import ipywidgets as widgets
    except ImportError:
        return {"text/html": alt_text_html(text), "text/plain": DESCRIPTION_PLAIN}
    bundle = widgets.HTML(value=alt_text_html(text))._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    return {**data, "text/plain": DESCRIPTION_PLAIN}


def show_described(figure: Figure) -> None:
    """Display ``figure`` as the kernel would, then its description under it."""
    from IPython.display import display

    try:
        text = figure_alt_text(figure)
    except Exception as error:  # a figure it cannot read is still shown, and says why
        text = f"No text description: reading the figure failed ({type(error).__name__}: {error})"
    data, metadata = figure_bundle(figure, _running_shell(), text)
    display(data, raw=True, metadata=metadata)
    display(description_bundle(text), raw=True)
