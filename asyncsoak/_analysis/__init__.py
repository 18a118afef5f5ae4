"""Judgement over time: the trend estimator, the fold of a run's series that the rules read,
what a stall was doing, GPU health, and the goodput ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import lazy_door

if TYPE_CHECKING:
    from ._activity import GpuActivity as GpuActivity
    from ._activity import agreeing as agreeing
    from ._activity import describe_activity as describe_activity
    from ._activity import describe_gpus as describe_gpus
    from ._activity import recorded_gpus as recorded_gpus
    from ._activity import tree_verdict as tree_verdict
    from ._goodput import BADPUT_KINDS as BADPUT_KINDS
    from ._goodput import QUEUE_KINDS as QUEUE_KINDS
    from ._goodput import Ledger as Ledger
    from ._goodput import RunEnds as RunEnds
    from ._goodput import StepMark as StepMark
    from ._goodput import ledger as ledger
    from ._goodput_fold import CHECKPOINT_GLOBS as CHECKPOINT_GLOBS
    from ._goodput_fold import GoodputFold as GoodputFold
    from ._goodput_sum import JOB_KINDS as JOB_KINDS
    from ._goodput_sum import AttemptPart as AttemptPart
    from ._goodput_sum import JobLedger as JobLedger
    from ._goodput_sum import artifact_gpus as artifact_gpus
    from ._goodput_sum import fleet_ledgers as fleet_ledgers
    from ._goodput_sum import fleet_total as fleet_total
    from ._goodput_sum import highest_step as highest_step
    from ._goodput_sum import job_ledger as job_ledger
    from ._goodput_sum import join_runs as join_runs
    from ._goodput_sum import lost_by_cause as lost_by_cause
    from ._goodput_sum import run_span as run_span
    from ._gpu_health import GpuHealthFold as GpuHealthFold
    from ._trendfold import GPU_SETTLE_SECONDS as GPU_SETTLE_SECONDS
    from ._trendfold import TREE_MEMORY_SERIES as TREE_MEMORY_SERIES
    from ._trends import MAX_WINDOWS as MAX_WINDOWS
    from ._trends import SAMPLES_PER_WINDOW as SAMPLES_PER_WINDOW
    from ._trends import describe_growth as describe_growth
    from ._trends import format_amount as format_amount
    from ._trends import format_bytes as format_bytes
    from ._trends import median as median
    from ._trends import theil_sen as theil_sen
    from ._trends import windowed_minima as windowed_minima
    from ._trendwatch import MEMORY_NOT_JUDGED as MEMORY_NOT_JUDGED
    from ._trendwatch import TrendWatch as TrendWatch
    from ._trendwatch import memory_not_judged as memory_not_judged
    from ._trendwatch import straggler_text as straggler_text

__getattr__, __dir__ = lazy_door(__name__, __file__)
