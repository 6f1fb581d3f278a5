"""``lmcalc serve`` over HTTP, as the page and a hostile page use it: every answer is the ``--json`` of the command line
it shows (run here through the command line itself), a plan streams its progress and stops when dropped, a repeated
question comes from the cache, and what a request must not do (name a file, come from another site, send a
megabyte) is refused in one line, next to the field at fault."""

from __future__ import annotations

import http.client
import json
import shlex
import socket
import threading
import time
from pathlib import Path

import pytest

from lmcalc.serve import server as page_server
from lmcalc.serve.questions import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH

pytestmark = pytest.mark.cli  # a server on a loopback socket, requests on threads

HF_CONFIG = Path(__file__).parent / "data" / "hf" / "llama-3.1-8b" / "config.json"


def post(server, body: object, headers: dict[str, str] | None = None) -> tuple[int, list[dict]]:
    """Ask; the reply's status and its JSON lines (one, or a plan's progress lines and its answer)."""
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=60)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", "/api/answer", data, {"Content-Type": "application/json", **(headers or {})})
    reply = connection.getresponse()
    lines = [json.loads(line) for line in reply.read().splitlines() if line.strip()]
    connection.close()
    return reply.status, lines


def get(server, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=30)
    connection.request("GET", path, headers=headers or {})
    reply = connection.getresponse()
    body = reply.read()
    connection.close()
    return reply.status, body


QUESTIONS = [
    ("memory", {"model": "llama-3.1-8b", "gpus": "8xh100-sxm", "tp": "2", "seq": "8K", "sequence_parallel": "true"}),
    ("memory", {"model": "llama-3.1-70b", "gpus": "16xh100-sxm", "tp": "8", "pp": "2", "stages": "true"}),
    ("memory", {"model": "mixtral-8x7b", "gpus": "8xh100-sxm", "ep": "8", "zero": "1", "recompute": "selective"}),
    ("memory", {"model": "llama-3.1-8b", "gpus": "1xrtx-4090", "method": "qlora", "lora_rank": "64", "seq": "2048"}),
    ("fit", {"model": "llama-3.1-8b", "gpus": "8xh100-sxm", "tp": "2"}),
    (
        "train-time",
        {
            "model": "llama-3.1-70b",
            "gpus": "1024xh100-sxm",
            "mfu": "0.45",
            "tokens": "15T",
            "price_per_gpu_hour": "2.5",
        },
    ),  # fmt: skip
    ("max-params", {"like": "qwen3-8b", "gpus": "8xh100-sxm", "seq": "8192"}),
    ("plan", {"model": "llama-3.1-8b", "gpus": "8xh100-sxm", "global_batch": "1M"}),
]


@pytest.mark.parametrize(("command", "fields"), QUESTIONS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(QUESTIONS)])
def test_an_answer_is_the_json_of_the_command_it_shows(served, lmcalc_run, command, fields):
    status, lines = post(served, {"command": command, "fields": fields})
    assert status == 200, lines
    found = lines[-1]
    words = shlex.split(found["command"])
    assert words[:2] == ["lmcalc", command] and words[-1] == "--json"
    for name, value in fields.items():  # each setting given is on the line, unless it is the command's default
        assert f"--{name.replace('_', '-')}" in words or value in ("1", "true"), name
    ran = lmcalc_run(words[1:])
    assert ran.code == 0, ran.err
    assert found["json"] == ran.json  # the same figures, inputs, notes and headline, key for key
    view = found["view"]
    assert view["headline"] == ran.json["headline"]
    every = {(s["key"], t["key"]): t for s in view["sections"] for t in s["terms"]}
    for section, terms in ran.json["results"].items():
        for key, term in terms.items():
            shown = every[(section, key)]
            assert shown["value"] == term["value"] and shown.get("formula") == term.get("formula")
            assert shown.get("source") == term.get("source")


def test_the_memory_view_stacks_the_terms_the_json_holds(served):
    status, (found,) = post(served, {"command": "memory", "fields": {"model": "llama-3.1-70b", "gpus": "8xh100-sxm",
                                                                     "tp": "8"}})  # fmt: skip
    assert status == 200
    results = found["json"]["results"]
    (bar,) = found["view"]["bars"]
    assert bar["capacity"] == results["total"]["capacity"]["value"] == 85_028_896_768  # an H100's, as CUDA gives it
    # the bar's parts add up to the most loaded GPU's total, as the terminal's bar and --plot draw it
    assert sum(part["value"] for part in bar["parts"]) == pytest.approx(results["total"]["total"]["value"])
    total = results["total"]["total"]["value"]
    assert found["view"]["verdict"] == ("fits" if total <= 85_028_896_768 else "does not fit")


def test_a_plan_streams_its_progress_then_its_answer(served):
    status, lines = post(served, {"command": "plan", "fields": {"model": "llama-3.1-8b", "gpus": "64xh100-sxm"}})
    assert status == 200
    *progress, found = lines
    assert len(progress) >= 2, "a search of thousands of layouts reports as it goes"
    shares = [line["progress"] for line in progress]
    assert shares == sorted(shares) and 0 < shares[0] < 1
    assert found["json"]["command"] == "plan" and found["view"]["layout"] == "grid"


def test_a_dropped_plan_stops_and_gives_back_its_slot(served):
    host, port = served.server_address[:2]
    fields = {"model": "deepseek-v3", "gpus": "2048xh100-sxm", "global_batch": "16M"}  # a search of minutes
    body = json.dumps({"command": "plan", "fields": fields}).encode()
    with socket.create_connection((host, port), timeout=30) as connection:
        connection.sendall(f"POST /api/answer HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        connection.sendall(body)
        reply = connection.makefile("rb")
        while reply.readline().strip():  # the status line and the headers
            pass
        assert json.loads(reply.readline())["progress"] < 0.5
        reply.close()
    # the page asked something else: the connection is closed
    deadline = time.monotonic() + 10
    while served.plan_slots._value < page_server.PLAN_SEARCHES:  # noqa: SLF001 (the semaphore's count)
        assert time.monotonic() < deadline, "the dropped search still holds its slot after 10 s"
        time.sleep(0.05)


def test_a_repeated_question_is_answered_from_the_cache(served):
    question = {"command": "memory", "fields": {"model": "qwen3-8b", "gpus": "8xh100-sxm", "tp": "4"}}
    post(served, question)
    hits = served.cache.hits
    status, (again,) = post(served, question)
    assert status == 200 and served.cache.hits == hits + 1
    # the same question in other words (the fields in another order, a default spelt out) is the same question
    status, _ = post(served, {"command": "memory", "fields": {"tp": "4", "gpus": "8xh100-sxm", "model": "qwen3-8b",
                                                              "pp": ""}})  # fmt: skip
    assert served.cache.hits == hits + 2


def test_an_answer_does_not_wait_for_a_plan(served):
    """A long search runs on its own thread: a memory answer asked meanwhile comes back in well under a second."""
    fields = {"model": "llama-3.1-405b", "gpus": "1024xh100-sxm"}
    planning = threading.Thread(target=post, args=(served, {"command": "plan", "fields": fields}))
    planning.start()
    time.sleep(0.3)
    started = time.perf_counter()
    status, _ = post(served, {"command": "memory", "fields": {"model": "llama-3.1-8b", "seq": "3000"}})
    took = time.perf_counter() - started
    planning.join(timeout=120)
    assert status == 200 and took < 1.0, took


# ----------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("fields", "field", "said"),
    [
        ({"model": "llama-3.1-8b", "tp": "two"}, "tp", "--tp takes a whole number; got 'two'"),
        ({"model": "llama-3.1-8b", "zero": "4"}, "zero", "--zero takes 0 | 1 | 2 | 3; got '4'"),
        ({"model": "llama-3.1-8b", "sequence_paralel": "true"}, "sequence_paralel", "did you mean sequence_parallel?"),
        ({"model": "lama-3.1-8b"}, "model", "did you mean llama-3.1-8b?"),
        ({"model": "llama-3.1-8b", "seq": "abc"}, "seq", "--seq"),
        ({"model": "/etc/passwd"}, "model", "neither a preset's name nor a Hub id"),
        ({"model": "../config.json"}, "model", "neither a preset's name nor a Hub id"),
        ({"model": "config.json"}, "model", "reads as a file path"),
        ({"model": "llama-3.1-8b", "precision": "~/recipe.yaml"}, "precision", "reads as a file path"),
        ({"model": "llama-3.1-8b", "gpus": "8x/tmp/gpu.yaml"}, "gpus", "reads as a file path"),
        ({"model": "llama-3.1-8b", "calibration": "bench.json"}, "calibration", "use the command line"),
        ({"model": "llama-3.1-8b", "lora_dropout": "nan"}, "lora_dropout", "a finite number"),
        ({"model": "x" * 5000}, "model", "at most 200"),
    ],
)
def test_bad_input_is_refused_in_a_line_next_to_its_field(served, fields, field, said):
    status, (found,) = post(served, {"command": "memory", "fields": {"gpus": "8xh100-sxm", **fields}})
    assert status == 400
    assert found["field"] == field and said in found["error"] and "\n" not in found["error"]
    assert "Traceback" not in found["error"] and len(found["error"]) < 300


def test_a_hub_id_that_names_a_file_on_the_server_is_refused(served, tmp_path, monkeypatch):
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "model").write_text(HF_CONFIG.read_text())
    monkeypatch.chdir(tmp_path)
    status, (found,) = post(served, {"command": "memory", "fields": {"model": "owner/model"}})
    assert status == 400 and found["field"] == "model"
    assert "Hub" in found["error"]  # either lmcalc[hub] is missing, or the name is a local file: never read


def test_a_pasted_config_is_answered_as_the_file_would_be(served, lmcalc_run, tmp_path):
    text = HF_CONFIG.read_text()
    status, (found,) = post(served, {"command": "memory", "fields": {"gpus": "8xh100-sxm", "tp": "2"},
                                     "config": {"text": text, "name": "../../etc/config.json"}})  # fmt: skip
    assert status == 200
    assert "--model config.json" in found["command"]  # the uploaded name, without its directories
    (tmp_path / "config.json").write_text(text)
    ran = lmcalc_run(
        ["memory", "--model", str(tmp_path / "config.json"), "--gpus", "8xh100-sxm", "--tp", "2", "--json"]
    )
    assert found["json"]["results"] == ran.json["results"]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("x" * (MAX_CONFIG_BYTES + 1), "at most 262,144"),
        ('{"a": ' * (MAX_CONFIG_DEPTH + 1) + "1" + "}" * (MAX_CONFIG_DEPTH + 1), "nests deeper than 16"),
        ("[" * 100_000, "nests deeper"),
        ('{"hidden_size": 4096,', "not JSON"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_a_config_out_of_bounds_is_refused(served, config, said):
    status, (found,) = post(served, {"command": "memory", "fields": {}, "config": {"text": config}})
    assert status == 400 and found["field"] == "config" and said in found["error"]


def test_a_body_over_the_limit_is_refused_unread(served):
    status, (found,) = post(served, b"{" + b" " * (page_server.MAX_BODY + 10) + b"}")
    assert status == 400 and "at most" in found["error"]


def test_a_body_that_is_not_a_question_is_refused(served):
    assert post(served, b"not json")[1][0]["error"] == "the question is not JSON"
    assert post(served, {"command": "rm -rf", "fields": {}})[1][0]["error"].startswith("no command 'rm -rf'")


@pytest.mark.parametrize("host", ["evil.example", "127.0.0.1.evil.example", "attacker:80"])
def test_a_host_that_is_not_this_servers_is_refused(served, host):
    status, body = get(served, "/", {"Host": host})
    assert status == 403 and b"not this server's name" in body
    status, _ = post(served, {"command": "memory", "fields": {"model": "llama-3.1-8b"}}, {"Host": host})
    assert status == 403


def test_a_page_elsewhere_cannot_ask(served):
    host, port = served.server_address[:2]
    status, _ = post(served, {"command": "memory", "fields": {"model": "gpt2"}}, {"Origin": "http://evil.example"})
    assert status == 403
    status, _ = post(served, {"command": "memory", "fields": {"model": "gpt2"}}, {"Origin": f"http://{host}:{port}"})
    assert status == 200


@pytest.mark.parametrize("path", ["/../../etc/passwd", "/page.js/../../pyproject.toml", "/%2e%2e/README.md",
                                  "/lmcalc/serve/page/page.js", "/api/answer"])  # fmt: skip
def test_no_request_reads_a_path(served, path):
    status, _ = get(served, path)
    assert status == 404


def test_the_page_and_its_files(served):
    status, page = get(served, "/")
    assert status == 200 and b'<script src="/page.js"' in page
    for path in ("/page.js", "/page.css"):
        assert get(served, path)[0] == 200
    status, choices = get(served, "/api/choices")
    listed = json.loads(choices)
    assert status == 200 and "llama-3.1-8b" in {m["name"] for m in listed["models"]}
    assert "h100-sxm" in {h["name"] for h in listed["hardware"]} and listed["zero"] == [0, 1, 2, 3]


def test_serve_refuses_a_port_in_use(lmcalc_run, served):
    ran = lmcalc_run(["serve", "--port", str(served.server_address[1])])
    assert ran.code == 2 and "cannot listen on" in ran.err and "--port 0" in ran.err


def test_a_plans_layout_as_a_framework_config(served, lmcalc_run):
    host, port = served.server_address[:2]
    fields = {"model": "llama-3.1-8b", "gpus": "16xh100-sxm", "tp": "1", "pp": "1", "cp": "1", "zero": "2",
              "framework": "deepspeed"}  # fmt: skip

    def emit(kind: object, rank: object = 1) -> tuple[int, dict]:
        connection = http.client.HTTPConnection(host, port, timeout=60)
        body = json.dumps({"command": "plan", "fields": fields, "emit": kind, "rank": rank}).encode()
        connection.request("POST", "/api/emit", body)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())

    status, found = emit("deepspeed")
    assert status == 200 and found["name"] == "lmcalc-deepspeed.json"
    assert json.loads(found["text"])["zero_optimization"]["stage"] == 2
    ran = lmcalc_run(shlex.split(found["command"])[1:])
    assert ran.out == found["text"]  # what `plan --emit` prints, byte for byte
    assert emit("nemo")[0] == 400 and emit("megatron", 0)[0] == 400
    status, found = emit("megatron", 10**6)
    assert status == 400 and "the plan ranks" in found["error"]


def test_answers_computed_in_worker_processes_are_the_same():
    """``lmcalc serve`` computes answers in worker processes (the interpreter's lock holds threads to one core)."""
    fields = {"model": "llama-3.1-8b", "gpus": "8xh100-sxm", "tp": "2", "seq": "6000"}
    pooled = page_server.start(workers=1)
    try:
        status, (found,) = post(pooled, {"command": "memory", "fields": fields})
    finally:
        pooled.shutdown()
        pooled.server_close()
    from lmcalc.serve.answers import answer
    from lmcalc.serve.questions import question_of

    assert status == 200 and found["json"] == answer(question_of("memory", fields))["json"]
