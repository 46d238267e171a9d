"""Run one lossyfs mount: ``python -m tests.tools.lossyfs MOUNTPOINT --state DIR --control-fd N``.

The process serves the FUSE loop (multi-threaded; every operation holds the layer's
lock) and, on a thread of its own, the control connection ``N`` (one end of a
socket pair the controlling test made): one JSON object per line each way.

* ``{"cmd": "cut", "seed": S, "torn": bool}`` -> ``{"ok": true, "report": {...}}``
* ``{"cmd": "status"}`` -> ``{"ok": true, "status": {...}}``

When the controller goes away (end of file on the connection) the process unmounts
its mount point lazily and exits, so a crashed test leaves no mount behind. The
mount uses ``direct_io`` and zero cache timeouts: the kernel keeps no page, name or
attribute of the mount cached, so after a cut every read sees the rewound disk.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from .layer import VolatileLayer
from .ops import LossyFUSE, LossyOperations


def unmount(mountpoint: str, lazy: bool) -> int:
    """fusermount3 -u (or umount); returns its exit status."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is not None:
        args = [tool, "-u", *(["-z"] if lazy else []), mountpoint]
    else:
        args = ["umount", *(["-l"] if lazy else []), mountpoint]
    return subprocess.run(args, capture_output=True, timeout=30, check=False).returncode


def _serve_control(conn: socket.socket, layer: VolatileLayer, mountpoint: str) -> None:
    f = conn.makefile("rwb", buffering=0)
    try:
        for line in f:
            try:
                req = json.loads(line)
                cmd = req.get("cmd")
                if cmd == "cut":
                    seed = req.get("seed")
                    with layer.lock:
                        rep = layer.power_cut(None if seed is None else int(seed),
                                              bool(req.get("torn", False)))
                    resp: dict[str, object] = {"ok": True, "report": rep.as_dict()}
                elif cmd == "status":
                    with layer.lock:
                        resp = {"ok": True, "status": layer.status()}
                else:
                    resp = {"ok": False, "error": f"unknown command {cmd!r}; "
                                                  "known: cut, status"}
            except Exception as e:
                resp = {"ok": False, "error": f"{e!r}", "trace": traceback.format_exc()}
            f.write(json.dumps(resp).encode() + b"\n")
    finally:
        # The controller is gone: do not leave a mount behind.
        unmount(mountpoint, lazy=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lossyfs", description=__doc__.split("\n\n")[0])
    ap.add_argument("mountpoint")
    ap.add_argument("--state", required=True,
                    help="directory for the backing tree (state/backing) and the stash")
    ap.add_argument("--control-fd", type=int, required=True,
                    help="an inherited connected socket for control commands")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    layer = VolatileLayer(Path(args.state))
    conn = socket.socket(fileno=args.control_fd)
    ctl = threading.Thread(target=_serve_control, args=(conn, layer, args.mountpoint),
                           name="lossyfs-control", daemon=True)
    ctl.start()
    os.makedirs(args.mountpoint, exist_ok=True)
    LossyFUSE(
        LossyOperations(layer), args.mountpoint, foreground=True, fsname="lossyfs",
        direct_io=True, hard_remove=True, use_ino=True,
        attr_timeout=0, entry_timeout=0, negative_timeout=0, max_threads=8,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
