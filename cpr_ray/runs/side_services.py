"""Side services of a run — live metrics, the progress file — never stop it.

What they record is for watching a run, not part of its result: whatever one of them raises
(a store out of reach, a value the metrics library refuses) is said once per service and
process, in one line saying what is lost and what to check, and the run goes on. Experiment
tracking says its own line (`tracking._advice`), since it knows which store failed.
"""

from __future__ import annotations

import sys
import threading

_said: set[str] = set()
_lock = threading.Lock()


def side_failure(service: str, what: str, exc: BaseException, lost: str) -> None:
    """`service: what failed (the error's first line); lost` on stderr, the first time only."""
    with _lock:
        if service in _said:
            return
        _said.add(service)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    sys.stderr.write(f"{service}: {what} failed ({first}); {lost}\n")
