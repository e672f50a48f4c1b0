"""What the daemon's child processes (the inference worker, the loader sandboxes) share:
they end with the daemon, even on `kill -9`, whatever they are busy with."""

from __future__ import annotations

import os
import threading
import time

PARENT_POLL_S = 1.0


def exit_with_parent(parent: int) -> None:
    """Exit once `parent` is gone: now if it already is, else from a thread that checks once
    a second that this process is still its child (a reparented one has another parent).
    Portable, and safe for a child any thread of the daemon may start; the worker adds
    Linux's `PR_SET_PDEATHSIG` on top, which acts at once."""
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
