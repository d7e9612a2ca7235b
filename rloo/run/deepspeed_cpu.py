"""DeepSpeed on CPU processes (gloo), through Lightning's own DeepSpeedStrategy, and DeepSpeed's CPU op built before
the run under rloo's lock.

Lightning's DeepSpeedStrategy refuses any accelerator but CUDA, and names CPU devices without an index, which
DeepSpeed reads as each process's device rank. `CPUDeepSpeedStrategy` is Lightning's strategy with those two things
changed and nothing else: DeepSpeed itself runs on its CPU accelerator (`DS_ACCELERATOR=cpu`), which it supports.

On CPU, DeepSpeed builds its shared-memory collective op (`deepspeed_shm_comm`) with the system compiler the first
time a process group starts, in torch's extensions dir, guarded by torch's own lock file. A build that is killed
leaves that file behind, and every later run waits on it forever, printing nothing. `build_cpu_ops` builds the op
before the run under an flock of rloo's (released by the kernel when its holder dies, so never stale): a torch lock
file found while holding it is left from a killed build; it is named in one line and removed.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DeepSpeedStrategy

CPU_OPS = ("ShareMemCommBuilder",)  # the ops DeepSpeed's CPU accelerator builds when a run starts


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy, allowed on CPU processes: each process's device is `cpu:<local rank>`."""

    @property
    def parallel_devices(self):
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices) -> None:
        # DeepSpeed takes the root device's index as the process's device rank; Lightning's CPU devices have none
        indexed = [torch.device("cpu", i) if d.type == "cpu" else d for i, d in enumerate(devices or [])]
        self._parallel_devices = indexed if devices is not None else None

    def setup_environment(self) -> None:
        if isinstance(self.accelerator, CPUAccelerator):  # DeepSpeedStrategy's own refuses every accelerator but CUDA
            super(DeepSpeedStrategy, self).setup_environment()
        else:
            super().setup_environment()


def extensions_root() -> Path:
    """Where torch builds extensions (TORCH_EXTENSIONS_DIR, else torch's default under the user's cache)."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def stale_build_locks(root: Path) -> list[Path]:
    """torch's lock files of DeepSpeed op builds under `root` (one dir per Python and CUDA version, one per op)."""
    return sorted(root.glob("*/deepspeed_*/lock"))


def build_cpu_ops(log=print) -> None:
    """DeepSpeed's CPU ops built (or found built) before the run, one process at a time under rloo's flock; a torch
    lock file left by a killed build is named and removed. Sets DS_ACCELERATOR=cpu for this process and its ranks."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    root = extensions_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "rloo-deepspeed-build.lock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when this process ends, however it ends
        for lock in stale_build_locks(root):
            log(f"rloo: removed {lock}, left by a DeepSpeed op build that was killed (it would block every run)")
            lock.unlink(missing_ok=True)
        from deepspeed.accelerator import get_accelerator

        for name in CPU_OPS:
            builder = get_accelerator().create_op_builder(name)
            if builder is not None and builder.is_compatible():
                stdout = sys.stdout
                try:
                    sys.stdout = sys.stderr  # the compiler's lines stay off the run's output
                    builder.load(verbose=False)
                finally:
                    sys.stdout = stdout
