"""A real chat-completions server on loopback for the judge tests: scripted per test, recording what it saw."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

SECTIONS = re.compile(r"Post:\n(?P<post>.*?)\n\nSummary A:\n(?P<a>.*?)\n\nSummary B:\n(?P<b>.*?)\n\nAnswer in", re.S)


def answer(text: str, delay: float = 0.0):
    body = {
        "id": "cmpl-test",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }
    return 200, {}, json.dumps(body), delay


def sections(body: dict) -> tuple[str, str, str]:
    """(post, summary A, summary B) out of the rendered comparison prompt the judge sent."""
    match = SECTIONS.search(body["messages"][0]["content"])
    assert match, body
    return match["post"], match["a"], match["b"]


class ServerState:
    """What the server saw, and `respond(index, body, headers) -> (status, headers, text, delay)` to script it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.respond = lambda index, body, headers: answer("Comparison: fine.\nPreferred: A")

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        state: ServerState = self.server.state
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with state.lock:
            index = len(state.requests)
            state.requests.append(
                {
                    "path": self.path,
                    "body": body,
                    "authorization": self.headers.get("Authorization"),
                    "content_type": self.headers.get("Content-Type"),
                }
            )
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            if self.path != "/v1/chat/completions":
                status, headers, text, delay = 404, {}, "no such route", 0.0
            else:
                status, headers, text, delay = state.respond(index, body, self.headers)
            if delay:
                time.sleep(delay)
        finally:
            with state.lock:  # before the answer goes out, so a request that follows it never overlaps it
                state.in_flight -= 1
        data = text.encode("utf-8")
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (the timeout test)
            pass


@pytest.fixture
def server():
    state = ServerState()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.state = state
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
