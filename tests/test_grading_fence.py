"""The seccomp filter (dpkit/grading/fence.py) refuses what native code could aim outside
the run, and keeps the run's own thread signals working.

Native code is outside every Python rule of the grading process (ctypes is refused by the
warden, but an extension module a submission writes and imports is not), so these checks
make the system calls themselves, through ctypes, in a fresh ``python -I`` that loads
``fence.py`` alone (standard library only: no torch, a few tenths of a second). The target
is a bystander ``sleep`` of the same user, and every call that reaches it sends signal 0 (a
probe that changes nothing) or reads nothing.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

FENCE = Path(__file__).resolve().parent.parent / "dpkit" / "grading" / "fence.py"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
    reason="the seccomp filter is for Linux on x86-64 and arm64",
)

PROBE = r"""
import ctypes, errno, importlib.util, json, mmap, os, platform, signal, sys, threading

spec = importlib.util.spec_from_file_location("fence", sys.argv[1])
fence = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fence)
bystander = int(sys.argv[2])
# From the kernel's tables, not the filter's: gettid, tgkill, tkill, ptrace, process_vm_readv
NUMBERS = {"x86_64": (186, 234, 200, 101, 310), "aarch64": (178, 131, 130, 117, 270)}
GETTID, TGKILL, TKILL, PTRACE, READV = NUMBERS[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def call(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    return errno.errorcode.get(ctypes.get_errno(), "ok") if result == -1 else "ok"


def int80_kill(pid):
    # x86-64 only: kill(pid, 0) through the 32-bit ABI (int 0x80, i386 kill = 37), in a
    # forked child, since a kernel without that ABI answers with a fault.
    code = bytes([0x53, 0xB8, 37, 0, 0, 0, 0xBB]) + pid.to_bytes(4, "little")
    code += bytes([0x31, 0xC9, 0xCD, 0x80, 0x5B, 0xC3])  # xor ecx; int 0x80; pop rbx; ret
    child = os.fork()
    if child == 0:
        memory = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        memory.write(code)
        address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
        result = ctypes.CFUNCTYPE(ctypes.c_int)(address)()
        os._exit(0 if result == 0 else 1 if result == -errno.EPERM else 2)
    return {0: "ok", 1: "EPERM"}.get(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), "n/a")


out = {"int80_before": int80_kill(bystander) if platform.machine() == "x86_64" else "n/a"}
why = fence.install()
if why is not None:
    print(json.dumps({"not_installed": why}))
    sys.exit(0)
out["tgkill_bystander"] = call(TGKILL, bystander, bystander, 0)
out["tkill_bystander"] = call(TKILL, bystander, 0)
out["tgkill_own"] = call(TGKILL, os.getpid(), libc.syscall(GETTID), 0)
out["ptrace_bystander"] = call(PTRACE, -1, bystander, 0, 0)  # an unknown request
out["readv_bystander"] = call(READV, bystander, 0, 0, 0, 0, 0)  # nothing to read
out["int80_after"] = int80_kill(bystander) if platform.machine() == "x86_64" else "n/a"
# A signal to the main thread from a worker (pthread_kill: tgkill with this process).
seen = []
signal.signal(signal.SIGUSR1, lambda *_: seen.append("SIGUSR1"))
main = threading.main_thread().ident
worker = threading.Thread(target=signal.pthread_kill, args=(main, signal.SIGUSR1))
worker.start()
worker.join()
signal.raise_signal(signal.SIGUSR1)  # raise(): tgkill with this process
out["own_signals"] = seen
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probed() -> dict:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", PROBE, str(FENCE), str(bystander.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        alive = bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    if "not_installed" in result:
        pytest.skip(f"no seccomp here: {result['not_installed']}")
    assert alive
    return result


def test_a_thread_signal_to_another_process_is_refused(probed):
    assert probed["tgkill_bystander"] == "EPERM"
    assert probed["tkill_bystander"] == "EPERM"


def test_the_runs_own_thread_signals_still_work(probed):
    assert probed["tgkill_own"] == "ok"
    assert probed["own_signals"] == ["SIGUSR1", "SIGUSR1"]


def test_another_processs_memory_is_refused(probed):
    assert probed["ptrace_bystander"] == "EPERM"
    assert probed["readv_bystander"] == "EPERM"


def test_the_32_bit_abi_is_refused(probed):
    if probed["int80_before"] != "ok":
        pytest.skip("this kernel has no 32-bit ABI (int 0x80) to refuse")
    assert probed["int80_after"] == "EPERM"
