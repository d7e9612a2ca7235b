"""The verifiable task (rloo/toy/arithmetic.py), the correctness reward, and packaged pretrained weights
(rloo/models/packaged.py): converted once, hash-checked on every use, refused in one line when not installed."""

import json
import sys
import types

import pytest

from rloo.toy import arithmetic
from rloo.utils.errors import ConfigError


def test_every_problem_states_its_answer_and_the_splits_are_reproducible(tmp_path):
    rows = arithmetic.rows(500, seed=7)
    assert rows == arithmetic.rows(500, seed=7) and rows != arithmetic.rows(500, seed=8)
    for row in rows:
        system, user = row["prompt"]
        assert system == {"role": "system", "content": arithmetic.SYSTEM}
        question = user["content"]
        assert user["role"] == "user" and question.endswith(arithmetic.INSTRUCTION)
        if question.startswith("What is"):  # the expression itself, evaluated independently
            expression = question[len("What is ") : question.index("?")]
            assert str(eval(expression)) == row["answer"]  # noqa: S307 (digits and + - * only)
        else:
            start, more, given = (int(n) for n in arithmetic.NUMBER.findall(question))
            assert str(start + more - given) == row["answer"] and int(row["answer"]) >= 1
    path = arithmetic.split_path(str(tmp_path), "validation")
    assert path == arithmetic.split_path(str(tmp_path), "validation")  # written once
    lines = open(path).read().splitlines()
    assert len(lines) == 256 and json.loads(lines[0]) == arithmetic.rows(256, 1)[0]


@pytest.mark.parametrize(
    "completion, answer, reward",
    [
        ("57", "57", 1.0),
        ("The answer is 57.", "57", 1.0),
        ("12 + 45 = 57", "57", 1.0),  # the last number counts
        ("57, or maybe 58", "57", 0.0),
        ("-3", "-3", 1.0),
        ("1,024", "1024", 1.0),
        ("fifty-seven", "57", 0.0),
        ("", "57", 0.0),
    ],
)
def test_the_correctness_reward_reads_the_last_number(completion, answer, reward):
    assert arithmetic.correct(["q"], [completion], [answer]) == [reward]


# ---- packaged weights ------------------------------------------------------------------------------------------
def test_a_package_that_is_not_installed_is_one_line():
    from rloo.models.packaged import packaged_file

    with pytest.raises(ConfigError, match=r"package:no_such_pkg/m.gguf: the package 'no_such_pkg' is not installed"):
        packaged_file("package:no_such_pkg/m.gguf")


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """An installed package holding a model file, and a converter that records its calls (no real weights)."""
    from rloo.models import packaged

    root = tmp_path / "site" / "fake_weights"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "m.gguf").write_bytes(b"weights v1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sys.modules.pop("fake_weights", None)
    monkeypatch.setitem(sys.modules, "gguf", types.ModuleType("gguf"))
    monkeypatch.setattr("importlib.util.find_spec", _find_spec_with_fake_gguf(monkeypatch))
    calls = []

    def convert(source, out):
        calls.append(source)
        (out / "model.safetensors").write_bytes(source.read_bytes() + b" converted")

    monkeypatch.setattr(packaged, "_convert", convert)
    return root, calls


def _find_spec_with_fake_gguf(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *args):
        return types.SimpleNamespace() if name == "gguf" else real(name, *args)

    return find_spec


def test_packaged_weights_convert_once_and_a_tampered_copy_is_converted_again(fake_package, tmp_path):
    from rloo.models.packaged import MANIFEST, converted_dir

    root, calls = fake_package
    spec, cache = "package:fake_weights/m.gguf", tmp_path / "cache"
    first = converted_dir(spec, cache, log=lambda *_: None)
    assert converted_dir(spec, cache, log=lambda *_: None) == first and len(calls) == 1  # checked, not redone
    manifest = json.loads((tmp_path / "cache" / first.rsplit("/", 1)[1] / MANIFEST).read_text())
    assert manifest["source"] == "m.gguf" and set(manifest["files"]) == {"model.safetensors"}
    (cache / first.rsplit("/", 1)[1] / "model.safetensors").write_bytes(b"torn")
    said = []
    assert converted_dir(spec, cache, log=said.append) == first and len(calls) == 2
    assert any("model.safetensors is corrupt (its sha256 changed): building it again" in line for line in said)
    (root / "m.gguf").write_bytes(b"weights v2")  # another release of the package: another directory
    assert converted_dir(spec, cache, log=lambda *_: None) != first and len(calls) == 3
