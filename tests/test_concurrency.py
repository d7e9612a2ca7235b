"""Where several processes meet: many jobs on one cache (rloo.utils.cache), two processes on one run dir
(rloo.utils.ownership), a rank of a multi-process run that dies or hangs, SIGTERM to a multi-process run's launcher."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from rloo.toy import arithmetic
from rloo.utils import cache, ownership
from rloo.utils.errors import ConfigError
from tests.e2e import FAST, HANG_GUARD_S, ROOT, finish, group_alive, live_holder, run_module, start, wait_for

SIGTERM_EXIT = 128 + 15


# ---- one cache, many jobs ----------------------------------------------------------------------------------------
def fake_package(site: Path) -> str:
    """An installed package holding a model file, and an empty `gguf` (the stand-in converters never read it)."""
    (site / "fake_weights").mkdir(parents=True)
    (site / "fake_weights" / "__init__.py").write_text("")
    (site / "fake_weights" / "m.gguf").write_bytes(b"weights v1")
    (site / "gguf").mkdir()
    (site / "gguf" / "__init__.py").write_text("")
    return "package:fake_weights/m.gguf"


# the stand-in converter: slow, and every file it writes names the process that wrote it
SLOW_CONVERT = """
import os, time
from rloo.models import packaged

def slow_convert(source, out):
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (out / name).write_text(f"{name} written by {os.getpid()}")
        time.sleep(0.4)

packaged._convert = slow_convert
"""


def python(code: str, *args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.slow
def test_concurrent_cold_conversions_make_one_entry_from_one_writer(tmp_path):
    spec, store = fake_package(tmp_path / "site"), tmp_path / "cache"
    driver = SLOW_CONVERT + "import sys\nprint(packaged.converted_dir(sys.argv[1], sys.argv[2]))\n"
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"}
    jobs = [python(driver, spec, str(store), env=env) for _ in range(3)]
    outputs = [job.communicate(timeout=HANG_GUARD_S)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0, 0], outputs
    assert not any("Traceback" in out for out in outputs)
    assert len({out.strip().splitlines()[-1] for out in outputs}) == 1  # one directory for all three
    assert sum("packaged model: converting m.gguf" in out for out in outputs) == 1  # one converter
    entry = Path(outputs[0].strip().splitlines()[-1])
    writers = {(entry / name).read_text().rsplit(" ", 1)[1] for name in ("config.json", "model.safetensors")}
    assert len(writers | {(entry / "tokenizer.json").read_text().rsplit(" ", 1)[1]}) == 1  # no mix of writers
    assert cache.damage(entry, "rloo-package.json") is None
    assert entries(store) == [entry.name, entry.name + ".lock"]  # no staging dir left


@pytest.mark.slow
def test_concurrent_cold_arithmetic_splits_are_one_entry(tmp_path):
    driver = "import sys\nfrom rloo.toy.arithmetic import split_path\nprint(split_path(sys.argv[1], 'train'))\n"
    jobs = [python(driver, str(tmp_path)) for _ in range(4)]
    outputs = [job.communicate(timeout=HANG_GUARD_S)[0] for job in jobs]
    assert [job.returncode for job in jobs] == [0] * 4 and not any("Traceback" in out for out in outputs), outputs
    paths = {out.strip() for out in outputs}
    assert len(paths) == 1
    lines = Path(paths.pop()).read_text().splitlines()
    assert [json.loads(line) for line in lines] == arithmetic.rows(2048, 0)
    assert entries(tmp_path) == ["arithmetic-v2-0", "arithmetic-v2-0.lock"]
    assert sorted(os.listdir(tmp_path / "arithmetic-v2-0")) == [
        "manifest.json",
        "test.jsonl",
        "train.jsonl",
        "validation.jsonl",
    ]


@pytest.mark.slow
def test_two_training_runs_on_a_cold_cache_build_the_embedded_task_once(tmp_path):
    store = tmp_path / "cache"
    jobs = [start(tmp_path / f"run{i}", store, "eval.before=false", "eval.after=false") for i in range(2)]
    results = [finish(process, log) for process, log in jobs]
    assert [code for code, _, _ in results] == [0, 0], [out[-3000:] for _, out, _ in results]
    assert not any("Traceback" in out for _, out, _ in results)
    assert sum("[bootstrap] building the embedded task's artifacts" in out for _, out, _ in results) == 1
    built = [p for p in store.iterdir() if not p.name.endswith(".lock")]
    assert len(built) == 1 and entries(store) == [built[0].name, built[0].name + ".lock"]
    from rloo.toy.bootstrap import damage

    assert damage(built[0]) is None


def damaged_manifest(root: Path, manifest: str) -> None:
    text = (root / manifest).read_text()
    (root / manifest).write_text(text[: len(text) // 2])


def manifest_without_files(root: Path, manifest: str) -> None:
    record = json.loads((root / manifest).read_text())
    del record["files"]
    (root / manifest).write_text(json.dumps(record))


def planted_file(root: Path, manifest: str) -> None:
    (root / "chat_template.jinja").write_text("{{ planted }}")


def truncated_file(root: Path, manifest: str) -> None:
    victim = next(p for p in sorted(root.iterdir()) if p.name != manifest)
    victim.write_text(victim.read_text()[:20])


DAMAGE = {
    "a truncated manifest": (damaged_manifest, "does not parse"),
    "a manifest without files": (manifest_without_files, "lists no files"),
    "a planted extra file": (planted_file, "chat_template.jinja was not built with the cache"),
    "a truncated file": (truncated_file, "is corrupt (its sha256 changed)"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_arithmetic_split_is_rebuilt_in_one_line(tmp_path, damage):
    harm, said_as = DAMAGE[damage]
    train = Path(arithmetic.split_path(str(tmp_path), "train", log=lambda line: None))
    whole = train.read_text()
    harm(train.parent, cache.MANIFEST)
    said = []
    assert arithmetic.split_path(str(tmp_path), "train", log=said.append) == str(train)
    assert len(said) == 1 and said_as in said[0] and said[0].endswith("building it again"), said
    assert train.read_text() == whole and not (train.parent / "chat_template.jinja").exists()
    assert entries(tmp_path) == ["arithmetic-v2-0", "arithmetic-v2-0.lock"]


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_conversion_is_converted_again_in_one_line(tmp_path, damage):
    from rloo.models.packaged import MANIFEST, cached_conversion

    harm, said_as = DAMAGE[damage]
    source = tmp_path / "m.gguf"
    source.write_bytes(b"weights v1")
    calls = []

    def convert(src, out):
        calls.append(out)
        (out / "config.json").write_text('{"model_type": "llama"}')
        (out / "model.safetensors").write_bytes(b"converted " + src.read_bytes())

    entry = Path(cached_conversion(source, tmp_path / "cache", convert, log=lambda line: None))
    harm(entry, MANIFEST)
    said = []
    assert cached_conversion(source, tmp_path / "cache", convert, log=said.append) == str(entry)
    assert len(calls) == 2 and cache.damage(entry, MANIFEST) is None
    assert [line for line in said if "building it again" in line] == [said[0]] and said_as in said[0], said
    assert (entry / "model.safetensors").read_bytes() == b"converted weights v1"


def test_a_manifest_from_another_source_is_never_trusted(tmp_path):
    def builder(source: str):
        def build(out: Path) -> dict:
            (out / "weights").write_text(source)
            return {"source_sha256": source}

        return build

    root = tmp_path / "entry"
    cache.entry(root, builder("old"), "the test entry")
    build = builder("new")
    said = []
    record = cache.entry(root, build, "the test entry", said.append, expect={"source_sha256": "new"})
    assert record["source_sha256"] == "new" and (root / "weights").read_text() == "new"
    manifest = root / cache.MANIFEST
    assert said == [f"the test entry: {manifest} records source_sha256='old', not 'new': building it again"]


READER = """
import hashlib, sys, time
from pathlib import Path
from rloo.utils import cache

root = Path(sys.argv[1])
def build(staging):
    for i in range(3):
        (staging / f"part{i}").write_text("old " * 1000)
    return {"source": "old"}

cache.entry(root, build, "test entry", expect={"source": "old"})
print("using", flush=True)
time.sleep(1.5)  # a rebuild asked for meanwhile must not take the files from under this reader
print("intact" if all((root / f"part{i}").read_text() == "old " * 1000 for i in range(3)) else "LOST", flush=True)
"""


def test_a_reader_of_a_cache_entry_never_loses_its_files_to_a_rebuild(tmp_path):
    """One process uses an entry; another asks for the entry from another source (a rebuild). The rebuild waits,
    saying so, until the reader is done: every file the reader reads is the one it verified."""
    root = tmp_path / "entry"
    reader = python(READER, str(root))
    assert reader.stdout.readline().strip() == "using"
    said = []
    started = time.monotonic()

    def build(staging):
        for i in range(3):
            (staging / f"part{i}").write_text("new")
        return {"source": "new"}

    record = cache.entry(root, build, "test entry", log=said.append, expect={"source": "new"})
    waited = time.monotonic() - started
    assert reader.wait(timeout=HANG_GUARD_S) == 0 and reader.stdout.read().strip() == "intact"
    assert said[0] == f"test entry: waiting until no other process uses {root} before building it again"
    assert waited > 1.0 and record["source"] == "new" and (root / "part0").read_text() == "new"


# ---- one run dir, one owner --------------------------------------------------------------------------------------
def test_a_run_dir_held_by_a_live_process_is_refused_and_a_killed_holder_is_taken_over(tmp_path):
    with live_holder(tmp_path / "run") as holder:
        with pytest.raises(ConfigError, match=rf"is in use by process {holder.pid} on .*: one process at a time"):
            ownership.take(tmp_path / "run", log=print)
    said = []
    ownership.take(tmp_path / "run", log=said.append)  # the kernel dropped the dead holder's lock
    try:
        assert len(said) == 1 and f"taking it over from process {holder.pid}" in said[0]
        record = json.loads((tmp_path / "run" / ownership.OWNER_FILE).read_text())
        assert record["pid"] == os.getpid()
    finally:
        ownership.release(tmp_path / "run")
    assert (tmp_path / "run" / ownership.OWNER_FILE).read_text() == ""  # released: the next owner says nothing
    said.clear()
    ownership.take(tmp_path / "run", log=said.append)
    ownership.release(tmp_path / "run")
    assert said == []


@pytest.mark.slow
def test_two_processes_on_one_run_dir(embedded_task, tmp_path):
    """A requeue while the old job lives is refused before it writes; once the old job is killed, the next resume
    takes the dir over and finishes the run."""
    run, store = tmp_path / "run", embedded_task / "cache"
    hang = {"RLOO_TEST_FAULT": "hang", "RLOO_TEST_FAULT_FILE": str(tmp_path / "inside"), "RLOO_TEST_FAULT_CALL": "2"}
    settings = ["checkpoint_every=1", "eval.before=false", "reward=model + tests.reward_functions:faulty_rank"]
    first, first_log = start(run, store, *settings, env=hang)
    wait_for((tmp_path / "inside").exists, first, first_log)  # in its second rollout
    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")}
    second, second_log = start(run, store, *settings, "resume=auto")
    code, output, _ = finish(second, second_log)
    assert code == 2 and f"is in use by process {first.pid}" in output, output[-3000:]
    assert [line for line in output.splitlines() if line.startswith("error:")] == [output.strip().splitlines()[-1]]
    assert {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written
    first.kill()
    first.wait()
    third, third_log = start(run, store, *settings, "resume=auto")
    code, output, _ = finish(third, third_log)
    assert code == 0, output[-3000:]
    assert f"taking it over from process {first.pid}" in output
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_evaluate_into_a_live_runs_dir_is_refused_and_the_run_resumes(embedded_task, tmp_path):
    """rloo.evaluate, sft and reward own their run dirs as rloo.train does: pointed at a training run's dir while it
    lives (before its first checkpoint, logger=none: no output that marks the dir yet), rloo.evaluate exits 2 in one
    line and changes no byte of it; once the trainer is killed, resume=auto finishes the run."""
    run, store = tmp_path / "run", embedded_task / "cache"
    hang = {"RLOO_TEST_FAULT": "hang", "RLOO_TEST_FAULT_FILE": str(tmp_path / "inside"), "RLOO_TEST_FAULT_CALL": "1"}
    settings = ["checkpoint_every=1", "eval.before=false", "reward=model + tests.reward_functions:faulty_rank"]
    trainer, trainer_log = start(run, store, *settings, "logger=none", env=hang)
    wait_for((tmp_path / "inside").exists, trainer, trainer_log)  # in its first rollout, no checkpoint yet
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    evaluate = run_module("rloo.evaluate", f"hydra.run.dir='{run}'", "bootstrap=fast", "response_length=8", cache=store)
    assert evaluate.returncode == 2, evaluate.stderr[-3000:]
    assert evaluate.stderr.strip().splitlines()[-1].startswith(f"error: {run} is in use by process {trainer.pid}")
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    trainer.kill()
    trainer.wait()
    resumed, resumed_log = start(run, store, *settings, "logger=none", "resume=auto")
    code, output, _ = finish(resumed, resumed_log)
    assert code == 0, output[-3000:]
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"


# ---- a rank that dies, hangs or is stopped -------------------------------------------------------------------------
def test_the_start_up_and_collective_bounds_are_checked_and_each_reaches_its_process_groups(tmp_path):
    """trainer.startup_timeout_s is the strategy's timeout (the ranks join while each loads its models);
    CollectiveTimeout puts trainer.collective_timeout_s on the process groups once the fit starts. The groups: a real
    one-process gloo group, whose timeout torch reports back."""
    from datetime import timedelta
    from types import SimpleNamespace

    import torch.distributed as dist

    from rloo.config.checks import check_collective_timeout
    from rloo.run.assemble import lightning_strategy
    from rloo.run.callbacks import CollectiveTimeout
    from rloo.run.cli import compose_train_config

    for key in ("collective_timeout_s", "startup_timeout_s"):
        with pytest.raises(ConfigError, match=rf"^trainer.{key}=0 is not allowed: seconds, a number above 0"):
            check_collective_timeout(compose_train_config([f"trainer.{key}=0"]), 2)
        with pytest.raises(ConfigError, match=r"does nothing with one process .*; remove it$"):
            check_collective_timeout(compose_train_config([f"trainer.{key}=30"]), 1)
    cfg = compose_train_config(["trainer.collective_timeout_s=30", "trainer.startup_timeout_s=900"])
    check_collective_timeout(cfg, 2)
    check_collective_timeout(compose_train_config([]), 1)  # the defaults, with one process: nothing to refuse
    for strategy, built_as in (("ddp", "DDPStrategy"), ("auto", "DDPStrategy"), ("fsdp2", "ModelParallelStrategy")):
        built = lightning_strategy(cfg, {"strategy": strategy}, 2)
        assert type(built).__name__ == built_as and built._timeout == timedelta(seconds=900)
    assert lightning_strategy(cfg, {"strategy": "auto"}, 1) == "auto"

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1, timeout=timedelta(seconds=900)
    )
    try:
        group = dist.distributed_c10d._get_default_group()
        assert group._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=900)
        trainer = SimpleNamespace(world_size=2)  # as a 2-process run's trainer says
        CollectiveTimeout(30).on_fit_start(trainer, SimpleNamespace(device_mesh=None))
        assert group._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=30)
    finally:
        dist.destroy_process_group()


def test_a_failed_collective_is_told_from_any_other_error():
    from rloo.utils.errors import collective_failure

    closed = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:39317. "
        "This is typically caused by a remote worker crashing."
    )
    assert collective_failure(closed) == "Connection closed by peer [127.0.0.1]:39317"
    timed_out = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv")
    assert collective_failure(timed_out) == "Timed out waiting 10000ms for recv"
    assert collective_failure(RuntimeError("CUDA out of memory")) is None
    assert collective_failure(ValueError("gloo")) is None and collective_failure(KeyboardInterrupt()) is None


# a rank killed, SIGTERM to the launcher, a node lost and SLURM's pre-kill signal: tests/test_scale_out.py
RANKS = ["trainer.devices=2", "trainer.num_threads=1", "total_episodes=64", "checkpoint_every=1", "eval.before=false"]
SCORED = "reward=model + tests.reward_functions:faulty_rank"  # a 0 reward term that can kill or hang one rank


@pytest.mark.slow
def test_a_rank_that_hangs_ends_the_run_within_the_collective_timeout(embedded_task, tmp_path):
    run, store = tmp_path / "run", embedded_task / "cache"
    hang_rank_1 = {
        "RLOO_TEST_FAULT": "hang",
        "RLOO_TEST_FAULT_RANK": "1",
        "RLOO_TEST_FAULT_FILE": str(tmp_path / "hung"),
    }
    settings = ["trainer.strategy=ddp", *RANKS, SCORED, "reward_timeout_s=0", "trainer.collective_timeout_s=10"]
    process, log = start(run, store, *settings, env=hang_rank_1)
    wait_for((tmp_path / "hung").exists, process, log)
    code, output, seconds = finish(process, log)
    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Timed out" in errors[0] and "died or hung" in errors[0], output[-3000:]
    assert "stopped the other ranks" in output and seconds >= 10  # it waited for the timeout, then ended the rest
    deadline = time.monotonic() + 300  # a bound on a rank left behind, not on speed
    while group_alive(process) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(process)


# ---- SIGTERM while a packaged model is converted ------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_during_the_conversion_leaves_a_line_a_summary_and_a_clean_cache(embedded_task, tmp_path):
    spec = fake_package(tmp_path / "site")
    driver = (
        SLOW_CONVERT.replace("time.sleep(0.4)", "time.sleep(30)")
        + "import runpy, sys\nsys.argv[0] = 'rloo.train'\nrunpy.run_module('rloo.train', run_name='__main__')\n"
    )
    run, store = tmp_path / "run", embedded_task / "cache"
    env = {
        "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}",
        "RLOO_CACHE_DIR": str(store),
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
    }
    process = python(driver, f"hydra.run.dir={run}", *FAST, "logger=csv", f"model.policy={spec}", env=env)
    staging = lambda: list(store.glob("packaged-m-*.tmp-*/config.json"))  # noqa: E731
    deadline = time.monotonic() + HANG_GUARD_S
    while not staging():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == SIGTERM_EXIT, output[-3000:]
    assert "stopped by SIGTERM while setting up the run" in output and "Traceback" not in output, output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stopped_during"].startswith("setting up")
    assert [p.name for p in store.glob("packaged-*") if not p.name.endswith(".lock")] == []  # no entry, no staging
