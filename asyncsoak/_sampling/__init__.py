"""The samplers.

The process tree and machine from /proc, GPUs through nvidia-smi, the progress watchdog, and the
limits they are judged against.
"""
