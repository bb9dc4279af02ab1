"""``dpkit predict``: a predicted training step on a named machine, printed and drawn like
``dpkit demo`` prints and draws a measured one, every output labelled predicted: the time of
each phase, the step's time, and the bytes each device holds beside its capacity (fits or
not).

    dpkit predict --list                                   the machines, one per line
    dpkit predict --hardware 8xA100-SXM-NVLink --devices 8 --batch 512 --model cnn
    dpkit predict --hardware 2x8xA100-10GbE --devices 16 --batch 4096 --strategy ddp --out /tmp/p
    dpkit predict --hardware 8xA100-SXM-NVLink --strategy ddp --amp bf16 --optimizer adam
    dpkit predict --print-hardware 8xA100-SXM-NVLink > my_machine.toml    a template to edit
    dpkit predict --hardware-file my_machine.toml --devices 8              your machine
    dpkit predict --hardware this-machine --calibrate      measure this machine first (~2 s)

A hardware file (TOML or JSON, by its suffix) is either a whole machine (every field of
:class:`~dpkit.cost.Hardware`, as ``--print-hardware`` writes them), or ``base = "<preset>"``
and only the fields that change. Units are SI, plain numbers: bytes, bytes/s, seconds,
FLOP/s. ``--hardware`` and ``--hardware-file`` together are refused: the file says its base.
The format, and the commands that answer "one node of 8 A100 or two over 100 GbE, dp or
ddp, which batch, does it fit?", are in ``docs/hardware_file.md``.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from dpkit.cli_types import at_least_one
from dpkit.cost.hardware import Hardware, Link, check
from dpkit.cost.memory import OPTIMIZER_COPIES
from dpkit.cost.models import MODEL_NAMES, course_model, sample_input
from dpkit.cost.predict import STRATEGIES, PredictedTrace, predict
from dpkit.cost.presets import preset, presets

DEFAULT_HARDWARE = "8xA100-SXM-NVLink"
AMP_CHOICES = ("bf16", "fp16")
LINKS = ("host_to_device", "device_to_device", "node_to_node")
TABLES = ("peak_flops", "tensor_core_efficiency", *LINKS, "op_seconds")  # [sections] in TOML
TEXT_FIELDS = ("name", "description", "device_name", "source")
NO_ALLREDUCE = "none"  # allreduce_bandwidth = "none": the ring's (TOML has no null)
GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10
_FIX_OUT = "choose a folder you can write to, e.g. --out /tmp/dpkit-predict"


def _units(cls: type) -> dict[str, tuple[str, str]]:
    """Each field's unit and the line about it, as :mod:`dpkit.cost.hardware` declares them."""
    return {spec.name: (spec.metadata["unit"], spec.metadata["about"]) for spec in fields(cls)}


FIELD_UNITS, LINK_UNITS = _units(Hardware), _units(Link)


# -- hardware files: writing a template, reading one back ---------------------------------


def _toml(value: object) -> str:
    """A TOML value. Floats as Python's shortest exact form (``repr``: it reads back equal;
    inf and nan are TOML's too); strings with JSON's escapes, which are TOML's, DEL aside."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return str(value) if isinstance(value, int) else repr(float(value))


def _toml_key(key: str) -> str:
    return key if key.isidentifier() else _toml(key)  # "aten.addmm" needs quotes


def _readable(value: float, unit: str) -> str:
    """``value`` in ``unit`` as a spec sheet writes it, for a comment."""
    if unit == "bytes":
        return f"{value / GIB:.4g} GiB" if value >= GIB else f"{value / MIB:.4g} MiB"
    if unit == "bytes/s":
        return f"{value / 1e9:.4g} GB/s"
    if unit == "FLOP/s":
        return f"{value / 1e12:.4g} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.4g} GFLOP/s"
    if unit == "seconds":
        return f"{value * 1e6:.4g} us" if value < 1e-3 else f"{value * 1e3:.4g} ms"
    return ""


def _line(key: str, value: object, unit: str, about: str = "") -> str:
    """``key = value  # unit (readable): about``; text gets no comment."""
    if unit == "text":
        return f"{_toml_key(key)} = {_toml(value)}"
    readable = _readable(value, unit) if isinstance(value, (int, float)) else ""
    comment = unit + (f" ({readable})" if readable else "") + (f": {about}" if about else "")
    return f"{_toml_key(key)} = {_toml(value)}  # {comment}"


def hardware_toml(hardware: Hardware, command: str = "") -> str:
    """``hardware`` as a TOML file that ``--hardware-file`` reads back equal to it: every
    field, a comment with its unit and meaning."""
    values = {spec.name: getattr(hardware, spec.name) for spec in fields(Hardware)}
    calibrated = bool(hardware.op_seconds)  # measured: not the preset of its name
    base = hardware.name if hardware.name in presets() and not calibrated else DEFAULT_HARDWARE
    lines = [
        f"# {hardware.name}: a machine for dpkit's cost model"
        + (f",\n# written by `{command}`." if command else "."),
        "# Use it: dpkit predict --hardware-file THIS_FILE.toml --devices 8 ...",
        "# Units are SI, plain numbers: bytes, bytes/s, seconds, FLOP/s (80 GB is 80e9, 5 us",
        "# is 5e-6). Edit the numbers from your spec sheet; or keep only the line",
        f'# base = "{base}" and the fields you change (a what-if). docs/hardware_file.md',
        "",
    ]
    for key, value in values.items():
        unit, about = FIELD_UNITS[key]
        if key == "allreduce_bandwidth" and value is None:
            lines.append(f'{key} = "{NO_ALLREDUCE}"  # {unit}: {about}')
        elif key not in TABLES:
            lines.append(_line(key, value, unit, about))
    for key in TABLES:
        unit, about = FIELD_UNITS[key]
        if not values[key]:
            continue  # no tensor_core_efficiency or op_seconds: the defaults
        lines += ["", f"[{key}]  # {unit}: {about}"]
        if key in LINKS:
            link = values[key]
            lines += [_line(name, getattr(link, name), *LINK_UNITS[name]) for name in LINK_UNITS]
        else:  # an op's pairs are written without a comment, as text is
            entry = "text" if key == "op_seconds" else unit
            lines += [_line(name, item, entry) for name, item in values[key].items()]
    return "\n".join(lines) + "\n"


def _toml_module(where: str) -> ModuleType:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # the same parser, for Python 3.10
        except ModuleNotFoundError:
            raise ValueError(
                f"{where}: reading TOML needs Python 3.11 or the tomli package "
                "(pip install tomli); or write the same fields as a .json file"
            ) from None
    return tomllib


def _refuse_unknown(where: str, what: str, keys: Any, known: Any) -> None:
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{where}: unknown {what} {key!r}{hint}; the known ones: {', '.join(known)}"
            )


def _plain(value: Any, unit: str) -> Any:
    """A value as a file writes it, as :class:`Hardware` takes it: a whole number written
    8.0 is the int 8, an op's ``[work, seconds]`` lists are tuples. :func:`check` and
    :class:`Hardware` refuse what is wrong, naming the field."""
    if unit == "whole number" and isinstance(value, float) and value.is_integer():
        return int(value)
    if unit == "[work, seconds] pairs" and isinstance(value, list):
        return tuple(tuple(pair) if isinstance(pair, list) else pair for pair in value)
    return value


def _field(where: str, name: str, value: Any, base: Hardware | None, origin: str) -> Any:
    """One field of a hardware file as :class:`Hardware` takes it; a table over a ``base``
    changes only the keys it names."""
    unit = FIELD_UNITS[name][0]
    if name == "allreduce_bandwidth" and value in (None, NO_ALLREDUCE):
        return None
    if name not in TABLES:
        return _plain(value, unit)
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{where}: {name} = {value!r} must be a table (TOML: a [{name}] section; JSON: "
            "an object)"
        )
    given = {key: _plain(item, unit) for key, item in value.items()}
    old = getattr(base, name, None)
    if name not in LINKS:
        return {**(old or {}), **given}
    _refuse_unknown(where, f"key of {name}", given, LINK_UNITS)
    if old is not None:
        if given and "source" not in given:  # the base's citation is not for these numbers
            given["source"] = f"{origin} (changed from: {old.source})"
        given = {"bandwidth": old.bandwidth, "latency": old.latency, **given}
    missing = [key for key in ("bandwidth", "latency") if key not in given]
    if missing:
        raise ValueError(
            f"{where}: {name} has no {' and no '.join(missing)}: a link needs bandwidth "
            "(bytes/s) and latency (seconds), and may say its source"
        )
    return Link(**given)


def _named(where: str, name: str, error: Exception) -> ValueError:
    """``error`` as a ValueError that starts with ``where`` and names the field."""
    text = str(error)
    if text.startswith(where):
        return ValueError(text)
    return ValueError(f"{where}: {name}: {text}" if name else f"{where}: {text}")


def hardware_from_mapping(data: Mapping[str, Any], where: str = "hardware file") -> Hardware:
    """A :class:`Hardware` from a hardware file's contents: every field, or ``base`` (a
    preset's name) and the fields that change. ``where`` starts every error, each of which
    names the field and says how to fix it."""
    names = [spec.name for spec in fields(Hardware)]
    _refuse_unknown(where, "field", data, ["base", *names])
    origin = where.removeprefix("--hardware-file ")
    base: Hardware | None = None
    values: dict[str, Any] = {}
    for name, value in sorted(data.items(), key=lambda item: item[0] != "base"):
        try:  # base first: the other fields change its values
            if name == "base":
                check(where, "base", value, "text")
                base = preset(value)
            else:
                values[name] = _field(where, name, value, base, origin)
        except (TypeError, ValueError) as error:
            raise _named(where, name, error) from None
    if base is None:
        required = [s.name for s in fields(Hardware) if s.default is MISSING
                    and s.default_factory is MISSING]  # fmt: skip
        missing = [name for name in required if name not in values]
        if missing:
            raise ValueError(
                f"{where}: missing {', '.join(missing)}. Give every field (dpkit predict "
                "--print-hardware NAME writes them all), or start from a preset: base = "
                f'"{DEFAULT_HARDWARE}" and only the fields you change'
            )
    else:
        changed = ", ".join(sorted(key for key in values if key not in TEXT_FIELDS)) or "nothing"
        values = {
            "name": Path(origin).stem or f"{base.name}-edited",
            "description": f"{base.name} with {changed} from {origin}",
            "source": f"{base.source}; {changed} from {origin}",
            **values,
        }
    try:
        return Hardware(**values) if base is None else replace(base, **values)
    except (TypeError, ValueError) as error:
        raise _named(where, "", error) from None


def load_hardware_file(path: str | Path) -> Hardware:
    """The machine a ``.toml`` or ``.json`` hardware file describes (see
    :func:`hardware_from_mapping`); a ValueError naming the file for anything wrong."""
    path = Path(path)
    where = f"--hardware-file {path}"
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ValueError(f"{where}: name it .toml or .json (the suffix says how to read it)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(
            f"{where}: no such file; `dpkit predict --print-hardware {DEFAULT_HARDWARE} "
            f"> {path.name}` writes one to edit"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{where}: cannot read it ({error})") from None
    if suffix == ".toml":
        toml = _toml_module(where)
        try:
            data = toml.loads(text)
        except toml.TOMLDecodeError as error:
            raise ValueError(f"{where}: not valid TOML: {error}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{where}: not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"{where}: must hold one JSON object of fields, {{...}}")
    return hardware_from_mapping(data, where)


# -- the report ---------------------------------------------------------------------------


def _unit(nbytes: float) -> tuple[str, int, int]:
    """The unit ``nbytes`` reads best in (GiB, MiB or KiB), its size and the digits shown."""
    for unit, size in (("GiB", GIB), ("MiB", MIB)):
        if nbytes >= size:
            return unit, size, 2 if unit == "GiB" else 1
    return "KiB", KIB, 1


def readable_bytes(nbytes: float) -> str:
    """``nbytes`` in B, KiB, MiB or GiB, whichever reads best."""
    unit, size, digits = _unit(nbytes)
    return f"{nbytes / size:,.{digits}f} {unit}" if nbytes >= KIB else f"{int(nbytes)} B"


def memory_table(trace: PredictedTrace) -> str:
    """Each device's predicted bytes by category (from ``trace.held``), its total and its
    ``memory_capacity``, in one unit; consecutive devices holding the same share a row."""
    unit, size, digits = _unit(max(trace.memory_per_device))
    categories = list(dict.fromkeys(c for held in trace.held for c in held))
    table = [["device", *categories, "total", "capacity"]]
    for _, group in itertools.groupby(enumerate(trace.held), key=lambda item: item[1]):
        indices = [index for index, _ in group]
        held = trace.held[indices[0]]
        label = f"{indices[0]}" + (f"-{indices[-1]}" if len(indices) > 1 else "")
        values = [*(held.get(c, 0) for c in categories), sum(held.values()),
                  trace.machine.memory_capacity]  # fmt: skip
        table.append([label, *(f"{value / size:,.{digits}f}" for value in values)])
    widths = [max(len(row[k]) for row in table) + (2 if k else 1) for k in range(len(table[0]))]
    lines = [row[0].ljust(widths[0]) + "".join(cell.rjust(width)
             for cell, width in zip(row[1:], widths[1:])) for row in table]  # fmt: skip
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join([f"memory per device at the step's peak, predicted, in {unit}:", *lines])


def fit_verdict(trace: PredictedTrace) -> str:
    """ "fits: ..." or "does not fit: device 0 needs X of Y", the fullest device named."""
    machine = trace.machine
    totals = trace.memory_per_device
    capacity = machine.memory_capacity
    if machine.virtual_lanes:  # the lanes share the host's memory
        need = sum(totals)
        says = f"the {len(totals)} lane(s) together need {readable_bytes(need)} of the host's "
        says += readable_bytes(capacity)
        return ("fits: " if need <= capacity else "does not fit: ") + says
    fullest = max(range(len(totals)), key=totals.__getitem__)
    need = totals[fullest]
    says = f"device {fullest} needs {readable_bytes(need)} of {readable_bytes(capacity)}"
    if need <= capacity:
        return f"fits: {says} ({100 * need / capacity:.1f} %), the fullest device"
    fix = "a smaller --batch or more --devices"
    if trace.strategy == "dp":
        fix = "a smaller --batch, more --devices, or --strategy ddp (no device 0 holding more)"
    return f"does not fit: {says}; try {fix}"


def report(
    trace: PredictedTrace, model: str, files: dict[str, Path | None], settings: str = ""
) -> str:
    """What ``dpkit predict`` prints: the machine, the per-phase summary (the table ``dpkit
    demo`` prints), the predicted step time, the bytes each device holds against its
    capacity, whether it fits, and where the files are."""
    machine = trace.machine
    lines = [
        f"PREDICTED by dpkit's cost model, not measured: {machine.name}",
        f"  {machine.description}",
        f"  numbers from: {machine.source}",
        f"model {model}, batch {trace.batch_size} (1x28x28 images), {trace.device_count} "
        f"device(s), strategy {trace.strategy}",
        *([f"  {settings}"] if settings else []),
        "",
        f"per phase, per step — {trace.hardware}:",
        str(trace.summary()),
        "",
        f"predicted step time: {trace.step_time * 1e3:.3f} ms",
        "",
        memory_table(trace),
        f"predicted memory: {fit_verdict(trace)}",
        "",
    ]
    for what, path in files.items():
        lines.append(f"{what + ':':<22}{path if path is not None else 'skipped (no matplotlib)'}")
    lines.append("  open trace.json at https://ui.perfetto.dev: a track per predicted device.")
    return "\n".join(lines)


# -- the command --------------------------------------------------------------------------


def _out_folder(text: str) -> Path:
    """The ``--out`` folder, made if need be, checked writable before minutes of work."""
    out = Path(text).expanduser().absolute()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".dpkit-write-check-"):
            pass
    except FileExistsError:
        raise ValueError(f"--out {out}: is a file, not a folder; {_FIX_OUT}") from None
    except NotADirectoryError:
        raise ValueError(f"--out {out}: a part of it is a file, not a folder; {_FIX_OUT}") from None
    except OSError as error:
        why = error.strerror or str(error)
        raise ValueError(f"--out {out}: cannot write there ({why}); {_FIX_OUT}") from None
    return out


def _write_files(trace: PredictedTrace, out: Path) -> dict[str, Path | None]:
    files: dict[str, Path | None] = {}
    try:
        files["Chrome trace"] = trace.to_chrome_trace(out / "trace.json")
        try:
            from dpkit import viz
        except ImportError:
            files.update({"timeline": None, "memory": None})
        else:
            import matplotlib.pyplot as plt

            for what, draw in (("timeline", viz.timeline), ("memory", viz.memory_per_device)):
                figure = draw(trace)
                files[what] = out / f"{what}.png"
                figure.savefig(files[what], dpi=120)
                plt.close(figure)
    except OSError as error:
        where = Path(error.filename) if error.filename else out
        why = error.strerror or str(error)
        raise ValueError(
            f"--out {out}: cannot write {where.name} there ({why}); {_FIX_OUT}"
        ) from None
    return files


def choose_hardware(args: argparse.Namespace) -> Hardware:
    """The machine the options name: ``--hardware``, ``--hardware-file`` or ``--calibrate``
    (``--hardware`` and ``--hardware-file`` together are refused: the file names its base)."""
    if args.hardware is not None and args.hardware_file is not None:
        raise ValueError(
            "--hardware and --hardware-file name two machines: give one. To start the file "
            f'from a preset, write base = "{args.hardware}" in it'
        )
    if args.calibrate:
        if args.hardware_file is not None or (args.hardware or "this-machine").lower() != (
            "this-machine"
        ):
            raise ValueError("--calibrate measures this machine: use --hardware this-machine")
        from dpkit.cost.calibrate import calibrate

        return calibrate(quick=True, progress=True)
    if args.hardware_file is not None:
        return load_hardware_file(args.hardware_file)
    return preset(args.hardware or DEFAULT_HARDWARE)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(list_presets())
        return 0
    if args.print_hardware is not None:
        if args.print_hardware:  # a preset's name: as --hardware NAME
            if args.hardware not in (None, args.print_hardware):
                raise ValueError("--print-hardware NAME and --hardware name two machines: "
                                 "give one")  # fmt: skip
            args.hardware = args.print_hardware
        hardware = choose_hardware(args)
        named = f" {hardware.name}" if args.print_hardware else ""
        print(hardware_toml(hardware, f"dpkit predict --print-hardware{named}"), end="")
        return 0
    hardware = choose_hardware(args)
    out = _out_folder(args.out)
    trace = predict(
        course_model(args.model), sample_input(), args.batch, args.devices, hardware,
        strategy=args.strategy, amp=args.amp, optimizer=args.optimizer,
        gradient_as_bucket_view=args.gradient_as_bucket_view, bucket_cap_mb=args.bucket_cap_mb,
    )  # fmt: skip
    precision = "float32 (as torch runs it: convolutions in TF32 where the GPU has it)"
    settings = [f"autocast {args.amp}" if args.amp else precision, f"optimizer {args.optimizer}"]
    if args.strategy == "ddp":
        settings.append(f"bucket_cap_mb={args.bucket_cap_mb:g}")
        if args.gradient_as_bucket_view:
            settings.append("gradient_as_bucket_view")
    print(report(trace, args.model, _write_files(trace, out), "; ".join(settings)))
    return 0


def list_presets() -> str:
    """What ``dpkit predict --list`` prints: a line per machine, its name first."""
    return "\n".join(hardware.summary() for hardware in presets().values())


def _megabytes(text: str) -> float:
    """An argparse type: a positive, finite number of MiB."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of MiB, got {text!r}")
    return value


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in its help, where it has one (not None, not a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def add_predict_command(commands: Any) -> None:
    """Add ``dpkit predict`` to the subparsers ``commands`` of dpkit's command line."""
    parser = commands.add_parser(
        "predict",
        help="predict a training step on a named machine (cost model): time, memory per "
        "device, a timeline and a Chrome trace, labelled predicted",
        description="Predict one training step of a course model with DataParallel (dp) or "
        "DistributedDataParallel (ddp) on a machine you may not have, with dpkit's cost "
        "model: print the time and bytes of every phase, the step's time, and the bytes "
        "each device holds against its memory (fits or not); write timeline.png, memory.png "
        "and trace.json. Every output says predicted. Your own machine: --print-hardware "
        "writes a preset as a TOML file to edit, --hardware-file reads it (docs/hardware_file.md).",
        formatter_class=_HelpWithDefaults,
    )
    machine = parser.add_argument_group("the machine")
    machine.add_argument("--list", action="store_true", help="list the machines and exit")
    machine.add_argument(
        "--hardware", default=None, metavar="NAME",
        help=f"a name from --list (default: {DEFAULT_HARDWARE})",
    )  # fmt: skip
    machine.add_argument(
        "--hardware-file", default=None, metavar="PATH",
        help="a machine from a .toml or .json file: every field, or base = \"<preset>\" and "
        "the fields that change; SI units (bytes, bytes/s, seconds, FLOP/s). Not with "
        "--hardware",
    )  # fmt: skip
    machine.add_argument(
        "--print-hardware", nargs="?", const="", default=None, metavar="NAME",
        help="print preset NAME as a TOML hardware file to edit, and exit; without NAME, the "
        "machine that --hardware, --hardware-file or --calibrate names",
    )  # fmt: skip
    machine.add_argument(
        "--calibrate", action="store_true", help="with --hardware this-machine: measure it first"
    )
    step = parser.add_argument_group("the step")
    step.add_argument("--devices", type=at_least_one, default=8, help="number of devices")
    step.add_argument("--batch", type=at_least_one, default=256, help="batch size per step")
    step.add_argument("--model", choices=MODEL_NAMES, default="mlp", help="course model")
    step.add_argument("--strategy", choices=STRATEGIES, default="dp", help="dp or ddp")
    step.add_argument(
        "--amp", choices=AMP_CHOICES, default=None,
        help="autocast's dtype (default: none, float32 as torch runs it, convolutions in TF32 "
        "where the GPU has it)",
    )  # fmt: skip
    step.add_argument(
        "--optimizer", choices=tuple(OPTIMIZER_COPIES), default="sgd",
        help="its state is in the memory: sgd none, momentum 1 copy of the parameters, "
        "adam/adamw 2",
    )  # fmt: skip
    step.add_argument(
        "--gradient-as-bucket-view", action="store_true",
        help="ddp: .grad is a view of the buckets (one copy of the gradients fewer)",
    )  # fmt: skip
    step.add_argument(
        "--bucket-cap-mb", type=_megabytes, default=25.0, metavar="MiB",
        help="ddp: the size of a gradient bucket (DDP's bucket_cap_mb)",
    )  # fmt: skip
    step.add_argument("--out", default=".", help="folder for the figures and trace.json")
    parser.set_defaults(run=run)
