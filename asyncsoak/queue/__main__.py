"""``python -m asyncsoak.queue [--poll S] [--once] [--db PATH] ...``: ``asyncsoak worker``, a
program imported by no room (so the one module of the queue that may use the command line)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..cli import main as cli_main


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(["worker", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
