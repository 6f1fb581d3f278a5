"""``lmcalc serve``: start the local page and say where it is. The server (``lmcalc.serve.server``) answers from the
Python API; this parses the flags and waits."""

from __future__ import annotations

import ipaddress
import threading
from typing import Annotated

import typer

from lmcalc.errors import LmcalcError

PORT = 8765
"""The port asked for unless ``--port`` names one; 0 takes any free port."""


def serve(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on. Default: the loopback address, reachable from this machine only; another "
            "address lets the network in (the page reads no file and writes none, but it answers anyone).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help=f"Port to listen on (0: any free one). Default: {PORT}.")] = PORT,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the page in the default browser.")] = False,
) -> None:
    """The interactive page: memory bars, time, cost and plans that answer as a setting changes."""
    from lmcalc.serve.server import LOOPBACK, serving_workers, start

    if not 0 <= port <= 65535:
        raise LmcalcError(f"--port must be in 0..65535; got {port}")
    # another address: the names a request may give are that address's (any, where it is every address)
    names = LOOPBACK if _is_loopback(host) else None if _is_any(host) else (*LOOPBACK, host.strip("[]"))
    try:
        server = start(host.strip("[]"), port, names, serving_workers())
    except OSError as exc:
        hint = f"; try --port {port + 1} or --port 0" if exc.errno == 98 else ""
        raise LmcalcError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    print(f"lmcalc serve: the page is at {server.url}  (Ctrl-C stops it)", flush=True)
    if not _is_loopback(host):
        print(f"  listening on {host}: anyone who can reach this address can use the page", flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


def _is_any(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _is_loopback(host: str) -> bool:
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
