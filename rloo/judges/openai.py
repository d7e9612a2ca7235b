"""A judge backed by an OpenAI-compatible chat-completions endpoint (OpenAI itself, or a vLLM / TGI server).

Standard library only: one POST per pair to `{base_url}/chat/completions`, a few at a time from a thread pool,
retried with exponential backoff on 429, 5xx, timeouts and connection errors. Answers are parsed strictly
(`parse_preference`); anything else is an invalid verdict, never a win. With `cache_dir` set, every answer the
server gave is kept in a JSONL file keyed by the exact request, so a re-run of the same pairs costs no call.

The API key is read from the environment when requests are made and is kept nowhere: not on the object, not in
its repr, the cache, log records, error messages or verdicts.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import json
import logging
import os
import random
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rloo.judges.base import Judge, Verdict, swap_orders
from rloo.judges.prompts import TLDR_COMPARISON, parse_preference, render_comparison
from rloo.utils.errors import ConfigError

logger = logging.getLogger("rloo.judges")

CACHE_FILE = "openai-verdicts.jsonl"
CONFIG_STATUSES = (401, 403, 404)  # wrong key, no access, wrong URL or model: no point going on
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class JudgeError(RuntimeError):
    """The endpoint refused the judge's configuration (bad key, no access, unknown URL or model)."""


# what one request came to: (answer, raw, error): the answer text when the server gave one, else what to show
# (raw) and why it is invalid (error)
Reply = tuple[str | None, str | None, str | None]


class OpenAIJudge(Judge):
    name = "openai"

    def __init__(
        self,
        *,
        model: str,
        base_url: str,
        api_key_env: str,
        temperature: float,
        max_tokens: int,
        seed: int,
        max_concurrency: int,
        max_retries: int,
        timeout: float,
        backoff: float,
        max_backoff: float,
        cache_dir: str | None,
        prompt_template: str = TLDR_COMPARISON,
    ):
        # the settings are conf/judge/openai.yaml's (documented and defaulted there)
        self.model, self.base_url, self.api_key_env = model, str(base_url).rstrip("/"), api_key_env
        self.prompt_template, self.temperature, self.max_tokens = prompt_template, temperature, max_tokens
        self.seed, self.max_concurrency, self.max_retries = seed, max_concurrency, max_retries
        self.timeout, self.backoff, self.max_backoff = timeout, backoff, max_backoff
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.requests_sent = 0  # HTTP requests made, retries included
        self.cache_hits = 0  # pairs answered from the disk cache
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, str] | None = None  # loaded on first use
        self._opener = None
        self._rng = random.Random()  # backoff jitter, apart from the global generator that training seeds

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_lock", "_cache", "_opener", "_rng"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    # ---- configuration -------------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return (urllib.parse.urlsplit(self.base_url).hostname or "").lower()

    def check(self) -> None:
        """Raise ConfigError (one line) for settings that cannot work; reads the environment, sends nothing."""
        scheme = urllib.parse.urlsplit(self.base_url).scheme
        if scheme not in ("http", "https") or not self.host:
            raise ConfigError(
                f"judge.base_url={self.base_url!r} is not an http(s) URL: "
                "e.g. https://api.openai.com/v1, or http://localhost:8000/v1 for a vLLM server"
            )
        if self.host == "api.openai.com" and not os.environ.get(self.api_key_env):
            raise ConfigError(
                f"judge.api_key_env: the environment variable {self.api_key_env} is unset or empty, "
                f"and {self.base_url} needs a key: export {self.api_key_env}=... "
                "or point judge.base_url at a server that needs none"
            )
        for key, value, least in (
            ("max_concurrency", self.max_concurrency, 1),
            ("max_retries", self.max_retries, 0),
            ("max_tokens", self.max_tokens, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"judge.{key}={value!r} is not allowed: an integer >= {least}")
        for key, value, positive in (
            ("timeout", self.timeout, True),
            ("backoff", self.backoff, False),
            ("max_backoff", self.max_backoff, False),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or (positive and value == 0):
                raise ConfigError(
                    f"judge.{key}={value!r} is not allowed: a number of seconds {'> 0' if positive else '>= 0'}"
                )

    def setup(self, device="cpu") -> None:
        self.check()

    # ---- judging -------------------------------------------------------------------------------------------

    def messages_for(self, prompt: str, candidate: str, other: str, swapped: bool) -> list[dict]:
        summary_a, summary_b = (other, candidate) if swapped else (candidate, other)
        text = render_comparison(self.prompt_template, post=prompt, summary_a=summary_a, summary_b=summary_b)
        return [{"role": "user", "content": text}]

    def request_body(self, messages: list[dict]) -> dict:
        return {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def cache_key(self, messages: list[dict]) -> str:
        identity = {
            "base_url": self.base_url,
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()

    def judge(self, prompts: list[str], candidates: list[str], others: list[str]) -> list[Verdict]:
        if not len(prompts) == len(candidates) == len(others):
            raise ValueError(f"judge: {len(prompts)} prompts, {len(candidates)} candidates and {len(others)} others")
        swapped = swap_orders(self.seed, prompts, candidates, others)
        messages = [self.messages_for(p, c, o, s) for p, c, o, s in zip(prompts, candidates, others, swapped)]
        keys = [self.cache_key(m) for m in messages]

        cache = self._load_cache()
        replies: dict[str, Reply] = {}
        pending: dict[str, list[dict]] = {}  # one request per distinct prompt, even if a batch repeats a pair
        for key, m in zip(keys, messages):
            if key in cache:
                replies[key] = (cache[key], None, None)
                self.cache_hits += 1
            elif key not in pending:
                pending[key] = m
        logger.debug(
            "openai judge: %d pairs, %d from the cache, %d to ask %s",
            len(keys),
            len(keys) - len(pending),
            len(pending),
            self.model,
        )
        if pending:
            replies.update(self._ask_all(pending))

        verdicts = []
        for key, s in zip(keys, swapped):
            answer, raw, error = replies[key]
            if answer is None:
                verdicts.append(Verdict(None, s, raw=raw, error=error))
                continue
            letter = parse_preference(answer)
            outcome = None if letter is None else float(letter == ("B" if s else "A"))
            verdicts.append(Verdict(outcome, s, raw=answer))
        return verdicts

    def _ask_all(self, pending: dict[str, list[dict]]) -> dict[str, Reply]:
        api_key = os.environ.get(self.api_key_env) or None  # a local, handed to the workers; never kept
        stop = threading.Event()  # set when one request proves the configuration wrong: the others stop retrying
        pool = ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(pending)), thread_name_prefix="rloo-judge")
        try:
            futures = {key: pool.submit(self._ask, key, m, api_key, stop) for key, m in pending.items()}
            return {key: future.result() for key, future in futures.items()}
        except BaseException:
            stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _ask(self, cache_key: str, messages: list[dict], api_key: str | None, stop: threading.Event) -> Reply:
        """One pair's request with its retries; caches an answer; raises JudgeError on 401/403/404."""
        body = json.dumps(self.request_body(messages)).encode("utf-8")
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            if stop.is_set():
                return None, None, "cancelled"
            status, retry_after, text, failure = self._post(body, api_key)
            text = _scrub(text, api_key)
            if status is not None and 200 <= status < 300:
                reply = self._read_answer(text)
                if reply[0] is not None:
                    self._store(cache_key, reply[0])
                return reply
            if status in CONFIG_STATUSES:
                raise JudgeError(
                    f"HTTP {status} from {self.base_url}/chat/completions for model {self.model!r}: "
                    f"check judge.base_url, judge.model and the key in ${self.api_key_env}"
                )
            if status is not None and status != 429 and status < 500:
                return None, None, f"HTTP {status}: {_excerpt(text)}" if text else f"HTTP {status}"
            what = failure or f"HTTP {status}"
            if attempt == self.max_retries:
                return None, None, f"{what} after {attempts} attempts"
            wait = min(self.max_backoff, self.backoff * 2**attempt) * self._rng.uniform(0.5, 1.0)
            if retry_after is not None:
                wait = min(self.max_backoff, max(retry_after, wait))
            logger.warning(
                "openai judge: %s from %s, retry %d of %d in %.2f s",
                what,
                self.base_url,
                attempt + 1,
                self.max_retries,
                wait,
            )
            if stop.wait(wait):
                return None, None, "cancelled"
        raise AssertionError("unreachable")

    def _post(self, body: bytes, api_key: str | None) -> tuple[int | None, float | None, str, str | None]:
        """(status, Retry-After seconds, body text, transport failure); status None when no response came."""
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "rloo-judge"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, headers=headers, method="POST")
        with self._lock:
            self.requests_sent += 1
        try:
            with self._get_opener().open(request, timeout=self.timeout) as response:
                return response.status, None, response.read().decode("utf-8", "replace"), None
        except urllib.error.HTTPError as error:
            try:
                text = error.read().decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):
                text = ""
            finally:
                error.close()
            return error.code, _retry_after(error.headers), text, None
        except TimeoutError:
            return None, None, "", "timeout"
        except urllib.error.URLError as error:
            reason = error.reason
            if isinstance(reason, TimeoutError):
                return None, None, "", "timeout"
            return None, None, "", f"connection error ({type(reason).__name__})"
        except (OSError, http.client.HTTPException) as error:
            return None, None, "", f"connection error ({type(error).__name__})"

    def _get_opener(self):
        with self._lock:
            if self._opener is None:
                # a server on this machine is never reached through an HTTP proxy from the environment
                handlers = [urllib.request.ProxyHandler({})] if self.host in LOOPBACK_HOSTS else []
                self._opener = urllib.request.build_opener(*handlers)
            return self._opener

    @staticmethod
    def _read_answer(text: str) -> Reply:
        try:
            content = json.loads(text)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            return None, text[:200], "malformed response"
        return content, None, None

    # ---- the disk cache ------------------------------------------------------------------------------------

    @property
    def cache_path(self) -> Path | None:
        return None if self.cache_dir is None else Path(self.cache_dir) / CACHE_FILE

    def _load_cache(self) -> dict[str, str]:
        with self._lock:
            if self._cache is None:
                self._cache = {}
                path = self.cache_path
                if path is not None and path.is_file():
                    text = path.read_text(encoding="utf-8", errors="replace")
                    for line in text.splitlines():
                        try:
                            row = json.loads(line)
                        except ValueError:
                            continue  # a corrupt or truncated line
                        if (
                            isinstance(row, dict)
                            and isinstance(row.get("key"), str)
                            and isinstance(row.get("answer"), str)
                        ):
                            self._cache[row["key"]] = row["answer"]
            return self._cache

    def _store(self, key: str, answer: str) -> None:
        path = self.cache_path
        if path is None:
            return
        record = (json.dumps({"key": key, "answer": answer}) + "\n").encode("utf-8")
        with self._lock:
            self._cache[key] = answer
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a+b") as f:
                fcntl.flock(f, fcntl.LOCK_EX)  # one writer at a time among the jobs that share the cache file
                torn = f.seek(0, os.SEEK_END) > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
                f.write((b"\n" if torn else b"") + record)  # after a killed writer's truncated line, a new line
                f.flush()


def _retry_after(headers) -> float | None:
    """The Retry-After header in seconds when it is a number (an HTTP date is ignored)."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None


def _excerpt(text: str, limit: int = 200) -> str:
    """The server's error message on one line: `error.message` of a JSON error body, else the body's start."""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = None
    return " ".join(str(message if isinstance(message, str) else text).split())[:limit]


def _scrub(text: str, api_key: str | None) -> str:
    """The text with the key blanked out, in case a server echoes the request's headers back."""
    return text.replace(api_key, "[redacted]") if api_key and text else text
