"""``dpkit predict``: a predicted training step on a named machine, printed and drawn like
``dpkit demo`` prints and draws a measured one, every output labelled predicted. The machine
is a preset or a hardware file (TOML, SI units; ``docs/hardware_file.md``, with runs of every
option)."""

import argparse
import difflib
import itertools
import tempfile
from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from dpkit.chunk_plans import torch_chunk_sizes
from dpkit.cli_types import at_least_one, in_flags, more_than_zero
from dpkit.cost.catalog import preset, presets
from dpkit.cost.hardware import TABLES, Hardware, Link, check
from dpkit.cost.memory import OPTIMIZER_COPIES
from dpkit.cost.prediction import STRATEGIES, PredictedTrace, predict
from dpkit.models import PREDICTION_MODELS, build_model, sample_input
from dpkit.tracing.export import gaps_note

DEFAULT_HARDWARE = "8xA100-SXM-NVLink"
DEFAULT_DEVICES = 8  # or all of the machine's, where it has fewer
# What predict's checks name, and the flags a user of `dpkit predict` typed instead.
PREDICT_FLAGS = {"batch_size": "--batch", "devices": "--devices", "strategy": "--strategy",
                 "bucket_cap_mb": "--bucket-cap-mb", "optimizer": "--optimizer",
                 "amp": "--amp"}  # fmt: skip
EXAMPLE_FILE = "docs/examples/my_machine.toml"
UNITS = (("GiB", 1 << 30, 2), ("MiB", 1 << 20, 1), ("KiB", 1 << 10, 1))  # (name, size, digits)
_FIX_OUT = "choose a folder you can write to, e.g. --out /tmp/dpkit-predict"
FIELD_UNITS = {spec.name: spec.metadata["unit"] for spec in fields(Hardware)}


def _refuse_unknown(where: str, what: str, keys: Any, known: Any) -> None:
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{where}: unknown {what} {key!r}{hint}; the known ones: {', '.join(known)}"
            )


def _plain(value: Any, unit: str) -> Any:
    """A value as TOML writes it, as :class:`Hardware` takes it: a whole number written 8.0
    is the int 8, an op's ``[work, seconds]`` lists are tuples."""
    if unit == "whole number" and isinstance(value, float) and value.is_integer():
        return int(value)
    if unit == "[work, seconds] pairs" and isinstance(value, list):
        return tuple(tuple(pair) if isinstance(pair, list) else pair for pair in value)
    return value


def _field(where: str, name: str, value: Any, base: Hardware | None, origin: str) -> Any:
    """One field of a hardware file; a table over a ``base`` changes only the keys it names."""
    unit = FIELD_UNITS[name]
    if name == "allreduce_bandwidth" and value == "none":  # TOML has no null
        return None
    if name not in TABLES and unit != "link":  # tables and links are [sections] in TOML
        return _plain(value, unit)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: {name} = {value!r} must be a table (a [{name}] section)")
    given = {key: _plain(item, unit) for key, item in value.items()}
    old = getattr(base, name, None)
    if unit != "link":
        return {**(old or {}), **given}
    _refuse_unknown(where, f"key of {name}", given, ("bandwidth", "latency", "source"))
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
    preset's name) and the fields that change. Every error starts with ``where``."""
    _refuse_unknown(where, "field", data, ["base", *FIELD_UNITS])
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
        missing = [s.name for s in fields(Hardware) if s.default is MISSING
                   and s.default_factory is MISSING and s.name not in values]  # fmt: skip
        if missing:
            raise ValueError(
                f"{where}: missing {', '.join(missing)}. Give every field, or start from a "
                f'preset: base = "{DEFAULT_HARDWARE}" and only the fields you change '
                f"(as {EXAMPLE_FILE} does)"
            )
    else:
        changed = ", ".join(sorted(k for k in values if FIELD_UNITS[k] != "text")) or "nothing"
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
    """The machine a TOML hardware file describes; a ValueError naming the file if wrong."""
    path = Path(path)
    where = f"--hardware-file {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file; {EXAMPLE_FILE} is one to copy") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{where}: cannot read it ({error})") from None
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # the same parser, for Python 3.10
        except ModuleNotFoundError:
            raise ValueError(f"{where}: reading TOML on Python 3.10 needs the tomli package "
                             "(pip install tomli)") from None  # fmt: skip
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{where}: not valid TOML: {error}") from None
    return hardware_from_mapping(data, where)


def _unit(nbytes: float) -> tuple[str, int, int]:
    """The unit ``nbytes`` reads best in: GiB, MiB, or else KiB."""
    return next((unit for unit in UNITS if nbytes >= unit[1]), UNITS[-1])


def readable_bytes(nbytes: float) -> str:
    unit, size, digits = _unit(nbytes)
    return f"{nbytes / size:,.{digits}f} {unit}" if nbytes >= size else f"{int(nbytes)} B"


def memory_table(trace: PredictedTrace) -> str:
    """Each device's predicted bytes by category, its total and its ``memory_capacity``, in
    one unit; consecutive devices holding the same share a row."""
    unit, size, digits = _unit(max(trace.memory_per_device))
    categories = list(dict.fromkeys(c for held in trace.held for c in held))
    table = [["device", *categories, "total", "capacity"]]
    for held, group in itertools.groupby(enumerate(trace.held), key=lambda item: item[1]):
        indices = [index for index, _ in group]
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
    totals, capacity = trace.memory_per_device, trace.machine.memory_capacity
    if trace.machine.virtual_lanes:  # the lanes share the host's memory
        need = sum(totals)
        verdict = "fits" if need <= capacity else "does not fit"
        return (f"{verdict}: the {len(totals)} lane(s) together need {readable_bytes(need)} "
                f"of the host's {readable_bytes(capacity)}")  # fmt: skip
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
    trace: PredictedTrace, model: str, files: dict[str, Path | None], settings: list[str]
) -> str:
    """What ``dpkit predict`` prints, every number labelled predicted; ``settings``: the
    options besides the model, batch and devices, in words."""
    machine = trace.machine
    chunks = len(torch_chunk_sizes(trace.batch_size, trace.device_count))
    idle = f" ({chunks} got a chunk, the others sit idle)" if chunks < trace.device_count else ""
    lines = [
        f"PREDICTED by dpkit's cost model, not measured: {machine.name}",
        f"  {machine.description}",
        f"  numbers from: {machine.source}",
        f"model {model}, batch {trace.batch_size} (1x28x28 images), {trace.device_count} "
        f"device(s){idle}, strategy {trace.strategy}",
        f"  {'; '.join(settings)}",
        *_caveats(trace),
        "",
        f"per phase, per step — {trace.hardware}:",
        str(trace.summary()),
        "",
        f"predicted step time: {trace.step_time * 1e3:.3f} ms",
        _outside_phases(trace),
        *(_allreduce_notes(trace) if trace.strategy == "ddp" else []),
        "",
        memory_table(trace),
        f"predicted memory: {fit_verdict(trace)}",
        "",
    ]
    for what, path in files.items():
        lines.append(f"{what + ':':<22}{path if path is not None else 'skipped (no matplotlib)'}")
    lines.append("  open trace.json at https://ui.perfetto.dev: a track per predicted device.")
    return "\n".join(lines)


def _caveats(trace: PredictedTrace) -> list[str]:
    """What the machine's description does not say of this prediction: the nodes it adds for
    more devices than a node holds, and, on lanes, what DDP's all-reduce really is here."""
    machine, lines = trace.machine, []
    per_node = machine.devices_per_node
    if trace.device_count > machine.max_devices and not machine.virtual_lanes:
        nodes = -(-trace.device_count // per_node)
        link = machine.node_to_node
        lines.append(f"  {trace.device_count} devices are {nodes} nodes of {per_node} (more than "
                     f"the machine's {machine.nodes}), joined by its network: "
                     f"{link.bandwidth / 1e9:g} GB/s a port, {link.latency * 1e6:g} us a message"
                     )  # fmt: skip
    if trace.strategy == "ddp" and machine.virtual_lanes:
        lines.append("  DDP's ranks on this machine all-reduce over gloo (TCP on loopback), which "
                     "this prediction prices as copies between lanes of one memory: expect a "
                     "slower all-reduce from dpkit ddp (notebook 09 measures gloo's link)"
                     )  # fmt: skip
    return lines


def _allreduce_notes(trace: PredictedTrace) -> list[str]:
    """What DDP's allreduce row counts: its time, gaps between buckets included, and its
    bytes, the ring's sends (where dpkit ddp's table sums the buckets)."""
    last = max(trace.step_bounds)
    # device 0 by its name ("predicted:0 (A100)"), not by whichever event comes first
    mine = [e for e in trace.events if e.step == last and e.device.startswith("predicted:0 (")]
    notes = [gaps_note(mine, "allreduce", "device 0's", "all-reduces")]
    notes.append("  (allreduce bytes: what the ring sends, 2(n-1)/n of each bucket, summed over "
                 "the devices; dpkit ddp's table sums the buckets themselves)")  # fmt: skip
    return [note for note in notes if note]


def _outside_phases(trace: PredictedTrace) -> str:
    """Why the table's step is not the step time: the host work before the first phase and
    after the last (the step's entry and end, and DDP's sums copied back into .grad)."""
    last = max(trace.step_bounds)
    events = [e for e in trace.events if e.step == last]
    span = max(e.end for e in events) - min(e.start for e in events)
    copies_back = trace.strategy == "ddp" and not trace.gradient_as_bucket_view
    back = ", and DDP's sums copied into .grad" if copies_back else ""
    return (f"  (the table's step: the {span * 1e3:.3f} ms the phases span; the other "
            f"{(trace.step_time - span) * 1e3:.3f} ms is host work before and after them: "
            f"the step's entry and end{back})")  # fmt: skip


def _out_folder(text: str) -> Path:
    """The ``--out`` folder, made if need be, checked writable before any work."""
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
            return {**files, "timeline": None, "memory": None}
        import matplotlib.pyplot as plt

        for what, draw in (("timeline", viz.timeline), ("memory", viz.memory_per_device)):
            figure = draw(trace)
            files[what] = out / f"{what}.png"
            figure.savefig(files[what], dpi=120)
            plt.close(figure)
    except OSError as error:
        where = Path(error.filename).name if error.filename else out.name
        why = error.strerror or str(error)
        raise ValueError(f"--out {out}: cannot write {where} there ({why}); {_FIX_OUT}") from None
    return files


def choose_hardware(args: argparse.Namespace) -> Hardware:
    """The machine ``--hardware``, ``--hardware-file`` or ``--calibrate`` names."""
    if args.hardware is not None and args.hardware_file is not None:
        raise ValueError(
            "--hardware and --hardware-file name two machines: give one. To start the file "
            f'from a preset, write base = "{args.hardware}" in it'
        )
    if args.calibrate:
        named = (args.hardware or "this-machine").lower()
        if args.hardware_file is not None or named != "this-machine":
            raise ValueError("--calibrate measures this machine: use --hardware this-machine")
        from dpkit.cost.calibration import calibrate

        return calibrate(quick=True, progress=True)
    if args.hardware_file is not None:
        return load_hardware_file(args.hardware_file)
    return preset(args.hardware or DEFAULT_HARDWARE)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(hardware.summary() for hardware in presets().values()))
        return 0
    ddp_only = [flag for flag, given in (("--bucket-cap-mb", args.bucket_cap_mb is not None),
                ("--gradient-as-bucket-view", args.gradient_as_bucket_view)) if given]  # fmt: skip
    if ddp_only and args.strategy != "ddp":
        raise ValueError(
            f"{' and '.join(ddp_only)}: for DDP's buckets, but --strategy is {args.strategy}; "
            f"add --strategy ddp, or leave out {' and '.join(ddp_only)}"
        )
    hardware = choose_hardware(args)
    out = _out_folder(args.out)
    devices = args.devices or min(DEFAULT_DEVICES, hardware.max_devices)
    try:
        trace = predict(
            build_model(args.model, seed=0), sample_input(), args.batch, devices, hardware,
            strategy=args.strategy, amp=args.amp, optimizer=args.optimizer,
            gradient_as_bucket_view=args.gradient_as_bucket_view,
            bucket_cap_mb=args.bucket_cap_mb,
        )  # fmt: skip
    except ValueError as error:  # in the words of the flags typed, not predict's arguments
        raise ValueError(in_flags(str(error), PREDICT_FLAGS)) from None
    precision = "float32" + (
        ""
        if hardware.virtual_lanes
        else " (as torch runs it: convolutions in TF32 where the GPU has it)"
    )
    settings = [f"autocast {args.amp}" if args.amp else precision, f"optimizer {args.optimizer}"]
    if args.strategy == "ddp":
        cap = args.bucket_cap_mb
        settings.append("torch's buckets: 25 MiB, the first 1 MiB" if cap is None
                        else f"bucket_cap_mb={cap:g}, the first bucket's too")  # fmt: skip
        if args.gradient_as_bucket_view:
            settings.append("gradient_as_bucket_view")
    print(report(trace, args.model, _write_files(trace, out), settings))
    return 0


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in its help, where it has one (not None, not a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default in (None, False) else super()._get_help_string(action)


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
        f"and trace.json. Every output says predicted. Your own machine: copy {EXAMPLE_FILE}, "
        "edit it, pass it to --hardware-file (docs/hardware_file.md).",
        formatter_class=_HelpWithDefaults,
    )
    option = parser.add_argument
    option("--list", action="store_true", help="list the machines and exit")
    option("--hardware", metavar="NAME", help=f"a name from --list (default: {DEFAULT_HARDWARE})")
    option(
        "--hardware-file", metavar="PATH", help="a machine from a TOML file (not with --hardware)"
    )
    option("--calibrate", action="store_true",
           help="measure this machine first (then it is --hardware this-machine)")  # fmt: skip
    option("--devices", type=at_least_one, default=None, help="number of devices "
           f"(default: {DEFAULT_DEVICES}, or all of the machine's if fewer)")  # fmt: skip
    option("--batch", type=at_least_one, default=256, help="batch size per step")
    option("--model", choices=PREDICTION_MODELS, default="mlp", help="course model")
    option("--strategy", choices=STRATEGIES, default="dp", help="dp or ddp")
    option("--amp", choices=("bf16", "fp16"), help="autocast's dtype (default: none, float32)")
    option("--optimizer", choices=tuple(OPTIMIZER_COPIES), default="sgd", help="state in memory")
    option("--gradient-as-bucket-view", action="store_true", help="ddp: .grad views a bucket")
    first = "the first bucket's too (default: torch's, 25 MiB, the first 1)"
    option("--bucket-cap-mb", type=more_than_zero, metavar="MiB", help=f"ddp's cap, {first}")
    option("--out", default=".", help="folder for the figures and trace.json")
    parser.set_defaults(run=run)
