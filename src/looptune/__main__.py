"""``python -m looptune`` is the ``looptune`` command.

Wrapped in torch's ``record``: when a rank launched by torchrun (or ``--nproc``) raises, its
exception goes to the error file the launcher reads, so the job's error names the rank and why.
"""

from torch.distributed.elastic.multiprocessing.errors import record

from looptune.cli.main import main

if __name__ == "__main__":
    raise SystemExit(record(main)())
