"""OpenAIJudge against a real chat-completions server on loopback, scripted per test (no network beyond 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import pickle
import re
import socket
import time
import traceback

import pytest

from rloo.config.checks import ConfigError
from rloo.evaluation.intervals import win_rate_summary
from rloo.judges import judge_pairs
from rloo.judges.openai import CACHE_FILE, JudgeError, OpenAIJudge
from rloo.judges.prompts import TLDR_COMPARISON, render_comparison
from rloo.utils.errors import JudgeFailed
from tests.builders import judge_from_conf
from tests.chat_server import answer, sections

ENV = "RLOO_TEST_JUDGE_KEY"
SECRET = "sk-rloo-test-7f3c9e1d2b4a5866"


@pytest.fixture(autouse=True)
def no_key(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def make_judge(url: str, **overrides) -> OpenAIJudge:
    settings = dict(
        model="judge-model", base_url=url, api_key_env=ENV, backoff=0.01, max_backoff=0.05, timeout=2.0, cache_dir=None
    )
    return judge_from_conf("openai", **{**settings, **overrides})


def judge_one(judge: OpenAIJudge, post="a post", candidate="summary one", other="summary two"):
    (verdict,) = judge.judge([post], [candidate], [other])
    return verdict


def judge_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rloo.judges" and r.levelno == logging.WARNING]


def test_429_then_success(server):
    url, state = server
    state.respond = lambda i, body, headers: (
        (429, {"Retry-After": "0"}, '{"error": {"message": "slow down"}}', 0.0)
        if i == 0
        else answer("Comparison: A is tighter.\nPreferred: A")
    )
    verdict = judge_one(make_judge(url))
    assert verdict.outcome == (0.0 if verdict.swapped else 1.0)
    assert verdict.error is None and verdict.raw.endswith("Preferred: A")
    assert state.count == 2


def test_500_until_retries_run_out(server, caplog):
    url, state = server
    state.respond = lambda i, body, headers: (500, {}, "internal error", 0.0)
    caplog.set_level(logging.WARNING, logger="rloo.judges")
    judge = make_judge(url, max_retries=2)
    verdict = judge_one(judge)
    assert state.count == 3 and judge.requests_sent == 3
    assert verdict.outcome is None and verdict.label == "invalid"
    assert "500" in verdict.error and "3 attempts" in verdict.error
    assert len(judge_warnings(caplog)) == 2


def test_timeout_is_retried(server):
    url, state = server
    state.respond = lambda i, body, headers: answer("Comparison: x.\nPreferred: B", delay=10.0 if i == 0 else 0.0)
    started = time.monotonic()
    verdict = judge_one(make_judge(url, timeout=0.25))
    assert verdict.outcome == (1.0 if verdict.swapped else 0.0) and verdict.error is None
    assert state.count == 2
    # it gave up on the slow answer rather than waiting for it: a bound on that wait, not on speed
    assert time.monotonic() - started < 8


def test_retry_after_is_honoured_and_other_4xx_not_retried(server):
    url, state = server
    state.respond = lambda i, body, headers: (
        (429, {"Retry-After": "0.3"}, "", 0.0) if i == 0 else answer("Preferred: A")
    )
    started = time.monotonic()
    assert judge_one(make_judge(url, max_backoff=1.0)).outcome is not None
    assert time.monotonic() - started >= 0.25 and state.count == 2

    state.respond = lambda i, body, headers: (400, {}, json.dumps({"error": {"message": "context too long"}}), 0.0)
    verdict = judge_one(make_judge(url))
    assert state.count == 3  # one more request, no retry
    assert verdict.outcome is None and "400" in verdict.error and "context too long" in verdict.error


def test_connection_refused_is_an_invalid_verdict():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    judge = make_judge(f"http://127.0.0.1:{port}/v1", max_retries=1)
    verdict = judge_one(judge)
    assert verdict.outcome is None and "connection error" in verdict.error and "2 attempts" in verdict.error
    assert judge.requests_sent == 2


def test_malformed_answers_are_invalid_never_wins(server):
    url, state = server
    replies = {
        "free": answer("The first summary is clearly the better one."),
        "two": answer("Comparison: both fine.\nPreferred: A\nPreferred: B"),
        "letter-c": answer("Comparison: neither.\nPreferred: C"),
        "not-json": (200, {}, "<html>" + "x" * 500, 0.0),
        "no-choices": (200, {}, json.dumps({"id": "cmpl", "object": "chat.completion"}), 0.0),
        "empty-choices": (200, {}, json.dumps({"choices": []}), 0.0),
        "null-content": (200, {}, json.dumps({"choices": [{"message": {"role": "assistant", "content": None}}]}), 0.0),
        "valid": answer("Comparison: A keeps the point.\nPreferred: A"),
    }
    state.respond = lambda i, body, headers: replies[sections(body)[0]]
    posts = list(replies)
    verdicts = dict(
        zip(posts, make_judge(url).judge(posts, [f"cand {p}" for p in posts], [f"other {p}" for p in posts]))
    )

    for post in ("free", "two", "letter-c"):
        assert verdicts[post].outcome is None and verdicts[post].error is None
        assert verdicts[post].raw == json.loads(replies[post][2])["choices"][0]["message"]["content"]
    for post in ("not-json", "no-choices", "empty-choices", "null-content"):
        assert verdicts[post].outcome is None and verdicts[post].error == "malformed response"
        assert verdicts[post].raw == replies[post][2][:200]
    assert verdicts["valid"].outcome == (0.0 if verdicts["valid"].swapped else 1.0)

    summary = win_rate_summary([v.outcome for v in verdicts.values()])
    assert summary["invalid"] == 7 and summary["num_judged"] == 1 and summary["wins"] + summary["losses"] == 1


def good_or_bad_pairs(n: int = 16):
    truth = [1.0 if i % 3 != 1 else 0.0 for i in range(n)]
    prompts = [f"post number {i}" for i in range(n)]
    candidates = [f"{'GOOD' if t else 'bad'} candidate summary {i}" for i, t in enumerate(truth)]
    others = [f"{'bad' if t else 'GOOD'} other summary {i}" for i, t in enumerate(truth)]
    return prompts, candidates, others, truth


def prefer_good(index, body, headers):
    _, summary_a, _ = sections(body)
    letter = "A" if "GOOD" in summary_a else "B"
    return answer(f"Comparison: one of them is good.\nPreferred: {letter}", delay=(index * 7 % 5) * 0.004)


def test_swap_is_undone(server):
    url, state = server
    state.respond = prefer_good
    prompts, candidates, others, truth = good_or_bad_pairs()
    verdicts = make_judge(url, seed=0, max_concurrency=4).judge(prompts, candidates, others)
    assert [v.outcome for v in verdicts] == truth
    swapped = [v.swapped for v in verdicts]
    assert set(swapped) == {True, False}

    shown = {sections(r["body"])[0]: sections(r["body"])[1:] for r in state.requests}
    for p, c, o, s in zip(prompts, candidates, others, swapped):
        assert shown[p] == ((o, c) if s else (c, o))

    again = make_judge(url, seed=0, max_concurrency=4).judge(prompts, candidates, others)
    assert [v.swapped for v in again] == swapped and [v.outcome for v in again] == truth
    reseeded = make_judge(url, seed=1, max_concurrency=4).judge(prompts, candidates, others)
    assert [v.swapped for v in reseeded] != swapped and [v.outcome for v in reseeded] == truth


def test_cache_makes_a_rerun_free(server, tmp_path):
    url, state = server
    replies = {"odd": answer("I cannot decide.")}  # unparseable, but answered: cached all the same
    state.respond = lambda i, body, headers: replies.get(sections(body)[0]) or prefer_good(i, body, headers)
    prompts, candidates, others, _ = good_or_bad_pairs(5)
    prompts, candidates, others = prompts + ["odd"], candidates + ["GOOD odd"], others + ["bad odd"]
    cache_dir = tmp_path / "not" / "there" / "yet"

    first_judge = make_judge(url, cache_dir=str(cache_dir))
    first = first_judge.judge(prompts, candidates, others)
    assert first_judge.requests_sent == 6 and first_judge.cache_hits == 0 and state.count == 6
    assert first[-1].outcome is None and first[-1].raw == "I cannot decide."
    path = cache_dir / CACHE_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 6 and all(
        re.fullmatch(r"[0-9a-f]{64}", r["key"]) and isinstance(r["answer"], str) for r in rows
    )

    second_judge = make_judge(url, cache_dir=str(cache_dir))
    assert second_judge.judge(prompts, candidates, others) == first
    assert second_judge.requests_sent == 0 and second_judge.cache_hits == 6 and state.count == 6

    with open(path, "a") as f:
        f.write("this is not json\n")
        f.write('{"key": "0123", "answer": 5}\n')
        f.write('{"key": "abc')  # truncated: no newline
    third_judge = make_judge(url, cache_dir=str(cache_dir))
    third = third_judge.judge(prompts + ["post new"], candidates + ["GOOD new"], others + ["bad new"])
    assert third[:6] == first and third[6].outcome == 1.0
    assert third_judge.requests_sent == 1 and third_judge.cache_hits == 6 and state.count == 7

    fourth_judge = make_judge(url, cache_dir=str(cache_dir))  # the record after the truncated line is readable
    assert fourth_judge.judge(prompts + ["post new"], candidates + ["GOOD new"], others + ["bad new"]) == third
    assert fourth_judge.requests_sent == 0 and fourth_judge.cache_hits == 7

    other_model = make_judge(url, cache_dir=str(cache_dir), model="another-model")
    other_model.judge(prompts[:1], candidates[:1], others[:1])
    assert other_model.requests_sent == 1 and other_model.cache_hits == 0


def test_failures_are_not_cached(server, tmp_path):
    url, state = server
    state.respond = lambda i, body, headers: (
        (400, {}, "too long", 0.0) if sections(body)[0] == "long" else (503, {}, "busy", 0.0)
    )
    for run in (1, 2):
        judge = make_judge(url, cache_dir=str(tmp_path), max_retries=1)
        verdicts = judge.judge(["long", "busy"], ["a", "b"], ["c", "d"])
        assert [v.outcome for v in verdicts] == [None, None] and judge.cache_hits == 0
        assert state.count == 3 * run
    assert not (tmp_path / CACHE_FILE).exists() or (tmp_path / CACHE_FILE).read_text() == ""


def test_the_key_is_sent_and_never_shown(server, tmp_path, monkeypatch, caplog):
    url, state = server
    monkeypatch.setenv(ENV, SECRET)
    caplog.set_level(logging.DEBUG)

    def respond(index, body, headers):
        post = sections(body)[0]
        auth = headers.get("Authorization")
        if index == 0:
            return 429, {"Retry-After": "0"}, json.dumps({"error": {"message": f"rate limited for {auth}"}}), 0.0
        if post == "echo-error":
            return 400, {}, json.dumps({"error": {"message": f"bad request from {auth}"}}), 0.0
        if post == "echo-answer":
            return answer(f"Comparison: you sent {auth}.\nPreferred: A")
        return answer("Comparison: fine.\nPreferred: B")

    state.respond = respond
    judge = make_judge(url, cache_dir=str(tmp_path), max_concurrency=1)
    assert state.count == 0  # building a judge sends nothing
    verdicts = judge.judge(["plain", "echo-error", "echo-answer"], ["a", "b", "c"], ["d", "e", "f"])

    assert state.count == 4 and all(r["authorization"] == f"Bearer {SECRET}" for r in state.requests)
    assert verdicts[0].outcome is not None and verdicts[1].outcome is None and verdicts[2].outcome is not None
    assert judge_warnings(caplog), "the 429 should have been logged as a retry"
    assert SECRET not in repr(judge) and repr(judge) == f"OpenAIJudge(model='judge-model', base_url={url!r})"
    assert SECRET not in repr(vars(judge))
    assert SECRET not in (tmp_path / CACHE_FILE).read_text()
    assert all(SECRET not in repr(v) for v in verdicts)
    assert SECRET not in caplog.text
    assert all(SECRET not in r.getMessage() and SECRET not in repr(r.args) for r in caplog.records)

    state.respond = lambda i, body, headers: (401, {}, json.dumps({"error": {"message": f"bad key {SECRET}"}}), 0.0)
    with pytest.raises(JudgeError) as info:
        make_judge(url).judge(["p1", "p2"], ["a", "b"], ["c", "d"])
    message = str(info.value)
    assert "401" in message and url in message and "judge-model" in message and "\n" not in message
    assert SECRET not in message and SECRET not in "".join(traceback.format_exception(info.value))
    assert SECRET not in caplog.text


def test_check(server, monkeypatch):
    url, state = server
    openai = judge_from_conf("openai", model="gpt-4o-mini", api_key_env=ENV, cache_dir=None)
    with pytest.raises(ConfigError) as info:
        openai.check()
    assert ENV in str(info.value) and "judge.api_key_env" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv(ENV, "")
    with pytest.raises(ConfigError, match=ENV):
        openai.check()
    monkeypatch.setenv(ENV, SECRET)
    openai.check()
    assert SECRET not in repr(openai)
    with pytest.raises(ConfigError, match="judge.base_url"):
        judge_from_conf("openai", model="m", base_url="localhost:8000/v1", cache_dir=None).check()

    monkeypatch.delenv(ENV)
    local = make_judge(url)
    local.check()
    local.setup()
    assert state.count == 0
    assert judge_one(local).outcome is not None
    assert state.count == 1 and state.requests[0]["authorization"] is None


def test_concurrency_is_limited(server):
    url, state = server
    state.respond = lambda i, body, headers: answer("Comparison: x.\nPreferred: A", delay=0.05)
    prompts = [f"post {i}" for i in range(12)]
    verdicts = make_judge(url, max_concurrency=3).judge(
        prompts, [f"c {i}" for i in range(12)], [f"o {i}" for i in range(12)]
    )
    assert len(verdicts) == 12 and all(v.outcome is not None for v in verdicts)
    assert state.count == 12 and 2 <= state.max_in_flight <= 3


def test_request_body(server):
    url, state = server
    judge = make_judge(url, model="my-judge", temperature=0.7, max_tokens=17)
    verdict = judge_one(judge, post="  the post  ", candidate="cand", other="oth")
    (request,) = state.requests
    assert request["path"] == "/v1/chat/completions" and request["content_type"] == "application/json"
    body = request["body"]
    assert set(body) == {"model", "messages", "temperature", "max_tokens"}
    assert body["model"] == "my-judge" and body["temperature"] == 0.7 and body["max_tokens"] == 17
    a, b = ("oth", "cand") if verdict.swapped else ("cand", "oth")
    assert body["messages"] == [{"role": "user", "content": render_comparison(TLDR_COMPARISON, "the post", a, b)}]

    clone = pickle.loads(pickle.dumps(judge))  # settings survive; locks and caches are rebuilt
    assert repr(clone) == repr(judge) and clone.cache_key(body["messages"]) == judge.cache_key(body["messages"])
    assert make_judge(url, temperature=0.0).cache_key(body["messages"]) != judge.cache_key(body["messages"])


def test_a_refused_key_stops_an_evaluation_in_one_line_through_the_guard(server, monkeypatch):
    """A 401 under judge_pairs, as rloo.train and rloo.evaluate call judges: JudgeFailed, whose one line the entry
    points print before exit 1 (a traceback before)."""
    url, state = server
    monkeypatch.setenv(ENV, SECRET)
    state.respond = lambda i, body, headers: (401, {}, json.dumps({"error": {"message": f"bad key {SECRET}"}}), 0.0)
    with pytest.raises(JudgeFailed) as info:
        judge_pairs(make_judge(url), ["p1", "p2"], ["a", "b"], ["c", "d"], timeout_s=30)
    message = str(info.value)
    assert message.startswith("judge OpenAIJudge raised JudgeError: HTTP 401 from ") and "\n" not in message
    assert SECRET not in message
