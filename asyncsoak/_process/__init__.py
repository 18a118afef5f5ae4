"""The process tree.

The reaper and its spawner, membership (cgroup, markers), short external commands, hang
forensics and the cause of a crash.
"""
