"""The catalogue of DataParallel's classic surprises: one entry per section of notebook 08.

Each entry names the symptom a user sees, the course notebook that shows it at length (if
any), and the public reports behind it (each link was checked against the PyTorch issue
tracker or the project it names). The notebook's table of contents and its reading list are
printed from here, and ``tests/test_pitfalls.py`` checks that every section of the notebook
carries its entry's title and links, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

PYTORCH = "https://github.com/pytorch/pytorch"


@dataclass(frozen=True)
class Link:
    label: str  # as the notebook shows it, e.g. "pytorch/pytorch#3805"
    url: str
    title: str  # the report's own title, or what it is about

    def markdown(self) -> str:
        return f"[{self.label}]({self.url})"


def _issue(number: int, title: str, kind: str = "issues") -> Link:
    return Link(f"pytorch/pytorch#{number}", f"{PYTORCH}/{kind}/{number}", title)


def _pull(number: int, title: str) -> Link:
    return _issue(number, title, kind="pull")


@dataclass(frozen=True)
class Pitfall:
    number: int
    key: str
    title: str  # the section heading, after its number
    symptom: str  # what the user sees
    links: tuple[Link, ...]
    course: str = ""  # where an earlier notebook shows it at length

    @property
    def heading(self) -> str:
        return f"## {self.number}. {self.title}"


PITFALLS: tuple[Pitfall, ...] = (
    Pitfall(
        1, "slower", "Slower than one device",
        "DataParallel on 4 devices takes longer per step than the plain model",
        (_issue(3917, "Data Parallel slows things down - ResNet 1001"),
         _issue(5421, "with nn.DataParallel program runs slower")),
        "05_training §4",
    ),
    Pitfall(
        2, "memory", "Device 0 holds more memory than the others",
        "the first device runs out of memory while the others have room",
        (_issue(1893, "GPU usage extremely in-balance for segmentation task"),),
        "04_gather §2",
    ),
    Pitfall(
        3, "small_batch", "The last batch is smaller than the device count",
        "TypeError: forward() missing 1 required positional argument, at an epoch's end",
        (_issue(15161, "Maybe a bug when using DataParallel"),
         _issue(9226, "warn if batchsize < #gpu in data parallel")),
        "01_scatter §3-4",
    ),
    Pitfall(
        4, "one_row", "A chunk of one row breaks BatchNorm",
        "ValueError: Expected more than 1 value per channel when training",
        (_issue(18563, 'nn.DataParallel always creates a "sub-batch" of size 1.'),),
        "02_replicate §6",
    ),
    Pitfall(
        5, "bn_stats", "BatchNorm statistics come from device 0's chunk only",
        "running_mean and running_var differ from training on one device",
        (_issue(1051, "DataParallel does not correctly handle running variables in batch norm"),),
        "02_replicate §6",
    ),
    Pitfall(
        6, "prefix", "Every key of state_dict starts with module.",
        'RuntimeError: Missing key(s) in state_dict ... Unexpected key(s): "module.weight"',
        (_issue(3805, "Problem when I load a state dictionary"),),
    ),
    Pitfall(
        7, "attribute", "An attribute set in forward is gone",
        "AttributeError (or a stale value) when reading what forward stored on self",
        (_issue(2864, "DataParallel doesn't replicate module's member variables"),),
        "02_replicate §5",
    ),
    Pitfall(
        8, "packed_rnn", "pack, RNN, unpack: outputs of different lengths",
        "gather fails: replica outputs differ in the time dimension",
        (_issue(6299, "[feature request] make pad_packed_sequence work in DataParallel"),
         _pull(6327, "Add total_length option to pad_packed_sequence")),
    ),
    Pitfall(
        9, "gather_types", "Strings and numbers in the output",
        "torch builds '<map object ...>' from a string and fails on a number",
        (_issue(62466, "Support gathering string in DataParallel"),
         _issue(41327, "gather can't gather outputs that are dataclasses")),
        "04_gather §4",
    ),
    Pitfall(
        10, "scalar_loss", "A scalar loss comes back as a vector",
        "RuntimeError: grad can be implicitly created only for scalar outputs",
        (_issue(6983, "nn.parallel.gather does not accept scalars (0-dim tensors) of v0.4"),
         _pull(7973, "Support modules that output scalar in Gather (and data parallel)")),
        "04_gather §3",
    ),
    Pitfall(
        11, "mean_of_means", "The mean of per-replica means is not the batch mean",
        "the loss differs from one device's when the chunks differ in size",
        (Link("huggingface/transformers#608",
              "https://github.com/huggingface/transformers/issues/608",
              "when using multiple GPUs, `loss.mean()` may have subtle bias"),),
        "04_gather §3",
    ),
    Pitfall(
        12, "source_device", "Parameters not on device_ids[0]",
        "RuntimeError: module must have its parameters and buffers on device ... (device_ids[0])",
        (_pull(17129, "Enforce module device at DataParallel construction time"),
         _pull(17363, "Fix DataParallel(cpu_m).cuda() not working by checking at forward")),
    ),
    Pitfall(
        13, "autocast", "autocast follows into the replicas' threads only in part",
        "under autocast(\"cuda\", dtype=torch.bfloat16), torch's replicas compute in float16",
        (_issue(50170, "Automated Mixed Precision not documented to work with nn.DataParallel"),
         _issue(60540, "Automatic Mixed Precision with DataParallel"),
         _pull(43102, "Support AMP in nn.parallel")),
    ),
    Pitfall(
        14, "hooks", "A forward hook runs once per replica",
        "a hook meant to run once per step runs once per device, on a chunk",
        (_pull(128272, "Create copies for all replica dict attributes (namely hook-tracking "
               "dicts) in _replicate_for_data_parallel"),),
        "02_replicate §7",
    ),
    Pitfall(
        15, "custom_method", "A custom method skips DataParallel",
        "AttributeError: 'DataParallel' object has no attribute 'predict'; "
        "model.module.predict runs on one device",
        (_issue(43329, "ModuleAttributeError: 'DataParallel' object has no attribute "
                "'custom_function'"),
         _issue(32611, "Unable to use multiple GPUs")),
    ),
)  # fmt: skip

_BY_KEY = {pitfall.key: pitfall for pitfall in PITFALLS}


def pitfall(key: str) -> Pitfall:
    """The catalogue entry named ``key`` (e.g. ``"prefix"``)."""
    try:
        return _BY_KEY[key]
    except KeyError:
        known = ", ".join(sorted(_BY_KEY))
        raise KeyError(f"no pitfall named {key!r}; the known ones are: {known}") from None


class Markdown:
    """Text a notebook renders as Markdown (plain text elsewhere)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def contents() -> Markdown:
    """The notebook's table of contents: what you see, and the section that explains it."""
    rows = ["| § | what you see | section | at length in |", "|---|---|---|---|"]
    for entry in PITFALLS:
        symptom = entry.symptom.replace("|", "\\|")
        course = f"[{entry.course}]({entry.course.split()[0]}.ipynb)" if entry.course else "-"
        rows.append(f"| {entry.number} | {symptom} | {entry.title} | {course} |")
    return Markdown("\n".join(rows))


def reading_list() -> Markdown:
    """Every report behind the pitfalls, section by section."""
    lines = []
    for entry in PITFALLS:
        reports = "; ".join(f"{link.markdown()}: {link.title}" for link in entry.links)
        lines.append(f"- §{entry.number} {entry.title}: {reports}")
    return Markdown("\n".join(lines))
