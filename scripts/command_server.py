"""Run ``lmcalc`` commands as forks of one process that has imported lmcalc already: a fork server.

A new ``lmcalc`` process spends about 0.2 s of CPU importing lmcalc, typer, pydantic and rich before it does
anything; the docs replay (scripts/verify_docs.py) starts about 400 of them. Here one server process imports
lmcalc's modules once and listens on a Unix socket in a private temporary folder (mode 0700). A shim named
``lmcalc``, placed first on the commands' ``PATH``, is a Python started with ``-I -S`` (no site, no imports but
``_socket`` and ``marshal``: about 10 ms) that sends its argv, working folder, environment and its stdin, stdout
and stderr (``SCM_RIGHTS``) to the server, and exits with the status the command had. Shell pipes, inline
variables (``COLUMNS=60 lmcalc ...``) and redirections work as with the real program: the command writes to the
shim's own file descriptors.

For each command the server forks a waiter, which forks the command: a fresh child of a parent that ran no
command, so nothing one command does is seen by the next. The child, as ``lmcalc`` would start:

- chdirs to the shim's folder, replaces the environment (``os.environ``, and the C library's for what it runs),
  re-reads ``TZ``, reseeds ``random``, puts the shim's descriptors on 0, 1 and 2 and opens ``sys.stdin``,
  ``sys.stdout`` and ``sys.stderr`` on them as the interpreter does at start (line-buffered on a terminal,
  written through under ``PYTHONUNBUFFERED``), sets ``sys.argv`` to the installed ``lmcalc`` script's;
- runs ``lmcalc.cli.main`` and exits as the interpreter would: the ``SystemExit`` code (a message code is
  printed, status 1), a traceback and status 1 for an uncaught exception, death by ``SIGINT`` for an uncaught
  ``KeyboardInterrupt``, the ``atexit`` functions, then standard output flushed (a failure is reported on
  stderr, status 120).

What the preloaded modules read from the environment when they are imported cannot follow a command's own
environment: typer reads ``TYPER_*``, ``TERMINAL_WIDTH``, ``FORCE_COLOR``, ``PY_COLORS`` and ``GITHUB_ACTIONS``;
the interpreter ``PYTHON*``, ``LANG``, ``LC_*`` and ``LD_*``; torch, numpy and OpenBLAS their own (lmcalc reads
its variables, ``LMCALC_PRESET_PATH``, ``COLUMNS`` and the rest, when a command runs, and rich when a console is
made). A command whose environment differs from the server's in one of those (``STARTUP_ENV``) is not run in the
fork: the child ``exec``s the real ``lmcalc`` instead, with the same folder, environment and descriptors. Two
servers run: one preloads every lmcalc module that imports neither torch nor numpy, the other torch first, then
every lmcalc module; the shim sends ``lmcalc validate`` and ``bench`` (``TORCH_COMMANDS``) to the second. A fork
of the second is slower (its 230 MB of pages), and torch's import costs 1 s: it pays only where a command imports
torch anyway. matplotlib, transformers, PEFT and huggingface_hub (``NEVER_PRELOADED``; matplotlib reads the working
folder's ``matplotlibrc``) are imported by the commands that use them. The child also keeps the server's resource
limits, umask and hash seed (not the shim's).

The waiter reports the command's exit status, or the signal that killed it (the shim then kills itself with the
same signal, so the shell sees what it would have seen). If the shim goes away first (killed by a timeout), the
waiter kills the command. ``CommandServer`` starts the servers and always stops them, and removes their folder.

    with CommandServer(env) as shim_dir:  # env: the commands' environment, which the server starts with
        subprocess.run(["bash", "-c", "lmcalc params -m llama-3.1-8b | head -3"], env={**env, "PATH": ...})
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.abc
import io
import marshal
import os
import pkgutil
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent

NAME = "lmcalc"
ENTRY = "lmcalc.cli:main"
TORCH_COMMANDS = ("validate", "bench")
"""The subcommands that import torch (``lmcalc.cli.app.TORCH_COMMANDS``): the shim sends them to the torch server."""
NEVER_PRELOADED = ("matplotlib", "transformers", "huggingface_hub", "peft")
"""Libraries that read their environment (or the working folder: matplotlib's ``matplotlibrc``) when imported and
that few commands use: the commands import them."""
TORCH = ("torch", "numpy")
"""Preloaded by the torch server only; the plain one forks faster without their 170 MB."""
STARTUP_ENV = ("PYTHON", "LANG", "LC_", "LD_", "TYPER_", "_TYPER_", "TERMINAL_WIDTH", "FORCE_COLOR", "PY_COLORS")
STARTUP_ENV += ("TORCH", "PYTORCH", "CUDA", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "NUMPY_", "NPY_")
STARTUP_ENV_NAMES = ("GITHUB_ACTIONS",)
"""The variables (by prefix, and by name) read once when the interpreter starts, or when typer, torch, numpy and
OpenBLAS are imported: a command whose values differ from the server's runs as its own process."""

SHIM = """import _socket, marshal, os, sys
s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
try:
    s.connect({torch_socket!r} if sys.argv[1:2] and sys.argv[1] in {torch_commands!r} else {socket!r})
    request = marshal.dumps(([os.fsencode(a) for a in sys.argv[1:]], os.getcwdb(), dict(os.environb)))
    request = len(request).to_bytes(8, "little") + request
    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
    sent = s.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    s.sendall(request[sent:])
    reply = b""
    while chunk := s.recv(64):
        reply += chunk
except OSError as exc:
    os.write(2, ("{name}: the command server is not answering (%s)\\n" % exc).encode())
    os._exit(1)
how, _, number = reply.partition(b" ")
if how == b"signal":
    import _signal
    _signal.signal(int(number), _signal.SIG_DFL)
    os.kill(os.getpid(), int(number))
    os._exit(128 + int(number))
if how != b"exit":
    os.write(2, b"{name}: the command server gave no exit status\\n")
    os._exit(1)
os._exit(int(number))
"""
"""The shim's source: the ``lmcalc`` the commands find first on their PATH (written into the server's folder)."""
STOP_TIMEOUT = 10.0
"""Seconds a server is given to end once stopped (its commands have ended by then, or are abandoned)."""
SHEBANG_MAX = 127
"""The longest ``#!`` line every Linux reads whole; past it (or with a space in Python's path) the shim is a
``/bin/sh`` line running ``shim.py``."""


class _Refuse(importlib.abc.MetaPathFinder):
    """While preloading: ``libraries`` cannot be imported (a module that imports one at its top is left for the
    command to import)."""

    def __init__(self, libraries: tuple[str, ...]) -> None:
        self.libraries = libraries

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.libraries:
            raise ImportError(f"{name} is not preloaded")


def preload(torch: bool) -> list[str]:
    """Import lmcalc's modules but ``__main__`` (which runs the command line) and those that import a library of
    ``NEVER_PRELOADED``, or of ``TORCH`` unless ``torch`` (then torch first): the names imported."""
    import lmcalc
    import lmcalc.cli

    if torch:
        importlib.import_module("torch")
    names, packages, refuse = [], [lmcalc], _Refuse(NEVER_PRELOADED + ((), TORCH)[not torch])
    sys.meta_path.insert(0, refuse)
    try:
        while packages:  # pkgutil.walk_packages would import the packages it cannot import to look inside them
            package = packages.pop()
            for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
                if module.name == "lmcalc.__main__":
                    continue
                try:
                    imported = importlib.import_module(module.name)
                except ImportError:
                    continue
                names.append(module.name)
                if module.ispkg:
                    packages.append(imported)
    finally:
        sys.meta_path.remove(refuse)
    return names


def startup_env(env: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """The variables of ``env`` read once at start-up (``STARTUP_ENV``)."""
    prefixes = tuple(p.encode() for p in STARTUP_ENV)
    names = {n.encode() for n in STARTUP_ENV_NAMES}
    return {k: v for k, v in env.items() if k.startswith(prefixes) or k in names}


def serve(socket_path: str, program: str, entry: str = ENTRY, torch: str = "") -> None:
    """Listen on ``socket_path`` and run each request in a fork; ``program`` is the real ``lmcalc`` (run instead
    where a command's start-up environment differs), ``torch`` non-empty to preload torch. Prints ``ready`` once
    listening; runs until sent SIGTERM, then waits for the commands it started."""
    module, _, function = entry.partition(":")
    main = getattr(importlib.import_module(module), function)
    if entry == ENTRY:
        preload(torch=bool(torch))
    server_env = startup_env(dict(os.environb))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the commands and verify_docs, which stops this
    signal.signal(signal.SIGTERM, _stop)
    gc.freeze()  # the modules' objects stay in the parent's pages: a child's collections do not copy them
    print("ready", flush=True)
    try:
        while True:
            conn, _ = listener.accept()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                listener.close()
                try:
                    wait_for_command(conn, program, main, server_env)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(0)
            conn.close()
            _reap(os.WNOHANG)
    finally:
        _reap(0)  # the waiters still running: their time is counted in the server's


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _reap(options: int) -> None:
    """Collect the waiters that have ended (``os.WNOHANG``), or all of them (0)."""
    while True:
        try:
            if os.waitpid(-1, options)[0] == 0:
                return
        except ChildProcessError:
            return


def receive(conn: socket.socket) -> tuple[tuple[list[bytes], bytes, dict[bytes, bytes]], list[int]]:
    """The shim's request (argv, working folder, environment) and its three descriptors."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "little"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise EOFError("the shim closed the connection mid-request")
        data += chunk
    return marshal.loads(data[8:]), fds


def wait_for_command(conn: socket.socket, program: str, main, server_env: dict[bytes, bytes]) -> None:
    """The waiter: fork the command, wait for it (or for the shim to go away: then kill it), send its status."""
    (argv, cwd, env), fds = receive(conn)
    done_r, done_w = os.pipe()  # closed (end of file) when the command's process ends
    pid = os.fork()
    if pid == 0:
        try:
            os.close(done_r)
            conn.close()
            run_command(argv, cwd, env, fds, (program, main, done_w), startup_env(env) == server_env)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)  # run_command ends the process itself: here it could not run the command
    os.close(done_w)
    for fd in fds:
        os.close(fd)
    ready, _, _ = select.select([done_r, conn], [], [])
    if done_r not in ready:  # the shim is gone (a timeout killed it): so is the command
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        conn.sendall(b"signal %d" % os.WTERMSIG(status))
    else:
        conn.sendall(b"exit %d" % os.waitstatus_to_exitcode(status))
    conn.close()


def run_command(argv, cwd, env, fds, run: tuple, in_fork: bool) -> None:
    """The command's process: set up as ``lmcalc`` would start, run ``main``, exit as the interpreter does; or, not
    ``in_fork``, ``exec`` the real ``program`` (which keeps ``done``, the end of the waiter's pipe, open)."""
    program, main, done = run
    os.chdir(cwd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environb.clear()
    os.environb.update(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the server ignores it (CommandServer stops it)
    if not in_fork:
        os.set_inheritable(done, True)
        os.execv(program, [NAME, *(os.fsdecode(a) for a in argv)])
    time.tzset()
    if "random" in sys.modules:
        sys.modules["random"].seed()
    _open_std_streams()
    sys.argv = [program, *(os.fsdecode(a) for a in argv)]
    sys.path[0] = os.path.dirname(program)
    os._exit(_exit_as_the_interpreter(main))


_SERVER_STREAMS: list[io.TextIOWrapper] = []
"""The server's own standard streams, kept from collection in the child (closing them would close 0, 1, 2)."""


def _open_std_streams() -> None:
    """``sys.stdin``, ``sys.stdout``, ``sys.stderr`` on descriptors 0, 1, 2, opened as the interpreter opens them
    at start for this environment (``create_stdio`` in CPython's pylifecycle.c): line-buffered on a terminal
    (stderr always), unbuffered under ``PYTHONUNBUFFERED``; their encoding and errors are the server's (the same
    interpreter and locale: ``STARTUP_ENV`` holds the variables that would change them)."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    _SERVER_STREAMS.extend([sys.stdin, sys.stdout, sys.stderr])
    streams = []
    for fd, (name, old) in enumerate(zip(("<stdin>", "<stdout>", "<stderr>"), _SERVER_STREAMS[-3:], strict=True)):
        mode = "w" if fd else "r"
        raw = io.FileIO(fd, mode + "b", closefd=False)
        raw.name = name
        buffer = raw if unbuffered and fd else io.BufferedWriter(raw) if fd else io.BufferedReader(raw)
        line_buffering = not unbuffered and (fd == 2 or raw.isatty())
        stream = io.TextIOWrapper(
            buffer, encoding=old.encoding, errors=old.errors, line_buffering=line_buffering, write_through=unbuffered
        )
        stream.mode = mode
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _exit_as_the_interpreter(main) -> int:
    """Run ``main`` and end as ``python`` ends a script: the exit status, after the atexit functions and a flush
    of the standard streams."""
    status = 0
    try:
        main()
    except SystemExit as exc:
        status = _system_exit_status(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    atexit._run_exitfuncs()
    return _flush() or status


def _system_exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _flush() -> int:
    """Flush stdout then stderr as the interpreter does at exit: 120 if stdout could not be written."""
    status = 0
    try:
        sys.stdout.flush()
    except Exception:
        print(f"Exception ignored in: {sys.stdout!r}", file=sys.stderr)
        traceback.print_exception(*sys.exc_info(), limit=0, file=sys.stderr)
        status = 120
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    return status


class CommandServer:
    """Fork servers for ``lmcalc`` commands, started with ``env``: one with lmcalc preloaded, one with torch too
    (for ``TORCH_COMMANDS``). Entering gives the folder to put first on the commands' PATH (it holds the shim
    ``lmcalc``); leaving stops the servers and removes the folder, whatever happened (an exception, an interrupt).
    Without ``torch``, one server takes every command (torch is imported by the commands that use it). ``entry``
    (``module:function``) replaces lmcalc's command line, for tests: one server, nothing preloaded."""

    def __init__(self, env: dict[str, str], torch: bool = True, entry: str = ENTRY, start_timeout: float = 120.0):
        self.env, self.torch, self.entry, self.start_timeout = env, torch, entry, start_timeout
        self.processes: list[subprocess.Popen] = []
        self.folder: str | None = None

    def __enter__(self) -> str:
        self.folder = tempfile.mkdtemp(prefix="lmcalc-server-")  # mode 0700: this user's alone
        try:
            return self._start(self.folder)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _start(self, folder: str) -> str:
        program = shutil.which(NAME, path=self.env.get("PATH"))
        if program is None:
            raise FileNotFoundError(f"no {NAME} on the PATH the commands are given")
        plain, torch = os.path.join(folder, "plain"), os.path.join(folder, "torch")
        if not self.torch or self.entry != ENTRY:
            torch = plain
        for socket_path in dict.fromkeys((plain, torch)):
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, __file__, socket_path, program, self.entry, "torch" * (socket_path != plain)],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                )
            )
        for process in self.processes:  # started side by side, waited for in turn
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], self.start_timeout)
            if not ready or process.stdout.readline() != b"ready\n":
                raise RuntimeError(f"a command server did not start (exit status {process.poll()})")
        source = SHIM.format(socket=plain, torch_socket=torch, torch_commands=TORCH_COMMANDS, name=NAME)
        shebang = f"#!{sys.executable} -IS"
        if len(shebang) > SHEBANG_MAX or " " in sys.executable:
            Path(folder, "shim.py").write_text(source)
            source, shebang = f'exec "{sys.executable}" -IS "{folder}/shim.py" "$@"\n', "#!/bin/sh"
        shim = Path(folder, NAME)
        shim.write_text(f"{shebang}\n{source}")
        shim.chmod(0o700)
        return folder

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for process in self.processes:
            process.terminate()  # a server waits for the commands it started, then ends
        for process in self.processes:
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    serve(*sys.argv[1:])
