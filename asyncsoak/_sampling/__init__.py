"""The samplers.

The process tree and machine from /proc, GPUs through nvidia-smi and their health, the progress
watchdog and step files, the limits they are judged against, and the runtime snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._gpu_find import find_nvidia_smi as find_nvidia_smi
    from ._gpu_health import fault_gpu as fault_gpu
    from ._gpu_sampler import run_gpu_sampler as run_gpu_sampler
    from ._inotify import Inotify as Inotify
    from ._limits import CGROUP_ROOT as CGROUP_ROOT
    from ._limits import MemoryCgroup as MemoryCgroup
    from ._limits import cgroup_cpu_limit_cores as cgroup_cpu_limit_cores
    from ._limits import cgroup_memory_max_bytes as cgroup_memory_max_bytes
    from ._limits import read_limits as read_limits
    from ._nvidia_smi import CLOCK_EVENT_REASONS as CLOCK_EVENT_REASONS
    from ._proc_task import run_proc_sampler as run_proc_sampler
    from ._progress_rules import ProgressTracker as ProgressTracker
    from ._progress_rules import final_scan as final_scan
    from ._progress_rules import latest_change_age as latest_change_age
    from ._progress_rules import skipped_message as skipped_message
    from ._progress_scan import ScanResult as ScanResult
    from ._progress_scan import path_matches as path_matches
    from ._progress_scan import scan_progress_dir as scan_progress_dir
    from ._snapshot import collect_snapshot as collect_snapshot
    from ._snapshot import runtime_snapshot as runtime_snapshot
    from ._step_files import KeyChoice as KeyChoice
    from ._step_rules import LOSS_CHECKS as LOSS_CHECKS
    from ._step_rules import PROGRESS_SOURCES as PROGRESS_SOURCES
    from ._step_rules import LossCheck as LossCheck
    from ._step_rules import ProgressSource as ProgressSource
    from ._step_rules import StaleLimit as StaleLimit
    from ._step_rules import StepTracker as StepTracker
    from ._steps import StepReader as StepReader
    from ._watchdog import run_watchdog as run_watchdog

__getattr__, __dir__ = lazy_door(__name__, __file__)
