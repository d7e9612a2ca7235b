"""Lightning's loggers as a run needs them, selected by conf/logger/*.yaml: the CSV logger made to continue a run (a
resumed run appends to metrics.csv; Lightning's own deletes the file it finds), and W&B with one run per job."""

from __future__ import annotations

import csv
import os

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class AppendingWriter(ExperimentWriter):
    """Appends to the metrics.csv it finds, its columns included (new columns rewrite the header, keeping every row)."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as file:
                self.metrics_keys = sorted(next(csv.reader(file), []))

    def _check_log_dir_exists(self) -> None:  # Lightning's deletes metrics.csv here
        pass


class AppendingCSVLogger(CSVLogger):
    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment


class WandbJobLogger(WandbLogger):
    """Lightning's WandbLogger, passing no `anonymous` setting (W&B has retired it and warns about it). Each job
    closes its run as it ends (end_wandb_run): Lightning's logger joins a W&B run still open in the process, and
    every job of a sweep would log into the first one."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)


def end_wandb_run(failed: bool) -> None:
    """Close the W&B run a job opened (exit code 1 marks it failed in W&B), so that the next job of a sweep in this
    process starts its own."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=1 if failed else 0)


def drop_rows_after(metrics_csv: str, rollouts: int) -> int:
    """Keep the rows of metrics.csv up to rollout `rollouts` (every row's step is the rollout it was logged at): a
    resumed run logs the later ones again. The dropped rows move to metrics.superseded.csv beside it. Returns how
    many moved."""
    if not os.path.isfile(metrics_csv):
        return 0
    with open(metrics_csv, newline="") as file:
        reader = csv.DictReader(file)
        fields, rows = reader.fieldnames or [], list(reader)
    kept = [row for row in rows if float(row["step"]) <= rollouts]
    dropped = [row for row in rows if float(row["step"]) > rollouts]
    if dropped:
        from rloo.utils import atomic

        for path, part in ((f"{metrics_csv[:-4]}.superseded.csv", dropped), (metrics_csv, kept)):
            atomic.write_text(path, _as_csv(fields, part), "the metrics log")
    return len(dropped)


def _as_csv(fields: list[str], rows: list[dict]) -> str:
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
