"""The process tree.

The reaper and its spawner, membership (cgroups, markers), short external commands under
deadlines, hang forensics and the ranks of a distributed job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from . import _cgroup as cgroups  # noqa: F401 (a module the door hands out whole)
    from . import _tree as process_tree  # noqa: F401 (a module the door hands out whole)
    from ._commands import CommandResult as CommandResult
    from ._commands import open_command as open_command
    from ._commands import run_command as run_command
    from ._commands import run_command_sync as run_command_sync
    from ._commands import stop_process as stop_process
    from ._forensics import KernelLogFollower as KernelLogFollower
    from ._forensics import collect_forensics as collect_forensics
    from ._forensics import oom_kills as oom_kills
    from ._forensics import prefetch_oom_records as prefetch_oom_records
    from ._forensics import seconds_since_boot as seconds_since_boot
    from ._ranks import RoleFold as RoleFold
    from ._ranks import judge_ranks as judge_ranks
    from ._ranks import launcher_of as launcher_of
    from ._ranks import read_rank as read_rank
    from ._ranks import stall_culprit as stall_culprit
    from ._ranks import states_from_json as states_from_json
    from ._spawn import REAPER_CLOSE_TIMEOUT_SECONDS as REAPER_CLOSE_TIMEOUT_SECONDS
    from ._spawn import REAPER_MODULE as REAPER_MODULE
    from ._spawn import REAPER_SCRIPT as REAPER_SCRIPT
    from ._spawn import Spawner as Spawner
    from ._spawn import SpawnRequest as SpawnRequest
    from ._tree import cmdline as cmdline
    from ._tree import environments as environments
    from ._tree import holds_open as holds_open
    from ._tree import start_time_ticks as start_time_ticks

__getattr__, __dir__ = lazy_door(__name__, __file__)
