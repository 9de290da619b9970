"""Shared helpers of the maintd subsystem collectors: root prefix handling and verdict output."""

import json
import os
import sys

ORDER = ["Ok", "live-repair", "evacuate", "evacuate-failover"]


def root():
    """The root-path prefix: --root PATH, else $MAINTD_ROOT, else /."""
    args = sys.argv[1:]
    if "--root" in args:
        i = args.index("--root")
        if i + 1 >= len(args):
            sys.exit("--root needs a path")
        return args[i + 1]
    return os.environ.get("MAINTD_ROOT", "/")


def path(*parts):
    return os.path.join(root(), *[p.lstrip("/") for p in parts])


def read(p, default=None):
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError:
        return default


def emit(status, details, command=None):
    """Prints one partial verdict, byte-stable for the same state."""
    v = {"status": status, "details": details}
    if command:
        v["command"] = command
    print(json.dumps(v, sort_keys=True, separators=(",", ":")))
