"""How a run ended (exit statuses decoded, asyncsoak's own, the crash in the output), a
namespace the contract's door hands out whole, each name's module imported on its first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._door import lazy_door

if TYPE_CHECKING:
    from ._crash import LAUNCHER_EXCEPTIONS as LAUNCHER_EXCEPTIONS
    from ._crash import CrashInLog as CrashInLog
    from ._crash import RankCrash as RankCrash
    from ._crash import describe_crash as describe_crash
    from ._crash import describe_rank_crash as describe_rank_crash
    from ._crash import find_exception as find_exception
    from ._crash import find_rank_exception as find_rank_exception
    from ._crash import last_traceback as last_traceback
    from ._exit_codes import DETAILED_EXIT_CODES as DETAILED_EXIT_CODES
    from ._exit_codes import EXIT_FAILED as EXIT_FAILED
    from ._exit_codes import EXIT_PASSED as EXIT_PASSED
    from ._exit_codes import EXIT_USAGE as EXIT_USAGE
    from ._exit_codes import detailed_exit_code as detailed_exit_code
    from ._exit_codes import verdict_exit_code as verdict_exit_code
    from ._exits import SHELL_SIGNAL_BASE as SHELL_SIGNAL_BASE
    from ._exits import decode as decode
    from ._exits import describe_exit_status as describe_exit_status
    from ._exits import forwarded_signals as forwarded_signals
    from ._exits import signal_name as signal_name
    from ._exits import signals_sent as signals_sent

if not TYPE_CHECKING:  # the type checker reads the names above, and only those
    __getattr__, __dir__ = lazy_door(__name__, __file__)
