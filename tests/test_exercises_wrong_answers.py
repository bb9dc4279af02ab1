"""The graders catch plausible wrong answers, and each hint names the real mistake.

Every wrong answer is a reference solution with one deliberate mistake, the kind a learner
makes (an even split, a forgotten ``zero_grad``, a dict that loses its type). Each must
fail exactly the checks that test the mistaken function, with the hint given here, and
pass every other check of its task: a hint that blames code that is right is a bug.
Two students' worth of wrong answers are graded in one class run (a process each).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from dpkit import grading

EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
NAMES = grading.task_files(EXERCISES)


@dataclass(frozen=True)
class Wrong:
    student: str
    task: int
    mistake: str
    old: str
    new: str
    failing: tuple[str, ...]  # the checks that must fail (by name); None: all of them
    hint: str

    def source(self) -> str:
        solution = (EXERCISES / "solutions" / NAMES[self.task]).read_text()
        if not self.old:
            return self.new
        assert self.old in solution, f"{self.mistake}: the solution no longer has {self.old!r}"
        return solution.replace(self.old, self.new, 1)


EVEN = (
    "base, extra = divmod(batch, num_devices)\n"
    "    return [base + (i < extra) for i in range(min(batch, num_devices))]"
)
SOLUTION7 = (EXERCISES / "solutions" / NAMES[7]).read_text()
RING_OLD = SOLUTION7[
    SOLUTION7.index("    flats = [tensor.view(-1) for tensor in tensors]") : SOLUTION7.index(
        "\n\n\ndef allreduce_gradients_("
    )
]
RING_WHOLE = """    flats = [tensor.view(-1) for tensor in tensors]
    passing = [flat.clone() for flat in flats]
    for _ in range(n - 1):  # each lane's whole tensor goes once around the ring
        sent = [
            copy_to(passing[i], devices[(i + 1) % n], "allreduce", devices[i]) for i in range(n)
        ]
        for i in range(n):
            flats[(i + 1) % n].add_(sent[i])
        passing = [sent[(i - 1) % n] for i in range(n)]"""
RING_ON_COPIES = (
    RING_OLD.replace("tensor.view(-1) for", "tensor.reshape(-1).clone() for", 1)
    + "\n    for tensor, flat in zip(tensors, flats):\n        tensor.data = flat.view_as(tensor)"
)
RING_GATHER = SOLUTION7[
    SOLUTION7.index("    for step in range(n - 1):  # all-gather") : SOLUTION7.index(
        "\n\n\ndef allreduce_gradients_("
    )
]
SOLUTION5 = (EXERCISES / "solutions" / NAMES[5]).read_text()
APPLY5 = "dpkit.parallel_apply(replicas, chunks, devices=used)"
APPLY5_LINE = SOLUTION5[: SOLUTION5.index(APPLY5)].count("\n") + 1  # its line in the file
WRONG = [
    Wrong(
        "five",
        1,
        "scatter that drops dim when it recurses into a list",
        "return [list(shares) for shares in zip(*(scatter(x, devices, dim) for x in inputs))]",
        "return [list(shares) for shares in zip(*(scatter(x, devices) for x in inputs))]",
        ("scatter splits tuples, lists and dicts element by element",),
        "scatter([x.T], lanes, dim=1) did not split x.T along dim 1",
    ),
    Wrong(
        "six",
        1,
        "scatter that splits a tensor without passing dim to scatter_tensor",
        "return list(scatter_tensor(inputs, devices, dim))",
        "return list(scatter_tensor(inputs, devices))",
        ("scatter splits tuples, lists and dicts element by element",),
        "scatter([x.T], lanes, dim=1) did not split x.T along dim 1",
    ),
    Wrong(
        "one",
        1,
        "an even split instead of torch.chunk's",
        "rows = math.ceil(batch / num_devices)\n    full, rest = divmod(batch, rows)\n"
        "    return [rows] * full + ([rest] if rest else [])",
        EVEN,
        (
            "chunk_sizes matches torch.chunk on the classic examples",
            "chunk_sizes matches torch.chunk for any batch and device count",
        ),
        "chunk_sizes(10, 4) returned [3, 3, 2, 2], torch.chunk gives [3, 3, 3, 1]",
    ),
    Wrong(
        "two",
        1,
        "an OrderedDict scattered into plain dicts",
        "return [type(inputs)(zip(keys, shares)) for shares in per_key]",
        "return [dict(zip(keys, shares)) for shares in per_key]",
        ("scatter splits tuples, lists and dicts element by element",),
        "scatter(OrderedDict(a=x, b=y), lanes) gave ['dict'] per device; a mapping stays",
    ),
    Wrong(
        "one",
        2,
        "a backward that keeps lane 0's gradient instead of adding",
        "total = grad if total is None else total + grad",
        "total = grad if total is None else total",
        ("Broadcast.backward sums the gradients of all copies",),
        "backward must add the gradients of a's copies on every lane",
    ),
    Wrong(
        "two",
        2,
        "a syntax error",
        "",
        "import torch\n\n\ndef replicate(module, devices)\n    return []\n",
        (),
        "task2_replicate.py could not be imported (line 4): SyntaxError",
    ),
    Wrong(
        "one",
        3,
        "workers given the caller's grad mode that do not apply it",
        "    torch.set_grad_enabled(grad_enabled)\n",
        "",
        (
            "parallel_apply carries the caller's grad mode into the threads",
            "apply_replica runs the module under the grad mode it is given",
        ),
        "each worker must apply the caller's mode with torch.set_grad_enabled(grad_enabled)",
    ),
    Wrong(
        "three",
        3,
        "reraise without the RuntimeError fallback (a two-argument exception type)",
        "    try:\n        error = type(failure.exception)(message)\n    except Exception:\n"
        "        raise RuntimeError(message) from failure.exception\n"
        "    raise error from failure.exception",
        "    raise type(failure.exception)(message) from failure.exception",
        ("reraise raises RuntimeError for a type that cannot be built from one message",),
        "reraise raised TypeError",
    ),
    Wrong(
        "two",
        3,
        "a file that raises on import",
        "",
        "x = 1\ny = {}['missing']\n",
        (),
        "task3_parallel_apply.py could not be imported (line 2): KeyError",
    ),
    Wrong(
        "one",
        4,
        "a (1,)-shaped gradient for a scalar piece (autograd would hide it in .grad)",
        "grad.view(()) if ctx.scalars else grad",
        "grad",
        ("a scalar piece gets a scalar gradient",),
        "a scalar piece needs a gradient of shape ()",
    ),
    Wrong(
        "two",
        4,
        "strings gathered instead of rejected",
        "if isinstance(first, (list, tuple)):",
        "if isinstance(first, str):\n        return outputs\n"
        "    if isinstance(first, (list, tuple)):",
        ("gather handles dicts, lists, tuples, namedtuples and None",),
        "gather(['a string', 'b'], lanes[0]) returned without raising TypeError",
    ),
    Wrong(
        "one",
        5,
        "train_step without zero_grad",
        "    optimizer.zero_grad()\n",
        "",
        ("three data-parallel SGD steps train exactly like one device",),
        "zero the gradients first",
    ),
    Wrong(
        "one",
        6,
        "proportional shares with the rest by largest remainder",
        "key=lambda i: (sizes[i] + 1) / speeds[i]",
        "key=lambda i: sizes[i] - batch * speeds[i] / total",
        ("weighted_chunk_sizes minimises the slowest device's time",),
        "rounding proportional shares is not enough",
    ),
    Wrong(
        "two",
        6,
        "a speed of 0 accepted",
        "if any(speed <= 0 for speed in speeds):",
        "if any(speed < 0 for speed in speeds):",
        ("weighted_chunk_sizes returns one whole-row size per device, adding up to the batch",),
        "weighted_chunk_sizes(10, [1.0, 0.0]) returned without raising ValueError",
    ),
    Wrong(
        "three",
        6,
        "torch's chunks not padded with 0 for idle devices",
        "    equal += [0] * (len(speeds) - len(equal))\n",
        "",
        ("weighted chunks beat torch's equal chunks on unequal devices",),
        "pad with 0 for the 3 idle devices",
    ),
    Wrong(
        "three",
        7,
        "a ring that passes whole tensors (the right sum, twice the bytes at 4 lanes)",
        RING_OLD,
        RING_WHOLE,
        (
            "in the ring each lane sends 2(n-1)/n of a gradient, only to its neighbour",
            "reduce-add loads lane 0 with (n-1)N bytes; the ring spreads 2(n-1)/n N over all",
        ),
        "a ring sends 2 * (n - 1) chunks of N / n",
    ),
    Wrong(
        "one",
        7,
        "the host not counted as lane 0",
        "max(transfer.source.index, 0), max(transfer.destination.index, 0)",
        "transfer.source.index, transfer.destination.index",
        ("traffic_per_lane counts the bytes each lane sends and receives",),
        "the host (-1) counts as lane 0",
    ),
    Wrong(
        "two",
        7,
        "a listener left behind when run raises",
        "    try:\n        run()\n    finally:\n        handle.remove()",
        "    run()\n    handle.remove()",
        ("traffic_per_lane counts the bytes each lane sends and receives",),
        "left its transfer listener registered",
    ),
    # Found by benchmarks/grader_mutation.py: checks the grader makes in its own process
    # (the parent sees only the values), which a grader with the assert removed would pass.
    Wrong(
        "three",
        1,
        "chunks left where they are (split, never moved to their lanes)",
        'return tuple(copy_to(piece, device, "scatter") for piece, device in zip(pieces, devices))',
        "return pieces",
        (
            "scatter_tensor puts chunk i on lane i with the right rows",
            "scatter_tensor copies every chunk except lane 0's, once",
        ),
        "chunk 1 is not on lane 1: move it with copy_to",
    ),
    Wrong(
        "three",
        4,
        "a Gather that ignores its destination (an untagged torch.cat, which is on lane 0)",
        "        return place(torch.cat(moved, dim), destination)\n",
        "        return torch.cat(moved, dim)\n",
        ("Gather concatenates the pieces in order on the destination",),
        "gathered onto virtual:2 (cpu), the result is not there (device_of gives cpu)",
    ),
    Wrong(
        "two",
        5,
        "train_step returns the loss tensor, not a float",
        "    return loss.item()",
        "    return loss",
        ("three data-parallel SGD steps train exactly like one device",),
        "train_step should return a float, got <class 'torch.Tensor'>",
    ),
    Wrong(
        "three",
        5,
        "max_gradient_difference returns a tensor, not a float",
        "(a.grad - b.grad).abs().max().item()",
        "(a.grad - b.grad).abs().max()",
        (
            "max_gradient_difference is tiny for a correct data-parallel forward",
            "max_gradient_difference detects a wrong forward",
        ),
        "return a float, got Tensor",
    ),
    Wrong(
        "three",
        2,
        "lane 0 given a copy too (replica 0 no longer shares the module's storage)",
        'tuple(copy_to(t, device, "broadcast") for device in devices for t in tensors)',
        'tuple(copy_to(t.clone(), device, "broadcast") for device in devices for t in tensors)',
        ("Broadcast.forward returns every tensor on every lane, device by device",),
        "lane 0's copy must share storage: no copy",
    ),
    Wrong(
        "four",
        3,
        "reraise's RuntimeError fallback raised without the original as its cause",
        "        raise RuntimeError(message) from failure.exception\n",
        "        raise RuntimeError(message)\n",
        ("reraise raises RuntimeError for a type that cannot be built from one message",),
        "raise the RuntimeError from the original exception (raise ... from ...)",
    ),
    Wrong(
        "four",
        2,
        "the module itself returned as replica 0",
        "    for position, _ in enumerate(devices):\n        replica = copy.deepcopy(module)\n",
        "    for position, _ in enumerate(devices):\n        if position == 0:\n"
        "            replicas.append(module)\n            continue\n"
        "        replica = copy.deepcopy(module)\n",
        ("replicate makes one working replica per lane, parameters on that lane",),
        "replicas must be new modules, not the model itself",
    ),
    Wrong(
        "four",
        7,
        "ring_allreduce_ returns the tensors as well as summing in place",
        "            chunks[(i + 1) % n][(i + 1 - step) % n].copy_(sent[i])\n",
        "            chunks[(i + 1) % n][(i + 1 - step) % n].copy_(sent[i])\n"
        "    return list(tensors)\n",
        ("ring_allreduce_ leaves the sum on every lane, in place",),
        "ring_allreduce_ works in place and returns None",
    ),
    Wrong(
        "five",
        3,
        "parallel_apply returns a tuple of the outputs, not a list",
        "    outputs = [results[index] for index in range(len(modules))]\n",
        "    outputs = tuple(results[index] for index in range(len(modules)))\n",
        ("parallel_apply returns each replica's output, in replica order",),
        "return a list, got tuple",
    ),
    Wrong(
        "four",
        6,
        "floor division of float speeds: whole-row sizes that are floats (3.0)",
        "sizes = [int(batch * speed / total) for speed in speeds]\n"
        "    for _ in range(batch - sum(sizes)):",
        "sizes = [batch * speed // total for speed in speeds]\n"
        "    for _ in range(int(batch - sum(sizes))):",
        (
            "weighted_chunk_sizes returns one whole-row size per device, adding up to the batch",
            "equal speeds give sizes that differ by at most one",
            "weighted_chunk_sizes minimises the slowest device's time",
        ),
        "sizes must be ints >= 0",
    ),
    Wrong(
        "five",
        6,
        "the report's speedup stored under another key (speed_up)",
        '        "speedup": torch_seconds / weighted_seconds,\n',
        '        "speed_up": torch_seconds / weighted_seconds,\n',
        ("weighted chunks beat torch's equal chunks on unequal devices",),
        "the report lacks ['speedup']",
    ),
    Wrong(
        "four",
        1,
        "the chunks detached from the input (no gradient flows back)",
        "    pieces = tensor.split(sizes, dim)\n",
        "    pieces = tensor.detach().split(sizes, dim)\n",
        ("gradients flow back from the chunks to the input",),
        "do not detach the chunks",
    ),
    Wrong(
        "five",
        2,
        "copies made with clone() instead of copy_to (right values, never on their lanes)",
        'tuple(copy_to(t, device, "broadcast") for device in devices for t in tensors)',
        "tuple(t.clone() for device in devices for t in tensors)",
        (
            "Broadcast.forward returns every tensor on every lane, device by device",
            "Broadcast.forward copies each tensor once to each lane but lane 0",
        ),
        "output 2 is not on lane 1",
    ),
    Wrong(
        "six",
        2,
        "every replica given lane 0's copies (the flat layout's offset forgotten)",
        "swap_parameter(replica, name, copies[position * len(params) + index])",
        "swap_parameter(replica, name, copies[index])",
        ("replicate makes one working replica per lane, parameters on that lane",),
        "replica 1's weight is not on lane 1",
    ),
    Wrong(
        "six",
        3,
        "apply_replica stores the bare exception, not a ReplicaFailure",
        "        results[index] = ReplicaFailure(index, device, error, traceback.format_exc())\n",
        "        results[index] = error\n",
        (
            "apply_replica stores a ReplicaFailure instead of raising",
            "an exception in a replica is raised in the caller, naming the replica",
        ),
        "should be a ReplicaFailure, got",
    ),
    Wrong(
        "five",
        7,
        "a ring run on flattened copies, the sums swapped in with .data (new storage)",
        RING_OLD,
        RING_ON_COPIES,
        ("ring_allreduce_ leaves the sum on every lane, in place",),
        "write into the tensors' own storage",
    ),
    Wrong(
        "six",
        7,
        "compare_traffic's reduce-add spelled with a hyphen",
        '        "reduce_add": traffic_per_lane(\n',
        '        "reduce-add": traffic_per_lane(\n',
        ("reduce-add loads lane 0 with (n-1)N bytes; the ring spreads 2(n-1)/n N over all",),
        "keys are ['reduce-add', 'ring']",
    ),
    Wrong(
        "four",
        5,
        "the replicas' outputs returned as a list, never gathered",
        "    return dpkit.gather(outputs, used[0])\n",
        "    return outputs\n",
        (
            "the data-parallel forward computes module(x)",
            "data-parallel gradients equal single-device gradients",
            "three data-parallel SGD steps train exactly like one device",
            "max_gradient_difference is tiny for a correct data-parallel forward",
        ),
        "expected one output gathered from the replicas",
    ),
    # Found by a student's wrong solutions (A1, A2, A4-A6, B1, B2): each passed, or got a
    # hint that did not say what was wrong.
    Wrong(
        "seven",
        5,
        "the output gathered on the last used device, not on devices[0]",
        "    return dpkit.gather(outputs, used[0])\n",
        "    return dpkit.gather(outputs, used[-1])\n",
        ("the data-parallel forward computes module(x)",),
        "not on devices[0] (lane 0): gather onto devices[0]",
    ),
    Wrong(
        "six",
        5,
        "dpkit.parallel_apply given the devices as its third positional argument (kwargs_tup)",
        APPLY5,
        "dpkit.parallel_apply(replicas, chunks, used)",
        (
            "the data-parallel forward computes module(x)",
            "one replica runs per lane that got a chunk, on that lane",
            "data-parallel gradients equal single-device gradients",
            "three data-parallel SGD steps train exactly like one device",
            "max_gradient_difference is tiny for a correct data-parallel forward",
        ),
        f"your code raised TypeError at {NAMES[5]} line {APPLY5_LINE}: Caught TypeError in "
        "replica 0",
    ),
    Wrong(
        "seven",
        3,
        "outputs in the order the threads finished (the results dict's insertion order)",
        "    outputs = [results[index] for index in range(len(modules))]\n"
        "    for output in outputs:\n"
        "        if isinstance(output, ReplicaFailure):\n"
        "            reraise(output)\n",
        "    for index in range(len(modules)):\n"
        "        if isinstance(results[index], ReplicaFailure):\n"
        "            reraise(results[index])\n"
        "    outputs = list(results.values())\n",
        ("parallel_apply returns each replica's output, in replica order",),
        "not in the order the threads finished",
    ),
    Wrong(
        "seven",
        1,
        "zip_longest instead of zip: as many entries as the element with the most chunks",
        "return [tuple(shares) for shares in zip(*(scatter(x, devices, dim) for x in inputs))]",
        'return [\n            tuple(shares)\n            for shares in __import__("itertools")'
        ".zip_longest(*(scatter(x, devices, dim) for x in inputs))\n        ]",
        ("scatter keeps namedtuples and shares other objects by reference",),
        "keep as many entries as the element with the fewest (zip, not zip_longest)",
    ),
    Wrong(
        "seven",
        4,
        "Gather.backward splits the gradient along dim 0, not the forward's dim",
        "grad_output.split(ctx.sizes, ctx.dim)",
        "grad_output.split(ctx.sizes, 0)",
        ("gradients flow back to every piece, the matching slice each",),
        "gathered along dim 1, ",
    ),
    Wrong(
        "eight",
        4,
        "gather turns an OrderedDict into a plain dict",
        "        return type(first)(\n",
        "        return dict(\n",
        ("gather handles dicts, lists, tuples, namedtuples and None",),
        "gathering OrderedDicts gave a plain dict",
    ),
    Wrong(
        "seven",
        2,
        "Broadcast.forward returns a list, not a tuple (autograd never runs its backward)",
        'return tuple(copy_to(t, device, "broadcast") for device in devices for t in tensors)',
        'return [copy_to(t, device, "broadcast") for device in devices for t in tensors]',
        (
            "Broadcast.backward sums the gradients of all copies",
            "Broadcast.forward returns every tensor on every lane, device by device",
            "Broadcast.backward moves each lane's gradient to lane 0 once",
        ),
        "so backward never ran: forward must return a tuple of tensors",
    ),
    Wrong(
        "five",
        5,
        "replicas made with copy.deepcopy, not replicate (no gradient reaches the module)",
        "    replicas = dpkit.replicate(module, used)\n",
        "    import copy\n\n    replicas = [copy.deepcopy(module) for _ in used]\n",
        (
            "data-parallel gradients equal single-device gradients",
            "three data-parallel SGD steps train exactly like one device",
            "max_gradient_difference is tiny for a correct data-parallel forward",
        ),
        "got no gradient through the data-parallel forward",
    ),
    # Found by a student's wrong solutions (B4, B7-B9): each got a hint that did not name
    # its mistake (a cascade, a raw error, an internal message).
    Wrong(
        "seven",
        7,
        "gradients averaged over the replicas, as real DDP does, instead of summed",
        "        ring_allreduce_([param.grad for param in params], devices)\n",
        "        ring_allreduce_([param.grad for param in params], devices)\n"
        "        for param in params:\n            param.grad /= len(replicas)\n",
        ("all-reduced replica gradients equal DataParallel's gradients",),
        "is DataParallel's divided by 4, the number of replicas (off by a factor n = 4): "
        "allreduce_gradients_ leaves the sum over the replicas, not the average",
    ),
    Wrong(
        "eight",
        7,
        "the all-gather passes chunk i - step, one behind the chunk lane i holds finished",
        RING_GATHER,
        RING_GATHER.replace("(i + 1 - step) % n", "(i - step) % n"),
        (
            "ring_allreduce_ works for any size and any number of lanes (10 over 4 lanes)",
            "ring_allreduce_ leaves the sum on every lane, in place",
            "ring_allreduce_ works for any size and any number of lanes (3 over 4 lanes)",
            "ring_allreduce_ works for any size and any number of lanes (2x3x5 over 3 lanes)",
            "all-reduced replica gradients equal DataParallel's gradients",
        ),
        "lane 0 does not hold the sum in 10 of its 10 element(s): after n - 1 reduce-scatter "
        "steps lane i holds chunk (i + 1) % n summed",
    ),
    Wrong(
        "nine",
        7,
        "chunks of numel // n elements, which leave the last numel % n elements out",
        "    sizes = [base + 1 if c < extra else base for c in range(n)]\n"
        "    chunks = [flat.split(sizes) for flat in flats]",
        "    sizes = [base] * n\n    chunks = [flat[: base * n].split(sizes) for flat in flats]",
        (
            "ring_allreduce_ works for any size and any number of lanes (10 over 4 lanes)",
            "ring_allreduce_ leaves the sum on every lane, in place",
            "ring_allreduce_ works for any size and any number of lanes (3 over 4 lanes)",
            "all-reduced replica gradients equal DataParallel's gradients",
        ),
        "lane 0 still holds its own values in its last 2 element(s), which no chunk covered: "
        "the n chunks together must cover the whole flat tensor",
    ),
    Wrong(
        "eight",
        1,
        "a namedtuple built from one generator, type(x)(gen), not from its fields",
        "type(inputs)(*shares) for shares in",
        "type(inputs)(share for share in shares) for shares in",
        ("scatter keeps namedtuples and shares other objects by reference",),
        "Pair.__new__() missing 1 required positional argument: 'label' (a namedtuple is built "
        "from its fields, one argument each: type(x)(*fields), not type(x)(iterable))",
    ),
    Wrong(
        "five",
        4,
        "a namedtuple gathered into type(x)(gen), not from its fields",
        "return type(first)(*(gather(items, destination, dim) for items in zip(*outputs)))",
        "return type(first)(gather(items, destination, dim) for items in zip(*outputs))",
        ("gather handles dicts, lists, tuples, namedtuples and None",),
        "(a namedtuple is built from its fields, one argument each: type(x)(*fields)",
    ),
    Wrong(
        "nine",
        1,
        "objects that are not tensors copied with copy.copy, not shared by reference",
        "    return [inputs for _ in devices]\n",
        '    return [__import__("copy").copy(inputs) for _ in devices]\n',
        ("scatter keeps namedtuples and shares other objects by reference",),
        "other objects are shared by reference, the same object in every entry, not copied",
    ),
    Wrong(
        "six",
        6,
        "no check of the speeds, rows handed out one at a time: a speed of 0 divides by zero",
        "    if any(speed <= 0 for speed in speeds):\n"
        '        raise ValueError(f"speeds must all be positive, got {list(speeds)}")\n'
        "    total = sum(speeds)\n"
        "    sizes = [int(batch * speed / total) for speed in speeds]\n"
        "    for _ in range(batch - sum(sizes)):\n",
        "    sizes = [0] * len(speeds)\n    for _ in range(batch):\n",
        ("weighted_chunk_sizes returns one whole-row size per device, adding up to the batch",),
        "weighted_chunk_sizes(10, [1.0, 0.0]) raised ZeroDivisionError (float division by "
        "zero), not ValueError",
    ),
    Wrong(
        "eight",
        3,
        "apply_replica that never unpacks a tuple input (module(input) always)",
        "    arguments = input if isinstance(input, (list, tuple)) else (input,)\n",
        "    arguments = (input,)\n",
        ("apply_replica stores the output under the replica's index",),
        "apply_replica stored a ReplicaFailure for a tuple input (x, y), which the module takes "
        "(TypeError: ",
    ),
    Wrong(
        "eight",
        2,
        "the copies swapped into the module itself for replica 0, then deep-copied",
        "        replica = copy.deepcopy(module)\n",
        "        replica = copy.deepcopy(module) if position else module\n",
        (
            "replicate makes one working replica per lane, parameters on that lane",
            "gradients of every replica add up in the original module",
            "replicate leaves the module's own parameters in place",
        ),
        "replicate swapped the copies into the module itself, and copy.deepcopy then failed on it",
    ),
    Wrong(
        "eight",
        5,
        "the largest signed difference, without abs()",
        "(a.grad - b.grad).abs().max().item()",
        "(a.grad - b.grad).max().item()",
        ("max_gradient_difference detects a wrong forward",),
        "take the largest absolute difference: .abs() before .max()",
    ),
    Wrong(
        "ten",
        1,
        "every chunk cloned before it is moved, lane 0's too",
        'copy_to(piece, device, "scatter")',
        'copy_to(piece.clone(), device, "scatter")',
        ("scatter_tensor puts chunk i on lane i with the right rows",),
        "chunk 0 is a copy of the input's rows",
    ),
    Wrong(
        "ten",
        2,
        "the copies' gradients averaged, not summed",
        "            sums.append(total)",
        "            sums.append(total / len(ctx.devices))",
        ("Broadcast.backward sums the gradients of all copies",),
        "a.grad is not the sum of its copies' gradients",
    ),
    Wrong(
        "eleven",
        2,
        "each replica deep-copied from the one made before, not from the module",
        "        replica = copy.deepcopy(module)\n",
        "        replica = copy.deepcopy(replicas[-1] if replicas else module)\n",
        (
            "replicate makes one working replica per lane, parameters on that lane",
            "gradients of every replica add up in the original module",
            "replicate leaves the module's own parameters in place",
        ),
        "copy.deepcopy failed on a module whose parameters are Broadcast's outputs",
    ),
    Wrong(
        "twelve",
        2,
        "the parameters cloned before the broadcast (replica 0 has copies of its own)",
        "    copies = Broadcast.apply(devices, *params)",
        "    copies = Broadcast.apply(devices, *[param.clone() for param in params])",
        ("replicate makes one working replica per lane, parameters on that lane",),
        "replica 0 must share storage with the module",
    ),
    Wrong(
        "nine",
        2,
        "every replica deep-copied first, then replica 0 replaced by the module itself",
        "    replicas = []\n    for position, _ in enumerate(devices):\n"
        "        replica = copy.deepcopy(module)\n",
        "    replicas = []\n    fresh = [copy.deepcopy(module) for _ in devices]\n"
        "    fresh[0] = module\n    for position, _ in enumerate(devices):\n"
        "        replica = fresh[position]\n",
        (
            "gradients of every replica add up in the original module",
            "replicate makes one working replica per lane, parameters on that lane",
            "replicate leaves the module's own parameters in place",
        ),
        "replica 0 is the model itself, whose parameters replicate swapped for copies",
    ),
    # the grader audit's submissions (a careless or gaming student: right on the grader's old
    # inputs, wrong for a user)
    Wrong(
        "six",
        4,
        "gather that turns a tuple into a list",
        "        return type(first)(gather(items, destination, dim) for items in zip(*outputs))",
        "        return [gather(items, destination, dim) for items in zip(*outputs)]",
        ("gather handles dicts, lists, tuples, namedtuples and None",),
        "a list into a list, a tuple into a tuple",
    ),
    Wrong(
        "eleven",
        1,
        "scatter whose tuple branch drops dim",
        (
            "        return [tuple(shares) for shares in zip(*(scatter(x, devices,"
            " dim) for x in inputs))]"
        ),
        "        return [tuple(shares) for shares in zip(*(scatter(x, devices) for x in inputs))]",
        ("scatter splits tuples, lists and dicts element by element",),
        "scatter((x.T,), lanes, dim=1) did not split x.T along dim 1",
    ),
    Wrong(
        "nine",
        3,
        "apply_replica that unpacks only a tuple input, not a list",
        "    arguments = input if isinstance(input, (list, tuple)) else (input,)",
        "    arguments = input if isinstance(input, tuple) else (input,)",
        ("apply_replica stores the output under the replica's index",),
        "a list input holds the positional arguments too",
    ),
    Wrong(
        "thirteen",
        2,
        "replicate that walks one level of submodules",
        (
            "    names = [name for name, _ in module.named_parameters()]\n"
            "    params = [param for _, param in module.named_parameters()]"
        ),
        (
            '    names = [f"{child}.{p}" for child, sub in module.named_children()'
            " for p in sub._parameters]\n"
            "    params = [module.get_parameter(name) for name in names]"
        ),
        ("gradients of every replica add up in the original module",),
        "0.0.weight.grad is None: replica parameters must be outputs of Broadcast",
    ),
    Wrong(
        "four",
        4,
        "gather whose dict branch drops dim",
        "            (key, gather([o[key] for o in outputs], destination, dim)) for key in first",
        "            (key, gather([o[key] for o in outputs], destination)) for key in first",
        ("gather handles dicts, lists, tuples, namedtuples and None",),
        # pieces of unequal widths make torch.cat along dim 0 raise ("... except in dimension
        # 0"); equal ones gather wrong values ("did not concatenate ... along dim 1"): the
        # grader draws both, and each hint names the dimension
        "dim",
    ),
    Wrong(
        "twelve",
        1,
        "scatter whose namedtuple branch drops dim",
        (
            "            type(inputs)(*shares) for shares in zip(*(scatter(x,"
            " devices, dim) for x in inputs))"
        ),
        (
            "            type(inputs)(*shares) for shares in zip(*(scatter(x,"
            " devices) for x in inputs))"
        ),
        ("scatter keeps namedtuples and shares other objects by reference",),
        "pass dim on to every scatter call made for a namedtuple's field",
    ),
    Wrong(
        "seven",
        6,
        "weighted_chunk_sizes that refuses only a speed of exactly 0",
        "    if any(speed <= 0 for speed in speeds):",
        "    if 0 in speeds:",
        ("weighted_chunk_sizes returns one whole-row size per device, adding up to the batch",),
        "a negative speed is not a speed",
    ),
    Wrong(
        "eight",
        6,
        "straggler_report computed with simulated_step_time, not measured",
        (
            "    torch_seconds = measure_step_time(equal, speeds, per_row_seconds)\n"
            "    weighted_seconds = measure_step_time(weighted, speeds, per_row_seconds)"
        ),
        (
            "    torch_seconds = simulated_step_time(equal, speeds, per_row_seconds)\n"
            "    weighted_seconds = simulated_step_time(weighted, speeds, per_row_seconds)"
        ),
        ("weighted chunks beat torch's equal chunks on unequal devices",),
        "measure both with measure_step_time",
    ),
    Wrong(
        "nine",
        5,
        "the replicas run one parallel_apply call at a time",
        "    outputs = dpkit.parallel_apply(replicas, chunks, devices=used)",
        (
            "    outputs = [\n"
            "        dpkit.parallel_apply([replica], [chunk], devices=[device])[0]\n"
            "        for replica, chunk, device in zip(replicas, chunks, used)\n"
            "    ]"
        ),
        ("one replica runs per lane that got a chunk, on that lane",),
        "the replicas did not run at the same time",
    ),
    Wrong(
        "ten",
        3,
        "parallel_apply on a pool of 4 worker threads",
        (
            "    threads = [\n"
            "        threading.Thread(\n"
            "            target=apply_replica, args=(index, module, input, device,"
            " grad_enabled, results)\n"
            "        )\n"
            "        for index, (module, input, device) in enumerate(zip(modules,"
            " inputs, devices))\n"
            "    ]\n"
            "    for thread in threads:\n"
            "        thread.start()\n"
            "    for thread in threads:\n"
            "        thread.join()"
        ),
        (
            "    from concurrent.futures import ThreadPoolExecutor\n"
            "\n"
            "    with ThreadPoolExecutor(max_workers=4) as pool:  # one worker per lane\n"
            "        for index, (module, input, device) in enumerate(zip(modules,"
            " inputs, devices)):\n"
            "            pool.submit(apply_replica, index, module, input, device,"
            " grad_enabled, results)"
        ),
        ("parallel_apply runs every replica at the same time, each in its own thread",),
        "the replicas did not all run at the same time",
    ),
    Wrong(
        "thirteen",
        1,
        "scatter that rebuilds every dict as an OrderedDict",
        "        return [type(inputs)(zip(keys, shares)) for shares in per_key]",
        (
            "        from collections import OrderedDict\n"
            "        return [OrderedDict(zip(keys, shares)) for shares in per_key]"
        ),
        ("scatter splits tuples, lists and dicts element by element",),
        "a plain dict a plain dict",
    ),
    Wrong(
        "fourteen",
        2,
        "replicate that calls Broadcast.apply once per parameter",
        (
            "    copies = Broadcast.apply(devices, *params)\n"
            "    replicas = []\n"
            "    for position, _ in enumerate(devices):\n"
            "        replica = copy.deepcopy(module)\n"
            "        for index, name in enumerate(names):\n"
            "            swap_parameter(replica, name, copies[position *"
            " len(params) + index])"
        ),
        (
            "    per_param = [Broadcast.apply(devices, param) for param in params]\n"
            "    replicas = []\n"
            "    for position, _ in enumerate(devices):\n"
            "        replica = copy.deepcopy(module)\n"
            "        for index, name in enumerate(names):\n"
            "            swap_parameter(replica, name, per_param[index][position])"
        ),
        ("replicate makes one working replica per lane, parameters on that lane",),
        "call it once, with all 4 parameters",
    ),
    Wrong(
        "ten",
        7,
        "DDP's gradients summed in one place, not around the ring",
        "        ring_allreduce_([param.grad for param in params], devices)",
        "        total = sum(param.grad for param in params)\n"
        "        for param in params:\n"
        "            param.grad.copy_(total)",
        ("all-reduced replica gradients equal DataParallel's gradients",),
        "sum each parameter's .grad with ring_allreduce_",
    ),
]


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[tuple[str, int], list[grading.CheckResult]]:
    folder = tmp_path_factory.mktemp("wrong")
    for wrong in WRONG:
        (folder / wrong.student).mkdir(exist_ok=True)
        (folder / wrong.student / NAMES[wrong.task]).write_text(wrong.source())
    by: dict[tuple[str, int], list[grading.CheckResult]] = {}
    for student, result in grading.grade_submissions(folder):
        by.setdefault((student, result.task), []).append(result)
    return by


@pytest.mark.parametrize("wrong", WRONG, ids=[w.mistake for w in WRONG])
def test_a_wrong_answer_fails_its_checks_with_its_hint(graded, wrong):
    results = graded[(wrong.student, wrong.task)]
    failed = {r.check: r.hint for r in results if not r.passed}
    if not wrong.failing:  # a file that cannot be imported fails every check
        assert len(failed) == len(results), grading.report(results)
        assert all(wrong.hint in hint for hint in failed.values()), grading.report(results)
        return
    assert sorted(failed) == sorted(wrong.failing), (
        f"{wrong.mistake}: expected only {wrong.failing} to fail\n" + grading.report(results)
    )
    assert wrong.hint in failed[wrong.failing[0]], grading.report(results)


def test_every_task_has_a_wrong_answer_that_is_caught():
    assert {w.task for w in WRONG} == set(NAMES)


def test_an_error_in_a_replica_shows_the_replicas_own_error_and_the_line(graded):
    """dpkit's parallel_apply wraps a replica's error: its first line names the replica, its
    last line (after the worker's traceback) is the error itself; the hint shows both, and
    the line of the student's file."""
    results = graded[("six", 5)]
    hint = next(
        r.hint for r in results if r.check == "the data-parallel forward computes module(x)"
    )
    assert f"{NAMES[5]} line {APPLY5_LINE}:" in hint, hint
    assert hint.endswith("argument after ** must be a mapping, not Device"), hint


def test_a_ring_whose_steps_are_wrong_is_not_told_to_fix_its_chunk_sizes(graded):
    """The all-gather off by one leaves wrong sums on every size: each hint names the
    ring's steps, none the chunks' sizes (which are right)."""
    failed = [r for r in graded[("eight", 7)] if not r.passed and "ring_allreduce_" in r.check]
    assert len(failed) == 4, grading.report(graded[("eight", 7)])
    for result in failed:
        assert "reduce-scatter steps" in result.hint, result.hint
        assert "chunks together must cover" not in result.hint, result.hint
        assert "nearly equal" not in result.hint, result.hint


def test_the_readmes_sample_report_is_what_the_grader_prints(graded):
    """exercises/README.md shows the report of an even split (student one's task 1): its
    first hint is the grader's, word for word."""
    readme = (EXERCISES / "README.md").read_text()
    sample = readme[readme.index("You get a line per check") :]
    shown = next(line for line in sample.splitlines() if line.startswith("      hint: "))
    results = graded[("one", 1)]
    assert shown in grading.report(results).splitlines(), grading.report(results)
    assert "6/8 checks passed: keep going" in sample
    assert sum(r.passed for r in results) == 6
