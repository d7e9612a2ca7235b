"""DeepSpeed on CPU processes (rloo.run.deepspeed_cpu), in this process: its op built under rloo's lock, a stale
lock of a killed build named and removed, and Lightning's strategy with CPU devices DeepSpeed can read. The runs
themselves, two gloo processes each: tests/test_scale_out.py."""

import fcntl
import sys

import pytest
import torch

deepspeed = pytest.importorskip("deepspeed")

from rloo.run import deepspeed_cpu  # noqa: E402 (after the skip: it imports Lightning's DeepSpeed strategy)


class RecordingBuilder:
    """Stands in for DeepSpeed's op builder: records that it was asked to build, and what it saw then."""

    def __init__(self, root, lock):
        self.root, self.lock, self.saw = root, lock, None

    def is_compatible(self):
        return True

    def load(self, verbose=False):
        with open(self.root / "rloo-deepspeed-build.lock", "a") as other:  # another process trying to build
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = False
            except BlockingIOError:
                held = True
        self.saw = {"lock_gone": not self.lock.exists(), "rloo_lock_held": held}


def test_a_stale_lock_of_a_killed_op_build_is_named_and_removed_before_the_build(tmp_path, monkeypatch):
    build_dir = tmp_path / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / "deepspeed_shm_comm"
    build_dir.mkdir(parents=True)
    lock = build_dir / "lock"  # what torch's FileBaton leaves when the build is killed
    lock.touch()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("DS_ACCELERATOR", "not-yet")  # restored after the test, whatever build_cpu_ops sets
    builder = RecordingBuilder(tmp_path, lock)
    accelerator = type("Accelerator", (), {"create_op_builder": lambda self, name: builder})()
    monkeypatch.setattr("deepspeed.accelerator.get_accelerator", lambda: accelerator)
    lines = []
    deepspeed_cpu.build_cpu_ops(lines.append)
    assert lines == [f"rloo: removed {lock}, left by a DeepSpeed op build that was killed (it would block every run)"]
    assert builder.saw == {"lock_gone": True, "rloo_lock_held": True}  # built after the removal, under rloo's lock
    assert deepspeed_cpu.os.environ["DS_ACCELERATOR"] == "cpu"
    lines.clear()
    deepspeed_cpu.build_cpu_ops(lines.append)  # nothing stale the second time: nothing said
    assert lines == []


def test_lightnings_deepspeed_strategy_on_cpu_names_each_process_its_device():
    """DeepSpeed reads the root device's index as the process's device rank; Lightning's CPU devices have none."""
    strategy = deepspeed_cpu.CPUDeepSpeedStrategy(stage=3)
    strategy.parallel_devices = [torch.device("cpu"), torch.device("cpu")]
    assert strategy.parallel_devices == [torch.device("cpu", 0), torch.device("cpu", 1)]
    strategy.parallel_devices = None
    assert strategy.parallel_devices is None
