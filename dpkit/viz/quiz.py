""" "Check your understanding": questions whose answers stay hidden until the learner asks.

Each question is a button; pressing it reveals the answer (and pressing again hides it).
Answers may hold numbers the notebook computed, passed in as f-strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Question:
    text: str
    answer: str


def _question_widget(number: int, question: Question) -> Any:
    import ipywidgets as widgets

    answer = widgets.HTML(value=f"<p>{question.answer}</p>", layout=widgets.Layout(display="none"))
    button = widgets.ToggleButton(
        value=False, description="Show answer", icon="eye", layout=widgets.Layout(width="140px")
    )

    def toggle(change: dict[str, Any]) -> None:
        answer.layout.display = None if change["new"] else "none"
        button.description = "Hide answer" if change["new"] else "Show answer"

    button.observe(toggle, names="value")
    prompt = widgets.HTML(value=f"<b>{number}.</b> {question.text}")
    return widgets.VBox([prompt, button, answer])


def check_your_understanding(questions: Sequence[Question]) -> Any:
    """A column of questions, each with a button that reveals its answer."""
    import ipywidgets as widgets

    if not questions:
        raise ValueError("questions is empty; pass at least one Question(text, answer)")
    title = widgets.HTML(value="<h3>Check your understanding</h3>")
    items = [_question_widget(i, q) for i, q in enumerate(questions, start=1)]
    return widgets.VBox([title, *items])
