"""The process tree.

The reaper and its spawner, membership (cgroups, markers), short external commands under
deadlines, hang forensics and the ranks of a distributed job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from . import _cgroup, _tree
    from ._commands import CommandResult as CommandResult
    from ._commands import open_command as open_command
    from ._commands import run_command as run_command
    from ._commands import run_command_sync as run_command_sync
    from ._commands import stop_process as stop_process
    from ._forensics import KernelLogFollower as KernelLogFollower
    from ._forensics import collect_forensics as collect_forensics
    from ._forensics import oom_kills as oom_kills
    from ._forensics import seconds_since_boot as seconds_since_boot
    from ._ranks import WRAPPER_NAMES as WRAPPER_NAMES
    from ._ranks import RoleFold as RoleFold
    from ._ranks import judge_ranks as judge_ranks
    from ._ranks import launcher_of as launcher_of
    from ._ranks import parse_rank_environ as parse_rank_environ
    from ._ranks import ranks_section as ranks_section
    from ._ranks import read_environ as read_environ
    from ._ranks import role as role
    from ._ranks import stall_culprit as stall_culprit
    from ._ranks import states_from_json as states_from_json
    from ._spawn import REAPER_MODULE as REAPER_MODULE
    from ._spawn import Spawner as Spawner
    from ._spawn import SpawnRequest as SpawnRequest
    from ._tree import cmdline as cmdline
    from ._tree import environments as environments
    from ._tree import holds_open as holds_open
    from ._tree import start_time_ticks as start_time_ticks

    cgroups = _cgroup
    process_tree = _tree
else:
    __getattr__, __dir__ = lazy_door(
        __name__,
        {
            "CommandResult": "._commands",
            "open_command": "._commands",
            "run_command": "._commands",
            "run_command_sync": "._commands",
            "stop_process": "._commands",
            "KernelLogFollower": "._forensics",
            "collect_forensics": "._forensics",
            "oom_kills": "._forensics",
            "seconds_since_boot": "._forensics",
            "WRAPPER_NAMES": "._ranks",
            "judge_ranks": "._ranks",
            "launcher_of": "._ranks",
            "parse_rank_environ": "._ranks",
            "ranks_section": "._ranks",
            "read_environ": "._ranks",
            "role": "._ranks",
            "stall_culprit": "._ranks",
            "states_from_json": "._ranks",
            "RoleFold": "._ranks",
            "REAPER_MODULE": "._spawn",
            "SpawnRequest": "._spawn",
            "Spawner": "._spawn",
            "cmdline": "._tree",
            "environments": "._tree",
            "holds_open": "._tree",
            "start_time_ticks": "._tree",
        },
        modules={"cgroups": "._cgroup", "process_tree": "._tree"},
    )
