"""The kernel's half of "a run signals only its own processes": a seccomp filter.

The surprise first: Python's audit hooks (:mod:`dpkit.grading.warden`) see ``os.kill`` and
``os.killpg``, but ``os.pidfd_open`` and ``signal.pidfd_send_signal`` raise no audit event
at all, and native code (an extension module a submission writes and imports, or machine
code written through ``/proc/self/mem``) makes system calls no Python rule sees. So before
any student code runs, the grading process installs a seccomp filter, which it and every
process it starts keep for good (the kernel offers no way to remove one):

- ``pidfd_open``, ``pidfd_send_signal`` and ``pidfd_getfd`` fail with EPERM (the harness
  and the graders never use them);
- ``kill`` with a negative pid (``os.kill(-1, ...)``: every process of the user;
  ``os.killpg``: a whole process group) fails with EPERM; ``kill(0, ...)``, the run's own
  group, and a positive pid pass to the audit hook, which allows only the run's own
  process tree;
- ``tgkill`` (a signal to one thread of a process) passes only when its process is the one
  that installed the filter: ``signal.pthread_kill``, ``raise`` and ``abort`` send it to
  their own process's threads, and native code can no longer aim it at any other;
- ``tkill``, ``rt_sigqueueinfo`` and ``rt_tgsigqueueinfo`` (a signal to any thread, a
  queued signal; Python offers none of them) fail with EPERM;
- ``ptrace``, ``process_vm_readv`` and ``process_vm_writev`` (another process's memory)
  fail with EPERM: without Yama, nothing else stops them between processes of one user;
- a system call of another ABI fails too: on x86-64 a 64-bit process can still make
  32-bit calls (``int 0x80``, other numbers, another ``arch`` in the filter's view), and
  x32 calls (the same calls under other numbers).

The limit of the ``tgkill`` rule: a filter sees a call's number and arguments, never who
makes it, so the process that installs it writes its own pid in as a constant, and a
process it forks inherits that constant. There, ``raise`` and ``signal.pthread_kill`` fail
with EPERM (``abort`` still ends the process, through the fault glibc provokes next);
``os.kill(os.getpid(), ...)`` still works (``kill``, checked by the audit hook). No
grader forks, and a run in its own PID namespace could not reach outside it either way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
from typing import NamedTuple

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_EPERM = 0x00050000 | errno.EPERM
X32_BIT = 0x40000000


class Arch(NamedTuple):
    """An architecture's audit token and the numbers of the calls the filter looks at
    (from the kernel's syscall tables)."""

    token: int
    kill: int
    tgkill: int
    refused: tuple[int, ...]  # tkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal,
    # pidfd_open, pidfd_getfd, ptrace, process_vm_readv, process_vm_writev


ARCHES = {
    "x86_64": Arch(0xC000003E, 62, 234, (200, 129, 297, 424, 434, 438, 101, 310, 311)),
    "aarch64": Arch(0xC00000B7, 129, 131, (130, 138, 240, 424, 434, 438, 117, 270, 271)),
}

# Classic BPF opcodes (linux/filter.h)
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06
ARCH, NR, ARG0_LOW = 4, 0, 16  # offsets in struct seccomp_data (arg0's low half: little-endian)


def _program(arch: str, own_pid: int) -> list[tuple[int, int, int, int]]:
    """The filter for ``arch`` in the process ``own_pid``: (code, jump if true, jump if
    false, k) per instruction, the jumps as labels first, then as the offsets BPF wants."""
    numbers = ARCHES[arch]
    labelled: list[tuple[int, object, object, int] | str] = [
        (LD_W_ABS, 0, 0, ARCH),
        (JEQ_K, 0, "deny", numbers.token),  # another ABI: int 0x80 on x86-64
        (LD_W_ABS, 0, 0, NR),
    ]
    if arch == "x86_64":
        labelled.append((JGE_K, "deny", 0, X32_BIT))
    labelled += [(JEQ_K, "deny", 0, number) for number in numbers.refused]
    labelled += [
        (JEQ_K, "tgkill", 0, numbers.tgkill),
        (JEQ_K, 0, "allow", numbers.kill),
        (LD_W_ABS, 0, 0, ARG0_LOW),  # kill's pid: the kernel reads the low 32 bits
        (JSET_K, "deny", "allow", 0x80000000),  # negative: -1 or a process group
        "tgkill",
        (LD_W_ABS, 0, 0, ARG0_LOW),  # tgkill's process
        (JEQ_K, "allow", "deny", own_pid & 0xFFFFFFFF),
        "allow",
        (RET_K, 0, 0, RET_ALLOW),
        "deny",
        (RET_K, 0, 0, RET_EPERM),
    ]
    where: dict[str, int] = {}
    instructions: list[tuple[int, object, object, int]] = []
    for entry in labelled:
        if isinstance(entry, str):
            where[entry] = len(instructions)
        else:
            instructions.append(entry)

    def offset(jump: object, index: int) -> int:
        return where[jump] - index - 1 if isinstance(jump, str) else int(jump)  # type: ignore[call-overload]

    return [
        (code, offset(true, i), offset(false, i), k)
        for i, (code, true, false, k) in enumerate(instructions)
    ]


installed = False


def install() -> str | None:
    """Install the filter in this process (and so in all it starts). Why not, or None."""
    global installed
    arch = platform.machine()
    if not sys.platform.startswith("linux") or arch not in ARCHES:
        return f"no seccomp filter for {sys.platform} {arch}"
    if installed:
        return None
    program = _program(arch, os.getpid())
    raw = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(program), ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong]
    prctl.argtypes += [ctypes.c_ulong]
    if prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(ctypes.get_errno())}"
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(ctypes.get_errno())}"
    installed = True
    return None
