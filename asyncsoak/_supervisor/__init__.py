"""The supervisor.

``run_soak`` and its task group, its validated configuration, the caller's control handle, the
stop sequence, the verdict on the command's exit, the runtime snapshot task, the soak's own
files and the artifact's write, and the scheduler it may run under.
"""
