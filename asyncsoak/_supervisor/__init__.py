"""The supervisor.

``run_soak``, its validated configuration, the caller's control handle, the soak's own files and
the scheduler it may run under.
"""
