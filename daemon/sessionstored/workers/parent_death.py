# The processes the daemon starts die with it, however it dies (kill -9 included):
# the fork server and each worker ask the kernel for SIGKILL when their parent goes
# (prctl PR_SET_PDEATHSIG, Linux). The signal follows the thread that started a
# process, not its process, so the fork server is started from a thread that lives
# as long as the daemon (offload.py: the event loop's). The resource tracker
# multiprocessing starts beside them exits by itself once they are all gone: it
# reads a pipe they hold until its end.
from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # prctl(2)
_libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc is among them


def die_with_parent() -> None:
    parent = os.getppid()
    with contextlib.suppress(AttributeError, OSError):
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)
