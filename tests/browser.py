"""A small driver for headless Chromium over the Chrome DevTools Protocol, for tests of web pages (standard library
only).

Chromium is started with ``--remote-debugging-pipe``: it reads the protocol's JSON messages, each ended by a NUL
byte, from its file descriptor 3 and writes its own to its file descriptor 4. The driver spawns it with
``os.posix_spawn``, whose file actions put the two pipes' ends on 3 and 4 in the child, in a session of its own so
that leaving the ``with`` block kills its whole process group (the renderers and helpers it forked included).

A thread reads Chromium's messages; every wait for one has a deadline, so a hung browser fails a test with
``BrowserError`` instead of hanging it::

    with Browser(find_chromium(), tmp_path / "profile") as browser:
        browser.open("http://127.0.0.1:8000/")
        browser.type_into("#model", "llama-3.1-8b")
        browser.click("button#go")
        assert browser.wait_for("document.querySelector('#answer')?.textContent") == "fits"
        assert browser.errors == []
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

Message = dict[str, Any]

_POLL_S = 0.05  # how often wait_for asks again
_CLOSE_S = 3.0  # how long leaving the block waits for Chromium to close, then to die when killed
_STDERR_TAIL = 2000  # characters of Chromium's own output quoted when it dies


class BrowserError(Exception):
    """Chromium failed, timed out, or the page threw."""


def find_chromium() -> str | None:
    """The path of an installed Chromium or Chrome, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _js(value: object) -> str:
    """``value`` as a JavaScript literal (JSON is one), to put a Python string into an expression safely."""
    return json.dumps(value)


def _python_value(remote: Message) -> Any:
    """A ``Runtime.RemoteObject`` returned by value, as Python: JSON values as json reads them, undefined as
    None, NaN and the infinities as floats, a BigInt as an int."""
    if "value" in remote:
        return remote["value"]
    special = remote.get("unserializableValue")
    if special is None:
        return None  # undefined, or a value with no JSON form (a function, a symbol)
    if special.endswith("n"):
        return int(special[:-1])
    return float(special.replace("Infinity", "inf"))  # NaN, Infinity, -Infinity, -0


def _exception_text(details: Message) -> str:
    """The text of a thrown exception, as the console prints it (its message and stack where there is one)."""
    exception = details.get("exception") or {}
    return str(exception.get("description") or _python_value(exception) or details.get("text", "exception"))


class Browser:
    """One headless Chromium with one page, driven over the DevTools pipe. Use it as a context manager: leaving
    the block kills Chromium and waits for it, whatever happened inside.

    ``errors`` collects what the page reported as going wrong: each ``console.error`` call and each uncaught
    exception or unhandled promise rejection, as text, in the order they happened.
    """

    def __init__(
        self, executable: str, user_data_dir: Path, width: int = 1280, height: int = 900, timeout_s: float = 30.0
    ) -> None:
        self.executable = executable
        self.user_data_dir = Path(user_data_dir)
        self.width, self.height = width, height
        self.timeout_s = timeout_s
        self.errors: list[str] = []
        self._pid: int | None = None
        self._to_chromium: int | None = None  # our end of the pipe Chromium reads as fd 3
        self._from_chromium: int | None = None  # our end of the pipe Chromium writes as fd 4
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._changed = threading.Condition()  # guards everything below; notified on each message and at EOF
        self._next_id = 0
        self._responses: dict[int, Message] = {}
        self._events: list[Message] = []
        self._closed_reason: str | None = None
        self._session_id: str | None = None

    # -- life cycle --------------------------------------------------------------------------------------------

    def __enter__(self) -> Browser:
        try:
            self._launch()
            target = self._send("Target.createTarget", {"url": "about:blank"}, session=False)
            attached = self._send(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, session=False
            )
            self._session_id = attached["sessionId"]
            self._send("Page.enable")
            self._send("Page.setLifecycleEventsEnabled", {"enabled": True})
            self._send("Runtime.enable")
            self.set_width(self.width, self.height)
        except BaseException:
            self._shut_down()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._shut_down()

    def _launch(self) -> None:
        self.user_data_dir.mkdir(parents=True, exist_ok=True)
        flags = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={self.user_data_dir}",
            "--remote-debugging-pipe",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        # copies numbered 10 and up, so that putting them on 3 and 4 in the child never overwrites one of them
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (child_reads, child_writes)]
        try:
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(self._log_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, high[0], 3),
                (os.POSIX_SPAWN_DUP2, high[1], 4),
            ]
            self._pid = os.posix_spawn(
                self.executable, [self.executable, *flags], os.environ, file_actions=actions, setsid=True
            )
        except BaseException:
            os.close(parent_writes)
            os.close(parent_reads)
            raise
        finally:
            for fd in (child_reads, child_writes, *high):
                os.close(fd)  # the child has its own copies: ours would keep the pipes open after it dies
        self._to_chromium, self._from_chromium = parent_writes, parent_reads
        os.set_blocking(parent_writes, False)
        self._reader = threading.Thread(target=self._read_messages, name="chromium-pipe-reader", daemon=True)
        self._reader.start()

    @property
    def _log_path(self) -> Path:
        """Where Chromium's stdout and stderr go (quoted in the error when it dies)."""
        return self.user_data_dir / "chromium-output.log"

    def _shut_down(self) -> None:
        """Close Chromium (politely, then by killing its process group), reap it, stop the reader and close the
        pipes. Safe to call twice."""
        if self._pid is not None:
            if self._closed_reason is None and self._to_chromium is not None:
                with contextlib.suppress(BrowserError):  # it exits on its own, and reaps its helpers
                    self._send("Browser.close", session=False, timeout_s=_CLOSE_S)
                self._exited(_CLOSE_S)
            # whatever is left of its session: the browser if it hung, a renderer or helper it left behind; the
            # browser is not reaped yet, so its process group's id can belong to no one else
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._pid, signal.SIGKILL)
            if self._exited(_CLOSE_S):
                os.waitpid(self._pid, 0)
            self._pid = None
        self._stopping.set()
        if self._reader is not None:
            self._reader.join(timeout=_CLOSE_S)
            self._reader = None
        for fd in (self._to_chromium, self._from_chromium):
            if fd is not None:
                os.close(fd)
        self._to_chromium = self._from_chromium = None
        with self._changed:
            self._closed_reason = self._closed_reason or "the browser was closed"
            self._changed.notify_all()

    def _exited(self, timeout_s: float) -> bool:
        """Whether Chromium's browser process has exited, waiting up to ``timeout_s`` for it (without reaping it)."""
        assert self._pid is not None
        deadline = time.monotonic() + timeout_s
        while os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # -- the pipe ----------------------------------------------------------------------------------------------

    def _read_messages(self) -> None:
        """The reader thread: split Chromium's output at NUL bytes, file responses by id and keep events."""
        assert self._from_chromium is not None
        fd, pending = self._from_chromium, b""
        reason = "Chromium closed the pipe (it exited or crashed)"
        try:
            while not self._stopping.is_set():
                readable, _, _ = select.select([fd], [], [], 0.2)
                if not readable:
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                *messages, pending = (pending + chunk).split(b"\0")
                for raw in messages:
                    self._file(json.loads(raw))
            else:
                reason = "the browser was closed"
        except (OSError, ValueError) as error:
            reason = f"reading Chromium's messages failed: {error}"
        with self._changed:
            self._closed_reason = reason
            self._changed.notify_all()

    def _file(self, message: Message) -> None:
        with self._changed:
            if "id" in message:
                self._responses[message["id"]] = message
            else:
                self._events.append(message)
                self._note_error(message)
            self._changed.notify_all()

    def _note_error(self, event: Message) -> None:
        if event.get("sessionId") != self._session_id:
            return
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            self.errors.append(_exception_text(params["exceptionDetails"]))
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = params.get("args", [])
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))

    def _write(self, data: bytes, deadline: float) -> None:
        """Write all of ``data`` to Chromium's fd 3 by the deadline (the pipe is non-blocking)."""
        fd = self._to_chromium
        if fd is None:
            raise BrowserError("the browser is not running (use Browser as a context manager)")
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            _, writable, _ = select.select([], [fd], [], max(left, 0))
            if not writable:
                raise BrowserError("timed out writing to Chromium (it reads no more)")
            try:
                view = view[os.write(fd, view) :]
            except BrokenPipeError as error:
                raise BrowserError(self._death_notice("Chromium closed its end of the pipe")) from error

    def _send(
        self, method: str, params: Message | None = None, *, session: bool = True, timeout_s: float | None = None
    ) -> Message:
        """Send one command (to the page's session unless ``session`` is false) and return its result."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._next_id += 1
            command_id = self._next_id
        message: Message = {"id": command_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session_id
        self._write(json.dumps(message).encode() + b"\0", deadline)
        with self._changed:
            ok = self._changed.wait_for(
                lambda: command_id in self._responses or self._closed_reason is not None,
                timeout=max(deadline - time.monotonic(), 0),
            )
            response = self._responses.pop(command_id, None)
        if response is None:
            if ok:
                raise BrowserError(self._death_notice(f"{method}: {self._closed_reason}"))
            raise BrowserError(f"{method}: no answer from Chromium in {timeout_s:g} s")
        if "error" in response:
            error = response["error"]
            raise BrowserError(f"{method}: {error.get('message')} {error.get('data', '')}".strip())
        result: Message = response.get("result", {})
        return result

    def _wait_event(self, accept: Callable[[Message], bool], since: int, deadline: float, what: str) -> Message:
        """The first event from index ``since`` on that ``accept`` takes, waiting for it until the deadline."""
        with self._changed:
            while True:
                for event in self._events[since:]:
                    if event.get("sessionId") == self._session_id and accept(event):
                        return event
                since = len(self._events)
                if self._closed_reason is not None:
                    raise BrowserError(self._death_notice(f"waiting for {what}: {self._closed_reason}"))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(f"timed out waiting for {what}")
                self._changed.wait(left)

    def _death_notice(self, message: str) -> str:
        """``message``, with the end of Chromium's own output when there is some."""
        try:
            output = self._log_path.read_text(errors="replace")[-_STDERR_TAIL:].strip()
        except OSError:
            output = ""
        return f"{message}\nChromium's output ends:\n{output}" if output else message

    # -- the page ----------------------------------------------------------------------------------------------

    def open(self, url: str) -> None:
        """Navigate the page to ``url`` and wait for its load event (the page, its scripts, styles and images)."""
        deadline = time.monotonic() + self.timeout_s
        with self._changed:
            since = len(self._events)
        result = self._send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"opening {url}: {result['errorText']}")
        loader = result.get("loaderId")
        if loader is None:
            return  # the same document (only the #fragment changed): no new load
        self._wait_event(
            lambda event: (
                event.get("method") == "Page.lifecycleEvent"
                and event["params"].get("name") == "load"
                and event["params"].get("loaderId") == loader
            ),
            since,
            deadline,
            f"{url} to load",
        )

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page, as JSON-like Python (a promise is awaited; undefined
        is None). Raises BrowserError with the exception's text when it throws or its promise rejects."""
        value, exception = self._evaluate(expression)
        if exception is not None:
            raise BrowserError(f"{expression}: {exception}")
        return value

    def _evaluate(self, expression: str, timeout_s: float | None = None) -> tuple[Any, str | None]:
        """The expression's value and None, or None and the text of the exception it threw."""
        result = self._send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True, "userGesture": True},
            timeout_s=timeout_s,
        )
        if "exceptionDetails" in result:
            return None, _exception_text(result["exceptionDetails"])
        return _python_value(result["result"]), None

    def wait_for(self, expression: str, timeout_s: float | None = None) -> Any:
        """Evaluate ``expression`` until its value is truthy and return that value. Truthy as Python sees the
        value returned (so an empty array or object counts as not yet). An expression that throws is asked again
        (the element it reads may not be there yet); the timeout's error quotes the last value or exception."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                value, exception = self._evaluate(expression, max(deadline - time.monotonic(), _POLL_S))
            except BrowserError as error:
                if self._closed_reason is not None:
                    raise
                raise BrowserError(f"timed out waiting for {expression}: {error}") from error  # a promise hung
            if value:
                return value
            if time.monotonic() + _POLL_S > deadline:
                last = f"its last value was {value!r}" if exception is None else f"it last threw {exception}"
                raise BrowserError(f"timed out waiting for {expression}: {last}")
            time.sleep(_POLL_S)

    def set_width(self, width: int, height: int | None = None) -> None:
        """Lay the page out in a viewport ``width`` CSS pixels wide (and ``height`` high, the current height when
        None), at one device pixel per CSS pixel."""
        self.width, self.height = width, self.height if height is None else height
        metrics = {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False}
        self._send("Emulation.setDeviceMetricsOverride", metrics)

    def screenshot(self, path: Path, full_page: bool = True) -> bytes:
        """A PNG of the viewport, or of the whole page's height when ``full_page``; written to ``path`` and
        returned."""
        params: Message = {"format": "png"}
        if full_page:
            size = self._send("Page.getLayoutMetrics")["cssContentSize"]
            width = max(self.width, round(size["width"]))
            params |= {
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": round(size["height"]), "scale": 1},
            }
        png = base64.b64decode(self._send("Page.captureScreenshot", params)["data"])
        Path(path).write_bytes(png)
        return png

    def type_into(self, selector: str, text: str) -> None:
        """Put ``text`` in the <input> or <textarea> that ``selector`` finds, as a user typing it would: focus it,
        set its value through the element's own setter (which frameworks that watch the property see) and
        dispatch bubbling 'input' and 'change' events."""
        self.evaluate(f"""(() => {{
            const element = document.querySelector({_js(selector)});
            if (!element) throw new Error("nothing matches " + {_js(selector)});
            const prototype = element instanceof HTMLTextAreaElement ? HTMLTextAreaElement.prototype
                : element instanceof HTMLInputElement ? HTMLInputElement.prototype : null;
            if (!prototype) throw new Error({_js(selector)} + " is a <" + element.localName + ">, not a text field");
            element.focus();
            Object.getOwnPropertyDescriptor(prototype, "value").set.call(element, {_js(text)});
            element.dispatchEvent(new InputEvent("input", {{bubbles: true, inputType: "insertText",
                                                           data: {_js(text)}}}));
            element.dispatchEvent(new Event("change", {{bubbles: true}}));
        }})()""")

    def select(self, selector: str, value: str) -> None:
        """Choose the option whose value is ``value`` in the <select> that ``selector`` finds and dispatch bubbling
        'input' and 'change' events. Raises BrowserError when it has no such option."""
        self.evaluate(f"""(() => {{
            const element = document.querySelector({_js(selector)});
            if (!(element instanceof HTMLSelectElement)) throw new Error({_js(selector)} + " finds no <select>");
            if (![...element.options].some(option => option.value === {_js(value)}))
                throw new Error({_js(selector)} + " has no option " + {_js(value)});
            element.focus();
            Object.getOwnPropertyDescriptor(HTMLSelectElement.prototype, "value").set.call(element, {_js(value)});
            element.dispatchEvent(new Event("input", {{bubbles: true}}));
            element.dispatchEvent(new Event("change", {{bubbles: true}}));
        }})()""")

    def click(self, selector: str) -> None:
        """Click the element that ``selector`` finds (scrolled into view, then its ``click()``: a disabled button
        does nothing, as for a user)."""
        self.evaluate(f"""(() => {{
            const element = document.querySelector({_js(selector)});
            if (!element) throw new Error("nothing matches " + {_js(selector)});
            element.scrollIntoView({{block: "center"}});
            element.click();
        }})()""")
