"""``asyncsoak snapshot [ROOT]``: the runtime snapshot of a source tree and this machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import EXIT_OK


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "snapshot",
        help="print the source, GPU, software, host and environment provenance as JSON",
    )
    parser.add_argument(
        "root", nargs="?", type=Path, default=Path("."), help="source tree (default: .)"
    )
    parser.add_argument(
        "--nvidia-smi", default="nvidia-smi", metavar="PATH", help="nvidia-smi to ask"
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="bound on each external command"
    )
    parser.set_defaults(handler=snapshot_command)


def snapshot_command(args: argparse.Namespace) -> int:
    from .._sampling import collect_snapshot

    snapshot = collect_snapshot(args.root, nvidia_smi=args.nvidia_smi, timeout=args.timeout)
    print(json.dumps(snapshot, indent=2, allow_nan=False))
    return EXIT_OK
