"""The colours that carry meaning stay apart for readers with a colour-vision deficiency.

A phase, a memory category or a measured/predicted series is told apart by colour (and by
a legend that repeats the colour), so two colours drawn in one figure must differ for every
reader. Each pair is measured as a CIEDE2000 difference (Sharma, Wu & Dalal, "The CIEDE2000
color-difference formula: implementation notes, supplementary test data, and mathematical
observations", Color Research & Application 30(1), 2005) between the colours as seen with
normal vision and as simulated for protanopia, deuteranopia and tritanopia by Machado,
Oliveira & Fernandes, "A physiologically-based model for simulation of color vision
deficiency", IEEE TVCG 15(6), 2009 (severity 1.0, applied to linear sRGB).

The threshold, ΔE00 >= 10: about 1 is just noticeable between large patches side by side,
and a legend swatch against a thin bar needs many times that. 10 is the margin the issue's
report used, and what published colour-blind-safe sets keep: Okabe & Ito's eight colours
differ by at least 10.9 under all three simulations (measured with this file's functions).
"""

from __future__ import annotations

import itertools
import math

import pytest
from matplotlib.colors import to_rgb

from dpkit import viz
from dpkit.tracing.events import PHASE_COLOURS, Phase
from dpkit.viz import beyond, figures, replicas, split

THRESHOLD = 10.0

# Machado et al. 2009, Table (severity 1.0): linear RGB -> linear RGB as the dichromat sees it.
MACHADO_2009 = {
    "protanopia": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
    "deuteranopia": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.011820, 0.042940, 0.968881),
    ),
    "tritanopia": (
        (1.255528, -0.076749, -0.178779),
        (-0.078411, 0.930809, 0.147602),
        (0.004733, 0.691367, 0.303900),
    ),
}
VISIONS = ("normal", *MACHADO_2009)

Lab = tuple[float, float, float]


def _linear(channel: float) -> float:
    """sRGB's transfer function undone (IEC 61966-2-1)."""
    return channel / 12.92 if channel <= 0.04045 else ((channel + 0.055) / 1.055) ** 2.4


def lab(colour: str, vision: str = "normal") -> Lab:
    """CIELAB (D65 white) of a matplotlib colour as seen with ``vision``."""
    rgb = [_linear(c) for c in to_rgb(colour)]
    if vision != "normal":
        matrix = MACHADO_2009[vision]
        rgb = [min(1.0, max(0.0, sum(m * c for m, c in zip(row, rgb)))) for row in matrix]
    r, g, b = rgb
    xyz = (
        (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047,
        0.2126729 * r + 0.7151522 * g + 0.0721750 * b,
        (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883,
    )
    epsilon = (6 / 29) ** 3  # CIE 15: below it, a straight line replaces the cube root
    fx, fy, fz = (t ** (1 / 3) if t > epsilon else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def ciede2000(first: Lab, second: Lab) -> float:
    """ΔE00 between two CIELAB colours (Sharma et al. 2005, equations 1-20; kL = kC = kH = 1)."""
    (l1, a1, b1), (l2, a2, b2) = first, second
    mean_c = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(mean_c**7 / (mean_c**7 + 25**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dh = 0.0 if c1p * c2p == 0 else (h2p - h1p + 180) % 360 - 180
    delta_l, delta_c = l2 - l1, c2p - c1p
    delta_h = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    mean_l, mean_cp = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        mean_h = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        mean_h = (h1p + h2p) / 2
    else:
        mean_h = (h1p + h2p + (360 if h1p + h2p < 360 else -360)) / 2
    t = (
        1
        - 0.17 * math.cos(math.radians(mean_h - 30))
        + 0.24 * math.cos(math.radians(2 * mean_h))
        + 0.32 * math.cos(math.radians(3 * mean_h + 6))
        - 0.20 * math.cos(math.radians(4 * mean_h - 63))
    )
    rotation = 30 * math.exp(-(((mean_h - 275) / 25) ** 2))
    rc = 2 * math.sqrt(mean_cp**7 / (mean_cp**7 + 25**7))
    sl = 1 + 0.015 * (mean_l - 50) ** 2 / math.sqrt(20 + (mean_l - 50) ** 2)
    sc, sh = 1 + 0.045 * mean_cp, 1 + 0.015 * mean_cp * t
    rt = -math.sin(math.radians(2 * rotation)) * rc
    return math.sqrt(
        (delta_l / sl) ** 2
        + (delta_c / sc) ** 2
        + (delta_h / sh) ** 2
        + rt * (delta_c / sc) * (delta_h / sh)
    )


def closest_pair(colours: dict[str, str], vision: str) -> tuple[float, str, str]:
    """The two entries of ``colours`` least apart as seen with ``vision``, and their ΔE00."""
    seen = {name: lab(colour, vision) for name, colour in colours.items()}
    return min((ciede2000(seen[a], seen[b]), a, b) for a, b in itertools.combinations(seen, 2))


# Sharma et al. 2005, Table 1: pairs 1, 7, 17, 25, 12 and 33 of their test data.
SHARMA_PAIRS = [
    ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
    ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
    ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
    ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
    ((50.0, 2.5, 0.0), (50.0, 0.0, -2.5), 4.3065),
    ((22.7233, 20.0904, -46.6940), (23.0331, 14.9730, -42.5619), 2.0373),
]


@pytest.mark.parametrize(("first", "second", "expected"), SHARMA_PAIRS)
def test_ciede2000_matches_the_published_test_data(
    first: Lab, second: Lab, expected: float
) -> None:
    assert ciede2000(first, second) == pytest.approx(expected, abs=1e-4)
    assert ciede2000(second, first) == pytest.approx(expected, abs=1e-4)


def test_lab_of_white_and_a_primary() -> None:
    assert lab("white") == pytest.approx((100.0, 0.0, 0.0), abs=1e-3)
    assert lab("#ff0000") == pytest.approx((53.24, 80.09, 67.20), abs=0.01)  # sRGB red
    # A protanope's simulated red is darker and yellower, not red.
    lightness, redness, yellowness = lab("#ff0000", "protanopia")
    assert lightness < 53 and abs(redness) < 10 and yellowness > 30


def test_the_simulation_keeps_greys_grey() -> None:
    """Machado's matrices map white to white (rows sum to 1): a dichromat sees greys as such."""
    for vision in MACHADO_2009:
        assert ciede2000(lab("#777777"), lab("#777777", vision)) < 0.1


@pytest.mark.parametrize("vision", VISIONS)
def test_every_two_phases_stay_apart(vision: str) -> None:
    assert set(PHASE_COLOURS) == {p.value for p in Phase}
    distance, first, second = closest_pair(PHASE_COLOURS, vision)
    assert distance >= THRESHOLD, f"{first} and {second}: ΔE00 {distance:.1f} ({vision})"


# Colours drawn together in one figure, each with its own meaning.
FIGURE_COLOURS = {
    "memory_per_device: categories": {**figures.CATEGORY_COLORS, "other": figures.OTHER_COLOR},
    "split: a chunk vs idle": {"chunk": split.Phase.SCATTER.colour, "idle": split.IDLE_COLOR},
    "replicas: parameters, buffers, the chosen count": {
        "parameters": Phase.REPLICATE.colour,
        "buffers": replicas.BUFFER_COLOR,
        "chosen": figures.HIGHLIGHT_COLOR,
    },
    "speedup, beyond: measured vs predicted": {
        "measured": figures.MEASURED_COLOR,
        "predicted": figures.HIGHLIGHT_COLOR,
    },
    "apply, training: one device vs parallel": {
        "one device": figures.OTHER_COLOR,
        "parallel": Phase.APPLY.colour,
    },
    "beyond: the two engines": beyond.ENGINE_COLORS,
    "beyond: the bubble's measured and predicted stage counts": {
        "measured": figures.MEASURED_COLOR,
        **{f"predicted {i}": colour for i, colour in enumerate(beyond.STAGE_COLORS)},
    },
}


@pytest.mark.parametrize("vision", VISIONS)
@pytest.mark.parametrize("figure", FIGURE_COLOURS)
def test_colours_drawn_together_stay_apart(figure: str, vision: str) -> None:
    distance, first, second = closest_pair(FIGURE_COLOURS[figure], vision)
    assert distance >= THRESHOLD, f"{figure}: {first} and {second} ΔE00 {distance:.1f} ({vision})"


def test_public_names_give_the_phase_colours() -> None:
    assert viz.PHASE_COLORS == PHASE_COLOURS
    assert all(viz.phase_color(p.value) == p.colour for p in Phase)
    assert viz.phase_color("not a phase") == figures.OTHER_COLOR
