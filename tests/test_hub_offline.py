"""Issue #32 item 4: a Hub id without a network fails at once, not after huggingface_hub's 20-30 s of retries, and
names the built-in preset of the repository's name (``Qwen/Qwen3-8B``: qwen3-8b). No test here touches the network:
the Hub is a closed local port (``HF_ENDPOINT``), a proxy on one, or a connection that never answers."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from lmcalc import hub
from lmcalc.errors import LmcalcError
from lmcalc.presets import resolve_model

pytest.importorskip("huggingface_hub")


def closed_port() -> int:
    """A local port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """An empty cache, no HF_HUB_OFFLINE, and the Hub at a closed local port; a download is refused loudly."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    real = huggingface_hub.hf_hub_download

    def cache_only(*args, **kwargs):
        assert kwargs.get("local_files_only"), "a download was tried although the Hub cannot be reached"
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cache_only)


def test_an_unreachable_hub_fails_at_once_and_names_the_preset(no_hub):
    start = time.perf_counter()
    with pytest.raises(LmcalcError) as info:
        resolve_model("Qwen/Qwen3-8B")
    assert time.perf_counter() - start < 2  # was 23-31 s of huggingface_hub's retries
    message = str(info.value)
    assert "cannot reach the Hugging Face Hub" in message and "Connection refused" in message
    assert "use the built-in preset of this name (model qwen3-8b)" in message  # the API names the keyword
    assert "\n" not in message


def test_the_command_line_says_it_in_one_line(no_hub, lmcalc_run):
    run = lmcalc_run(["params", "--model", "Qwen/Qwen3-8B"])
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1
    assert "(--model qwen3-8b)" in run.err and "Traceback" not in run.err


def test_a_connection_that_never_answers_is_given_up_on(monkeypatch):
    released = threading.Event()

    def hang(*args, **kwargs):  # a resolver or a firewall that never answers, until the test is done
        released.wait(5)
        raise TimeoutError("released")

    monkeypatch.setattr(socket, "create_connection", hang)
    start = time.perf_counter()
    try:
        found = hub.unreachable("https://huggingface.co", timeout=0.2)
    finally:
        released.set()
    assert found == "no connection to huggingface.co:443 within 0.2 s"
    assert time.perf_counter() - start < 1


def test_the_proxy_is_what_is_reached(monkeypatch):
    port = closed_port()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert hub.unreachable("https://huggingface.co").startswith(f"127.0.0.1:{port}: ")


def test_hf_hub_offline_tries_no_connection_and_names_the_preset(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError("HF_HUB_OFFLINE is set: no connection may be opened")

    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(LmcalcError, match=r"HF_HUB_OFFLINE is set.*built-in preset of this name \(model qwen3-8b\)"):
        resolve_model("Qwen/Qwen3-8B")


@pytest.mark.parametrize(
    ("repository", "preset"),
    [
        ("Qwen3-8B", "qwen3-8b"),  # its name
        ("Llama-3.1-8B", "llama-3.1-8b"),
        ("Meta-Llama-3-70B", "llama-3-70b"),  # an alias
        ("Qwen3-8B-Instruct", "qwen3-8b"),  # a known name with more said after it
        ("Some-Unknown-Model", None),
    ],
)
def test_the_preset_of_a_repositorys_name(repository, preset):
    assert hub.builtin_model_named(repository) == preset


def test_without_a_matching_preset_the_file_is_what_is_offered(no_hub):
    with pytest.raises(LmcalcError, match=r"has no config.json: pass the model's config.json file instead"):
        resolve_model("someone/Some-Unknown-Model")


@pytest.mark.parametrize(
    ("repository", "says"),
    [
        ("Qwen/Qwen3-8B", "use the built-in preset of this name (model qwen3-8b)"),
        ("meta-llama/Meta-Llama-3-8B", "use the built-in preset of this name (model llama-3-8b)"),  # an alias
        ("Qwen/Qwen3-8B-Instruct", "use the built-in preset whose name this one begins with (model qwen3-8b)"),
    ],
)
def test_the_suggestion_says_whether_the_name_is_the_presets(tmp_path, monkeypatch, repository, says):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LmcalcError) as refused:
        resolve_model(repository)
    assert says in str(refused.value)
