"""``python -m asyncsoak.queue [--poll S] [--once] [--db PATH] ...``: ``asyncsoak worker``.

The queue's entry point, and the one module of the queue that imports the command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``asyncsoak worker`` with ``argv`` (default: this process's arguments)."""
    from ..cli import main as cli_main

    return cli_main(["worker", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
