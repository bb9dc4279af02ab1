"""The kernel's half of "a run signals only its own processes": a seccomp filter.

The surprise first: Python's audit hooks (:mod:`dpkit.grading.warden`) see ``os.kill`` and
``os.killpg``, but ``os.pidfd_open`` and ``signal.pidfd_send_signal`` raise no audit event
at all, so a submission could open the grader's pid (or any process of the instructor's
user, where there are no namespaces) and send it SIGKILL with nothing Python could refuse.
So before any student code runs, the grading process installs a seccomp filter, which it
and every process it starts keep for good (the kernel offers no way to remove one):

- ``pidfd_open`` and ``pidfd_send_signal`` fail with EPERM (the harness and the graders
  never use them);
- ``kill`` with a negative pid (``os.kill(-1, ...)``: every process of the user;
  ``os.killpg``: a whole process group) fails with EPERM; ``kill(0, ...)``, the run's own
  group, and a positive pid pass to the audit hook, which allows only the run's own
  process tree;
- ``tkill``, ``rt_sigqueueinfo`` and ``rt_tgsigqueueinfo`` (a signal to a thread or a
  queued signal anywhere; Python offers none of them) fail with EPERM;
- on x86-64, system calls of the x32 ABI fail too (the same calls under other numbers).

``tgkill`` stays allowed (``signal.pthread_kill`` and ``raise`` use it on the process's own
threads); a filter cannot compare its pid with the caller's across forks, so only native
code could misuse it, and native code (ctypes, a built extension) is the container's to stop.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_EPERM = 0x00050000 | errno.EPERM
X32_BIT = 0x40000000

# arch token, then kill, tkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal,
# pidfd_open (from the kernel's syscall tables)
ARCHES = {
    "x86_64": (0xC000003E, 62, 200, 129, 297, 424, 434),
    "aarch64": (0xC00000B7, 129, 130, 138, 240, 424, 434),
}

# Classic BPF opcodes (linux/filter.h)
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06


def _program(arch: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``arch``: (code, jump if true, jump if false, k) per instruction, the
    jumps as labels first ("allow", "deny"), then as the offsets BPF wants."""
    token, kill, *refused = ARCHES[arch]
    labelled: list[tuple[int, object, object, int]] = [
        (LD_W_ABS, 0, 0, 4),  # the call's architecture
        (JEQ_K, 0, "allow", token),  # another one (a 32-bit program): not ours to judge
        (LD_W_ABS, 0, 0, 0),  # the call's number
    ]
    if arch == "x86_64":
        labelled.append((JGE_K, "deny", 0, X32_BIT))
    labelled += [(JEQ_K, "deny", 0, number) for number in refused]
    labelled += [
        (JEQ_K, 0, "allow", kill),
        (LD_W_ABS, 0, 0, 16),  # kill's pid: the low 32 bits of its first argument
        (JSET_K, "deny", "allow", 0x80000000),  # negative: -1 or a process group
        (RET_K, 0, 0, RET_ALLOW),
        (RET_K, 0, 0, RET_EPERM),
    ]
    where = {"allow": len(labelled) - 2, "deny": len(labelled) - 1}

    def offset(jump: object, index: int) -> int:
        return where[jump] - index - 1 if isinstance(jump, str) else int(jump)  # type: ignore[call-overload]

    return [
        (code, offset(true, i), offset(false, i), k)
        for i, (code, true, false, k) in enumerate(labelled)
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
    program = _program(arch)
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
