"""``lmcalc serve``: the page and its answers over HTTP, from the standard library's threading server.

The standard library's server is enough here: one user on the loopback address, answers that take milliseconds (a
memory estimate) to seconds (a large plan), and no dependency to install or keep up. Each request runs on its own
thread; a plan search reports its progress as lines of JSON (``engine.search.progress``) and stops when the page
drops the request (it asked again), so a long search never holds up the next question.

What a request can do is narrow: read the page's three files, the presets' names, and an answer. It names no path
(the files are a fixed table; a setting that reads as a path is refused), it writes nothing, and the only place it
can make the server fetch from is the Hugging Face Hub (a Hub id, with ``lmcalc[hub]``). Requests whose ``Host`` is
not this server's name are refused, so that a page elsewhere cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from lmcalc import __version__
from lmcalc.engine.search import progress
from lmcalc.errors import LmcalcError, flag
from lmcalc.serve.questions import MAX_CONFIG_BYTES, Config, FieldError, Question, config_name, question_of

LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""The names a request's ``Host`` may give when the server listens on the loopback address."""
PAGE_FILES = {"/": ("index.html", "text/html"), "/page.js": ("page.js", "text/javascript"),
              "/page.css": ("page.css", "text/css")}  # fmt: skip
"""Everything the server reads from disk, by the path a request asks for: the page's files, in the package."""
MAX_BODY = MAX_CONFIG_BYTES + 64 * 1024
"""The largest request body: a config.json at its limit and the page's settings."""
CACHED_ANSWERS = 512
"""Answers kept for repeated questions (moving a slider back and forth): a memory answer is about 20 KB of JSON, a
plan's about 100 KB, so at most some tens of MB."""
PLAN_SEARCHES = 2
"""Plan searches run at once; a third waits (saying so) for one to end. Each holds one core: on a 2-core machine two
leave the memory answers' requests the time the interpreter shares between threads."""
EMIT_SUFFIX = {"megatron": ".sh", "deepspeed": ".json", "torchtitan": ".toml", "trainer": ".yaml"}
"""The file name an emitted config is offered under, by kind."""
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class AnswerCache:
    """The last ``size`` answers, by question, each as the JSON bytes sent."""

    def __init__(self, size: int = CACHED_ANSWERS) -> None:
        self.size = size
        self._answers: collections.OrderedDict[Question, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, question: Question) -> bytes | None:
        with self._lock:
            found = self._answers.get(question)
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
            self._answers.move_to_end(question)
            return found

    def put(self, question: Question, body: bytes) -> None:
        with self._lock:
            self._answers[question] = body
            self._answers.move_to_end(question)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)


class PageServer(ThreadingHTTPServer):
    """The server and what its requests share: the cache, the plan searches' slots, the names it answers to."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = 128  # the standard library's 5 reset connections when many clients connect at once

    def __init__(self, host: str, port: int, host_names: tuple[str, ...] | None = LOOPBACK, workers: int = 0) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.pool: ProcessPoolExecutor | None = None  # server_close, called when the bind fails, reads it
        super().__init__((host, port), PageHandler)
        self.host_names = host_names
        self.cache = AnswerCache()
        self.plan_slots = threading.BoundedSemaphore(PLAN_SEARCHES)
        if workers > 0:
            self.pool = _pool(workers)

    def answered(self, question: Question) -> dict[str, Any]:
        """``answers.answer(question)``: in a worker process where the server has them, else on this thread."""
        from lmcalc.serve.answers import answer

        if self.pool is None:
            return answer(question)
        return self.pool.submit(answer, question).result()

    def server_close(self) -> None:
        super().server_close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


class PageHandler(BaseHTTPRequestHandler):
    server: PageServer
    _sent: dict[str, Any]  # the request's JSON body (``_question``)
    server_version = f"lmcalc/{__version__}"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a keep-alive answer's body sent at once, not after the client's delayed ACK

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Quiet: the terminal shows the URL and errors, not a line per request."""

    # ------------------------------------------------------------------------------------------- requests

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._host_allowed():
            return
        path = urlsplit(self.path).path
        if path in PAGE_FILES:
            name, kind = PAGE_FILES[path]
            body = resources.files("lmcalc.serve").joinpath("page", name).read_bytes()
            self._send(HTTPStatus.OK, body, f"{kind}; charset=utf-8", cache="no-cache")
        elif path == "/api/choices":
            from lmcalc.serve.answers import choices

            self._json(HTTPStatus.OK, choices())
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"nothing at {path[:80]!r}: the page is at /"})

    def do_POST(self) -> None:  # noqa: N802
        if not self._host_allowed():
            return
        path = urlsplit(self.path).path
        if path not in ("/api/answer", "/api/emit"):
            self._json(HTTPStatus.NOT_FOUND, {"error": "the page asks at /api/answer and /api/emit"})
            return
        try:
            question = self._question()
        except LmcalcError as exc:
            self._error(exc)
            return
        if path == "/api/emit":
            self._emit(question)
            return
        cached = self.server.cache.get(question)
        if cached is not None:
            self._send(HTTPStatus.OK, cached, "application/json")
        elif question.command == "plan":
            self._plan(question)
        else:
            self._answer(question)

    def do_PUT(self) -> None:  # noqa: N802
        self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "the page only reads (GET) and asks (POST)"})

    do_DELETE = do_PATCH = do_PUT  # noqa: N815

    # -------------------------------------------------------------------------------------------- answers

    def _emit(self, question: Question) -> None:
        """The plan's layout of the rank asked as a framework's config (``plan --emit``), as a file to save."""
        from lmcalc.launch.config import EMIT_KINDS
        from lmcalc.serve.answers import emitted

        kind, rank = self._sent.get("emit", ""), self._sent.get("rank", 1)
        if question.command != "plan" or kind not in EMIT_KINDS or not isinstance(rank, int) or rank < 1:
            self._json(HTTPStatus.BAD_REQUEST, {"error": f"emit takes a plan, a kind ({', '.join(EMIT_KINDS)}) and a "
                                                "rank from 1", "field": "emit"})  # fmt: skip
            return
        try:
            with self._plan_slot():
                text, line = emitted(question, kind, rank)
        except LmcalcError as exc:
            self._error(exc, question)
            return
        except progress.Cancelled:
            return
        body = json.dumps({"text": text, "command": line, "name": f"lmcalc-{kind}{EMIT_SUFFIX[kind]}"}).encode()
        self._send(HTTPStatus.OK, body, "application/json")

    def _question(self) -> Question:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise LmcalcError("a question needs its length (Content-Length)")
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise FieldError("config", f"the request is {int(length):,} bytes; the page sends at most {MAX_BODY:,}")
        try:
            sent = json.loads(self.rfile.read(int(length)))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise LmcalcError("the question is not JSON") from None
        if not isinstance(sent, dict) or not isinstance(sent.get("fields", {}), dict):
            raise LmcalcError('a question is {"command": ..., "fields": {...}}')
        self._sent = sent
        fields = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in sent.get("fields", {}).items()}
        config = sent.get("config")
        if config is not None and not (isinstance(config, dict) and isinstance(config.get("text"), str)):
            raise FieldError("config", 'a config is {"text": "...", "name": "config.json"}')
        given = Config(config["text"], config_name(config.get("name"))) if config else None
        return question_of(str(sent.get("command", "")), fields, given)

    def _answer(self, question: Question) -> None:
        try:
            started = time.perf_counter()
            found = self.server.answered(question)
        except LmcalcError as exc:
            self._error(exc, question)
            return
        found["took_ms"] = round(1000 * (time.perf_counter() - started), 1)
        body = json.dumps(found).encode()
        self.server.cache.put(question, body)
        self._send(HTTPStatus.OK, body, "application/json")

    def _plan(self, question: Question) -> None:
        """A plan search, streamed: lines of JSON saying how far it has gone, then the answer (or the error). The
        search stops at its next report once the page has dropped the request."""
        from lmcalc.serve.answers import answer

        self.send_response(HTTPStatus.OK)
        self._headers("application/x-ndjson", cache="no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            with self._plan_slot():
                started = time.perf_counter()
                with progress.reporting(self._reporter):
                    found = answer(question)
            found["took_ms"] = round(1000 * (time.perf_counter() - started), 1)
            body = json.dumps(found).encode()
            self.server.cache.put(question, body)
            self._line(body)
        except progress.Cancelled:
            return
        except LmcalcError as exc:
            self._line(json.dumps(_error_of(exc, question)).encode())
        except (BrokenPipeError, ConnectionResetError):
            return

    @contextmanager
    def _plan_slot(self) -> Iterator[None]:
        while not self.server.plan_slots.acquire(timeout=0.2):
            self._line(b'{"progress": 0, "waiting": true}')
            if self._dropped():
                raise progress.Cancelled
        try:
            yield
        finally:
            self.server.plan_slots.release()

    def _reporter(self, done: int, total: int) -> None:
        if self._dropped():
            raise progress.Cancelled
        self._line(json.dumps({"progress": min(1.0, done / total) if total else 0, "layouts": done}).encode())

    def _dropped(self) -> bool:
        """Whether the page has closed the connection (it asked something else)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _line(self, body: bytes) -> None:
        try:
            self.wfile.write(body + b"\n")
            self.wfile.flush()
        except OSError:
            raise progress.Cancelled from None

    # --------------------------------------------------------------------------------------------- replies

    def _host_allowed(self) -> bool:
        """Whether the request names this server in its ``Host``, and comes from its own page where it says
        (``Origin``): a page elsewhere, or one reaching here through DNS rebinding, is refused."""
        host = self.headers.get("Host", "")
        origin = self.headers.get("Origin")
        name = urlsplit(f"//{host}").hostname or ""
        if self.server.host_names is not None and name not in self.server.host_names:
            self._json(HTTPStatus.FORBIDDEN, {"error": f"Host {host[:80]!r} is not this server's name"})
            return False
        if origin is not None and urlsplit(origin).netloc != host:
            self._json(HTTPStatus.FORBIDDEN, {"error": f"Origin {origin[:80]!r} is not this server's page"})
            return False
        return True

    def _error(self, exc: LmcalcError, question: Question | None = None) -> None:
        self._json(HTTPStatus.BAD_REQUEST, _error_of(exc, question))

    def _json(self, status: HTTPStatus, data: Any) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, kind: str, cache: str = "no-store") -> None:
        self.send_response(status)
        self._headers(kind, cache)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _headers(self, kind: str, cache: str) -> None:
        self.send_header("Content-Type", kind)
        self.send_header("Cache-Control", cache)
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)


def _error_of(exc: LmcalcError, question: Question | None = None) -> dict[str, Any]:
    """An error as the page shows it: the message with each setting named by its flag, and the field at fault: the
    one it names, else the one whose value it quotes (``unknown model 'lama-3'``), else none (the page shows it on
    the answer's card)."""
    message = exc.message(flag)
    named = exc.field if isinstance(exc, FieldError) else next(iter(exc.settings), None)
    if named is None and question is not None:
        quoted = [name for name, value in question.settings if isinstance(value, str) and f"'{value}'" in message]
        named = quoted[0] if quoted else None
    return {"error": message, "field": named}


def _pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` processes that compute answers, each started and warmed (lmcalc imported, the presets' names read)
    before the server answers. Started by a fork server: the server's threads are never forked."""
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver"))
    for warming in [pool.submit(_warm) for _ in range(workers)]:
        warming.result()
    return pool


def _warm() -> None:
    from lmcalc import presets
    from lmcalc.serve import answers

    presets.registry("models")
    del answers


def serving_workers() -> int:
    """The processes that compute answers under ``lmcalc serve``: one per core, up to four. The interpreter's lock
    holds a server's threads to one core: computed answers (a memory estimate, about 2 ms) then queue behind each
    other at about 320 a second on any machine."""
    from lmcalc.engine.search.workers import cores

    return max(1, min(cores(), 4))


def start(
    host: str = "127.0.0.1", port: int = 0, host_names: tuple[str, ...] | None = LOOPBACK, workers: int = 0
) -> PageServer:
    """A server listening on ``host``:``port`` (0: any free port), answering on a thread of its own, to requests
    whose ``Host`` is one of ``host_names`` (None: any, for a server listening on every address); computed answers
    in ``workers`` processes (0: on the request's thread)."""
    server = PageServer(host, port, host_names, workers)
    threading.Thread(target=server.serve_forever, name="lmcalc-serve", daemon=True).start()
    return server
