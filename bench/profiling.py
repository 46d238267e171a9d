"""Sampling profiles of a running server with py-spy, summarised as hot spots.

py-spy is optional (``pip install py-spy``; not a dependency of accord). :func:`record`
starts it on a PID for a number of seconds in raw (collapsed-stack) format;
:func:`hot_spots` turns that file into the functions with the most samples on top of
the stack ("self" time), as (function, percent of samples).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"\s*\(([^()]*?):\d+\)\s*$")


def py_spy() -> str | None:
    """The py-spy executable next to this interpreter, or on PATH, or None."""
    local = Path(sys.executable).with_name("py-spy")
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


def record(pid: int, seconds: float, out: Path, rate: int = 200,
           native: bool = False) -> subprocess.Popen[bytes]:
    """Start py-spy sampling ``pid`` for ``seconds`` into ``out``; the caller waits on it.

    Only the thread holding the GIL is sampled (``--gil``): Python's CPU time. With
    ``native`` the C frames (uvloop, grpc's Cython core) are included too.
    """
    exe = py_spy()
    if exe is None:
        raise FileNotFoundError("py-spy is not installed (pip install py-spy)")
    return subprocess.Popen(
        [exe, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", str(rate),
         "--gil", *(["--native"] if native else []), "-f", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _function(frame: str) -> str:
    """``name (path/to/file.py:12)`` -> ``name (file.py)``."""
    m = _LINE.search(frame)
    if not m:
        return frame.strip()
    name = frame[: m.start()].strip()
    return f"{name} ({Path(m.group(1)).name})"


def hot_spots(raw: Path, top: int = 10, *, inclusive_of: str = "") -> tuple[int, list[tuple[str, float]]]:
    """Total samples, and the ``top`` functions by samples with their percentage.

    By default a sample counts for the function on top of its stack (self time); with
    ``inclusive_of`` it counts once for every distinct function on the stack whose
    frame mentions that text (e.g. ``"accord/"``: time inside each accord function).
    """
    self_counts: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        if inclusive_of:
            for f in {_function(x) for x in frames if inclusive_of in x}:
                self_counts[f] += n
        else:
            self_counts[_function(frames[-1])] += n
    if total == 0:
        return 0, []
    return total, [(f, 100.0 * n / total) for f, n in self_counts.most_common(top)]
