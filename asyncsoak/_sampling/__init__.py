"""The samplers.

The process tree and machine from /proc, GPUs through nvidia-smi and their health, the progress
watchdog and step files, the limits they are judged against, and the runtime snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._gpu_health import fault_gpu as fault_gpu
    from ._gpu_sampler import run_gpu_sampler as run_gpu_sampler
    from ._inotify import Inotify as Inotify
    from ._limits import CGROUP_ROOT as CGROUP_ROOT
    from ._limits import MemoryCgroup as MemoryCgroup
    from ._limits import cgroup_cpu_limit_cores as cgroup_cpu_limit_cores
    from ._limits import cgroup_memory_max_bytes as cgroup_memory_max_bytes
    from ._limits import read_limits as read_limits
    from ._nvidia_smi import CLOCK_EVENT_REASONS as CLOCK_EVENT_REASONS
    from ._proc_sampler import run_proc_sampler as run_proc_sampler
    from ._snapshot import collect_snapshot as collect_snapshot
    from ._snapshot import runtime_snapshot as runtime_snapshot
    from ._step_rules import LOSS_CHECKS as LOSS_CHECKS
    from ._step_rules import PROGRESS_SOURCES as PROGRESS_SOURCES
    from ._step_rules import LossCheck as LossCheck
    from ._step_rules import ProgressSource as ProgressSource
    from ._step_rules import StaleLimit as StaleLimit
    from ._step_rules import StepTracker as StepTracker
    from ._steps import KeyChoice as KeyChoice
    from ._steps import StepReader as StepReader
    from ._watchdog import ProgressTracker as ProgressTracker
    from ._watchdog import ScanResult as ScanResult
    from ._watchdog import final_scan as final_scan
    from ._watchdog import latest_change_age as latest_change_age
    from ._watchdog import run_watchdog as run_watchdog
    from ._watchdog import scan_progress_dir as scan_progress_dir
    from ._watchdog import skipped_message as skipped_message
else:
    __getattr__, __dir__ = lazy_door(
        __name__,
        {
            "fault_gpu": "._gpu_health",
            "run_gpu_sampler": "._gpu_sampler",
            "Inotify": "._inotify",
            "CGROUP_ROOT": "._limits",
            "MemoryCgroup": "._limits",
            "cgroup_cpu_limit_cores": "._limits",
            "cgroup_memory_max_bytes": "._limits",
            "read_limits": "._limits",
            "CLOCK_EVENT_REASONS": "._nvidia_smi",
            "run_proc_sampler": "._proc_sampler",
            "collect_snapshot": "._snapshot",
            "runtime_snapshot": "._snapshot",
            "LOSS_CHECKS": "._step_rules",
            "LossCheck": "._step_rules",
            "PROGRESS_SOURCES": "._step_rules",
            "ProgressSource": "._step_rules",
            "StaleLimit": "._step_rules",
            "StepTracker": "._step_rules",
            "KeyChoice": "._steps",
            "StepReader": "._steps",
            "ProgressTracker": "._watchdog",
            "ScanResult": "._watchdog",
            "final_scan": "._watchdog",
            "latest_change_age": "._watchdog",
            "run_watchdog": "._watchdog",
            "scan_progress_dir": "._watchdog",
            "skipped_message": "._watchdog",
        },
    )
