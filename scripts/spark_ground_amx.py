"""Test ground, loaded at start-up by every Python of the vLLM venv (`spark_ground_amx.pth`).

On an x86 CPU with AMX, Linux lets a process run tile instructions only after it asked for them
(arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); the first tile instruction of a process that
did not ask dies with SIGILL. vLLM 0.32's CPU attention kernel uses AMX tiles without asking, in
worker processes that multiprocessing *spawns* (the permission does not survive exec); it works only
when oneDNN happened to ask first, for a bf16 matmul large enough to pick its own AMX kernel. With
the tiny models of the ground it often did not, and every completion killed the worker
("Worker proc VllmWorker-0 died unexpectedly (exit code: -4)"). Asking here, once per process,
gives every vLLM process what oneDNN would have asked for; on a CPU without AMX the call just fails.
"""

import os
import sys

if sys.platform == "linux" and os.uname().machine == "x86_64":
    try:
        import ctypes

        # syscall(SYS_arch_prctl=158, ARCH_REQ_XCOMP_PERM=0x1023, XFEATURE_XTILEDATA=18)
        ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)
    except Exception:  # the start-up of every interpreter: never fail it
        pass
