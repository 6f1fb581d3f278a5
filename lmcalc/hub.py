"""Models by Hugging Face Hub id: ``--model meta-llama/Llama-3.1-8B`` reads the repository's ``config.json``.

The local cache is read first (``HF_HUB_CACHE``, else huggingface_hub's default), so a model once downloaded, or
a cache filled by ``hf download``, needs no network; with ``HF_HUB_OFFLINE`` set nothing else is tried. Otherwise
the file is fetched through huggingface_hub, an optional dependency (``pip install 'lmcalc[hub]'``), imported
only when an id is given. Before it downloads, lmcalc opens one connection to the Hub (``HF_ENDPOINT``, or the
proxy that reaches it) and gives up after ``CONNECT_TIMEOUT_S``: without a network huggingface_hub retries for
20-30 s before it fails. A gated, private, missing or unreachable repository gets one line that says how to log in
or to pass a ``config.json`` file instead, and names the built-in preset of the same name where there is one
(``Qwen/Qwen3-8B``: ``qwen3-8b``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from lmcalc.errors import LmcalcError, setting
from lmcalc.preset_names import builtin_model_exactly, builtin_model_named

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
"""``org/name``: a Hub repository id (letters, digits, ``-``, ``_``, ``.``; one slash)."""

TRUE = ("1", "true", "yes", "on")
DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub's, unless HF_ENDPOINT names another
CONNECT_TIMEOUT_S = 3.0
"""Seconds lmcalc waits for a connection to the Hub (its name resolved and a TCP connection open) before it says
the Hub cannot be reached: a working network opens one in well under a second, and huggingface_hub alone would
retry for 20-30 s."""
INSTEAD = "or pass the model's config.json file instead (--model path/to/config.json)"


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a Hub repository id and names no local file."""
    return bool(HUB_ID.match(name)) and not name.endswith((".yaml", ".yml", ".json")) and not Path(name).exists()


def offline() -> bool:
    """Whether huggingface_hub is told not to use the network (``HF_HUB_OFFLINE``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def config_path(repo_id: str) -> Path:
    """The local path of ``repo_id``'s ``config.json``: from the cache, else downloaded (unless offline)."""
    try:
        import huggingface_hub
    except ImportError:
        raise LmcalcError(
            f"{repo_id!r} reads as a Hugging Face Hub id, which needs huggingface_hub: pip install 'lmcalc[hub]', "
            + _instead(repo_id)
        ) from None
    cache = os.environ.get("HF_HUB_CACHE") or None  # read now: huggingface_hub reads it once, at import
    try:
        return Path(huggingface_hub.hf_hub_download(repo_id, "config.json", cache_dir=cache, local_files_only=True))
    except Exception as error:  # noqa: BLE001 -- huggingface_hub's errors are told apart by name below
        if type(error).__name__ not in ("LocalEntryNotFoundError", "FileNotFoundError", "OfflineModeIsEnabled"):
            raise LmcalcError(_message(repo_id, error)) from None
    if offline():
        where = cache or "the default cache of huggingface_hub"
        raise LmcalcError(
            f"{repo_id}: config.json is not in the local Hugging Face cache ({where}) and HF_HUB_OFFLINE is set: "
            f"unset it to download the file, {_instead(repo_id)}"
        )
    why = unreachable(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    if why:
        raise LmcalcError(
            f"{repo_id}: cannot reach the Hugging Face Hub ({why}), and the local cache "
            f"({cache or 'huggingface_hub default'}) has no config.json: {_instead(repo_id).removeprefix('or ')}"
        )
    try:
        with _quiet():
            return Path(huggingface_hub.hf_hub_download(repo_id, "config.json", cache_dir=cache))
    except Exception as error:  # noqa: BLE001
        if type(error).__name__ == "LocalEntryNotFoundError":  # the download failed and the cache has none
            raise LmcalcError(
                f"{repo_id}: cannot reach the Hugging Face Hub to download config.json (no network?), and the local "
                f"cache ({cache or 'huggingface_hub default'}) has none: log in if it is gated, {_instead(repo_id)}"
            ) from None
        raise LmcalcError(_message(repo_id, error)) from None


def unreachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """Why the Hub at ``endpoint`` cannot be reached, or "" when a connection to it opens within ``timeout``
    seconds: to the proxy the environment names for it, if any (``HTTPS_PROXY``, ``NO_PROXY``), else to its host.
    The name is resolved in the same thread, so a resolver that hangs is cut short too."""
    url = urlsplit(endpoint)
    host = url.hostname or ""
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    failed: list[str] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as error:
            failed.append(error.strerror or str(error) or type(error).__name__)

    attempt = threading.Thread(target=connect, daemon=True)
    attempt.start()
    attempt.join(timeout)
    if attempt.is_alive():
        return f"no connection to {host}:{port} within {timeout:g} s"
    return f"{host}:{port}: {failed[0]}" if failed else ""


def _instead(repo_id: str) -> str:
    """What to do instead of the download: the built-in preset of the repository's name, where there is one, or its
    config.json file."""
    name = repo_id.rpartition("/")[2]
    preset = builtin_model_named(name)
    same = builtin_model_exactly(name) is not None  # its name or an alias, not a longer name that begins with one
    which = "of this name" if same else "whose name this one begins with"
    named = f"use the built-in preset {which} ({setting('model')} {preset}), " if preset else ""
    return named + INSTEAD


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """huggingface_hub's own warnings off while it downloads: the one line lmcalc prints says what went wrong."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _message(repo_id: str, error: Exception) -> str:
    """One line for huggingface_hub's error: what happened, and what to do."""
    kind = type(error).__name__
    if kind == "GatedRepoError":
        return (
            f"{repo_id} is a gated repository: accept its licence on huggingface.co, then log in (hf auth login, "
            f"or set HF_TOKEN), {INSTEAD}"
        )
    if kind == "RepositoryNotFoundError":
        return (
            f"{repo_id}: no such model repository on the Hugging Face Hub, or a private one (log in with hf auth "
            f"login, or set HF_TOKEN), {INSTEAD}"
        )
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return f"{repo_id} has no config.json on the Hugging Face Hub: {INSTEAD}"
    first = str(error).strip().splitlines()[0] if str(error).strip() else kind
    return f"{repo_id}: cannot read config.json from the Hugging Face Hub ({first}): {INSTEAD}"
