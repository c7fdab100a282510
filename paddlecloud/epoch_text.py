"""How an epoch is written for a user: counted from 0, everywhere a user reads one.

The master's API, its log (`epoch 3 complete`), the trainers (`epoch.number`), the
checkpoints (`TrainStatus.epoch`), `--start-epoch` and `RestartEpoch` all count from 0, so
the progress panel, `job status` and the status pages do too, with the job's range beside
the number (`epoch 3 of 0..4`) rather than a count from 1 that would read as another epoch.
"""

from __future__ import annotations


def epoch_of(epoch: int, num_epochs: int) -> str:
    """`epoch E of 0..N-1`; past the last epoch (the job's end) the last one; `epoch E of ?`
    before the master told the job's length."""
    if num_epochs <= 0:
        return f"epoch {epoch} of ?"
    return f"epoch {min(epoch, num_epochs - 1)} of 0..{num_epochs - 1}"
