"""The distributed trainer of the torch tests (test_distributed, test_slurm): real ranks on
the gloo backend, started by torchrun or srun."""

from __future__ import annotations

#: A trainer whose rank 1, at step 3 and by mode: raises, stops in its own ``load_batch``
#: (while rank 0 waits in ``all_reduce``), or stops itself with SIGSTOP.  Each rank appends
#: its steps to its own file in the progress directory.
TRAINER = """\
import os, signal, sys, time
import torch
import torch.distributed as dist

mode, out = sys.argv[1], sys.argv[2]


def load_batch(step):
    if rank == 1 and step == 3 and mode == "raise":
        raise ValueError(f"bad batch at step {step} on rank {rank}")
    if rank == 1 and step == 3 and mode == "hang":
        while True:
            time.sleep(0.05)
    if rank == 1 and step == 3 and mode == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    return torch.ones(4) * (rank + 1)


# Under torchrun, RANK and WORLD_SIZE; under srun, SLURM's own variables.
dist.init_process_group(
    "gloo",
    rank=int(os.environ.get("RANK") or os.environ["SLURM_PROCID"]),
    world_size=int(os.environ.get("WORLD_SIZE") or os.environ["SLURM_NTASKS"]),
)
rank = dist.get_rank()
for step in range(200):
    batch = load_batch(step)
    dist.all_reduce(batch)
    with open(f"{out}/rank{rank}.log", "a") as f:
        f.write(f"step {step}\\n")
    time.sleep(0.05)
"""
#: Line numbers of the trainer's ``raise`` and of the loop rank 1 hangs in.
RAISE_LINE = (
    TRAINER.splitlines().index(
        '        raise ValueError(f"bad batch at step {step} on rank {rank}")'
    )
    + 1
)
HANG_LINE = TRAINER.splitlines().index("            time.sleep(0.05)") + 1
