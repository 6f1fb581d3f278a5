"""How `lmcalc serve` answers many clients at once: latency and throughput of its answers, under three mixes.

Starts `python -m lmcalc serve --host 127.0.0.1 --port 0` (the lmcalc that ``python -m lmcalc`` imports from the
repository's root) as a child process, reads its URL from the first line it prints, and runs N clients for D seconds
against it, each a thread with ``http.client``: a closed loop, each client asking its next question only once the
previous answer has arrived (and, with ``--think-ms``, that many ms later). Memory answers go over one keep-alive
connection per client; each plan over a fresh connection, as the page asks them. Each mix runs on a server of its own,
started fresh and stopped at the end (on an error or Ctrl-C too). The mixes:

- ``cached``: memory answers to 20 questions asked again and again (llama-3.1-8b and llama-3.1-70b on 8xh100-sxm,
  different tp/pp/seq/micro-batch), each client walking the list back and forth, as a slider moved to and fro;
  every question is asked once before the clock starts, so each answer comes from the server's cache;
- ``uncached``: memory answers to questions never asked before (llama-3.1-8b on 8xh100-sxm, a new --seq each
  time), each one computed;
- ``plans``: one client in ten asks plans (llama-3.1-8b on 8xh100-sxm and 16xh100-sxm, --seq 4096 and 8192: four
  plans, each computed the first time and then from the cache), the others the ``cached`` mix's memory questions.

For each kind of answer: p50/p95/max latency (from sending the request to the whole answer read), answers a second,
clients / answers a second (by Little's law, the mean latency plus the think time that a closed loop must show),
errors (not HTTP 200, or no "json" in the answer) and lost responses (a request sent that got no whole answer: a
reset, a timeout, or still waiting when the run ends, with when they happened); the server's own compute time
(``took_ms``) for answers computed for the request; the CPU seconds the server and the clients used (they share the
machine), and those every other process used meanwhile (Linux's /proc/stat: on a shared machine, how much the figures
were disturbed); and the server's memory at the end. Target (on the 2-core development
machine): a memory answer's p95 under 150 ms, with no error and no lost response.
    python benchmarks/serve_load.py [--clients 50] [--duration 30] [--think-ms 0] [--mix cached,uncached,plans]
    python benchmarks/serve_load.py --quick          # 10 clients for 5 s each: a smoke check
    python benchmarks/serve_load.py --json serve-load.json
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import math
import os
import platform
import re
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
"""The only address this script talks to: the server is started on it, and every connection is made to it."""
ROOT = Path(__file__).resolve().parent.parent
URL_LINE = re.compile(r"the page is at http://127\.0\.0\.1:(\d{1,5})/")
SERVE = [sys.executable, "-m", "lmcalc", "serve", "--host", HOST, "--port", "0"]
"""The server measured: ``lmcalc serve`` on 127.0.0.1, on any free port."""
TARGET_P95_MS = 150.0
START_TIMEOUT_S = 60.0
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, application/x-ndjson"}

# (model, tp, pp, seq, micro-batch) on 8xh100-sxm: every one a valid layout (some fit, some do not: both answer)
MEMORY_SHAPES = [
    ("llama-3.1-8b", 1, 1, 4096, 1), ("llama-3.1-8b", 2, 1, 4096, 1), ("llama-3.1-8b", 4, 1, 4096, 1),
    ("llama-3.1-8b", 8, 1, 4096, 1), ("llama-3.1-8b", 2, 2, 4096, 1), ("llama-3.1-8b", 2, 1, 2048, 1),
    ("llama-3.1-8b", 2, 1, 8192, 1), ("llama-3.1-8b", 2, 1, 16384, 1), ("llama-3.1-8b", 2, 1, 4096, 2),
    ("llama-3.1-8b", 4, 1, 4096, 4), ("llama-3.1-70b", 8, 1, 4096, 1), ("llama-3.1-70b", 4, 2, 4096, 1),
    ("llama-3.1-70b", 2, 4, 4096, 1), ("llama-3.1-70b", 1, 8, 4096, 1), ("llama-3.1-70b", 8, 1, 8192, 1),
    ("llama-3.1-70b", 8, 1, 2048, 1), ("llama-3.1-70b", 4, 2, 4096, 2), ("llama-3.1-70b", 8, 1, 4096, 2),
    ("llama-3.1-70b", 2, 4, 8192, 1), ("llama-3.1-70b", 8, 1, 16384, 1),
]  # fmt: skip
PLAN_SHAPES = [("llama-3.1-8b", gpus, seq) for gpus in ("8xh100-sxm", "16xh100-sxm") for seq in (4096, 8192)]
FIRST_UNCACHED_SEQ = 2049
"""The uncached mix's first --seq; each question after it asks the next whole number."""


def question(command: str, **fields: object) -> bytes:
    """A request body as the page sends it: every field's value as text."""
    return json.dumps({"command": command, "fields": {k: str(v) for k, v in fields.items()}}).encode()


def memory_question(model: str, tp: int, pp: int, seq: int, micro_batch: int) -> bytes:
    return question("memory", model=model, gpus="8xh100-sxm", tp=tp, pp=pp, seq=seq, micro_batch=micro_batch)


REPEATED = [memory_question(*shape) for shape in MEMORY_SHAPES]
PLANS = [question("plan", model=model, gpus=gpus, seq=seq) for model, gpus, seq in PLAN_SHAPES]


# ------------------------------------------------------------------------------------------------ the server


def port_of(line: str) -> int:
    """The port in the server's first line (``lmcalc serve: the page is at http://127.0.0.1:PORT/ ...``); anything
    but a URL on 127.0.0.1 is refused, so that the clients never connect anywhere else."""
    found = URL_LINE.search(line)
    if found is None or not 0 < int(found.group(1)) < 65536:
        raise SystemExit(f"the server's first line names no http://{HOST}:PORT/: {line.strip()[:200]!r}")
    return int(found.group(1))


class Server:
    """``lmcalc serve`` on 127.0.0.1 and a free port, as a child process in a session of its own (so that Ctrl-C
    reaches this script, which stops it)."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (the server's stderr, read on a failure; closed by stop)
        self.process = subprocess.Popen(
            SERVE, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True
        )
        try:
            self.port = port_of(self._first_line())
        except BaseException:
            self.stop()
            raise

    def _first_line(self) -> str:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(START_TIMEOUT_S):
                raise SystemExit(f"lmcalc serve printed nothing in {START_TIMEOUT_S:.0f} s")
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"lmcalc serve exited ({self.process.wait()}) before printing its URL: {self.stderr()}")
        return line

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def cpu_s(self) -> float | None:
        """User + system CPU seconds the server has used (Linux: /proc), or None."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float | None:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(found.group(1)) / 1024 if found else None

    def stop(self) -> None:
        """Ctrl-C, as a person stops it; then SIGTERM, then SIGKILL, each after 5 s."""
        for sent in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                break
            self.process.send_signal(sent)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                continue
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


# ----------------------------------------------------------------------------------------------- the clients


@dataclass
class Tally:
    """What the clients of one kind saw."""

    latencies_ms: list[float] = field(default_factory=list)
    took_ms: list[float] = field(default_factory=list)  # the server's compute time, for answers computed for us
    errors: int = 0
    lost: int = 0
    lost_at_s: list[float] = field(default_factory=list)  # when each was lost, from the start
    sent: int = 0
    clients: int = 0
    first_error: str = ""


@dataclass(frozen=True)
class Group:
    """Clients that ask one kind of question."""

    kind: str  # memory | plan
    label: str
    clients: int
    questions: Callable[[int], Iterator[bytes]]  # a client's questions, by its number
    computed: bool = False  # every answer computed for its request: its took_ms counts


@dataclass(frozen=True)
class Reply:
    status: int
    kind: str  # Content-Type
    body: bytes


class Client:
    """One simulated person: asks, waits for the whole answer, thinks, asks again, until ``deadline``."""

    def __init__(self, port: int, group: Group, number: int, tally: Tally, lock: threading.Lock) -> None:
        self.port, self.kind, self.computed = port, group.kind, group.computed
        self.questions, self.tally, self.lock = group.questions(number), tally, lock
        self.connection: http.client.HTTPConnection | None = None
        self.in_flight = False

    def run(self, started: float, deadline: float, think_s: float, timeout_s: float, stop: threading.Event) -> None:
        try:
            while time.perf_counter() < deadline and not stop.is_set():
                body = next(self.questions)
                with self.lock:
                    self.tally.sent += 1
                self.in_flight = True
                sent = time.perf_counter()
                try:
                    reply = self.ask(body, timeout_s)
                except (OSError, http.client.HTTPException) as exc:  # reset, refused, timed out, cut short
                    self.close()
                    self.in_flight = False
                    with self.lock:
                        self.tally.lost += 1
                        self.tally.lost_at_s.append(time.perf_counter() - started)
                        self.tally.first_error = self.tally.first_error or f"lost: {exc!r}"
                    continue
                elapsed_ms = 1000 * (time.perf_counter() - sent)
                self.in_flight = False
                error, took = check(reply, self.kind)
                with self.lock:
                    self.tally.latencies_ms.append(elapsed_ms)
                    if error:
                        self.tally.errors += 1
                        self.tally.first_error = self.tally.first_error or error
                    elif took is not None and (self.kind == "plan" or self.computed):
                        self.tally.took_ms.append(took)
                if think_s:
                    stop.wait(think_s)
        finally:
            self.close()

    def ask(self, body: bytes, timeout_s: float) -> Reply:
        """One question: over this client's keep-alive connection (a memory answer), or a fresh one (a plan)."""
        if self.connection is None:
            self.connection = http.client.HTTPConnection(HOST, self.port, timeout=timeout_s)
        self.connection.request("POST", "/api/answer", body=body, headers=HEADERS)
        response = self.connection.getresponse()
        reply = Reply(response.status, response.getheader("Content-Type", ""), response.read())
        if self.kind == "plan" or response.will_close:
            self.close()
        return reply

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def check(reply: Reply, kind: str) -> tuple[str, float | None]:
    """An error's description ("" for an answer), and the server's compute time (``took_ms``) where the answer may
    have been computed for this request: a memory answer's (a cached answer keeps the one it was computed in, so the
    mix says whether it counts), a plan's where it was streamed (a cached plan comes back as one JSON object). An
    answer is about 30 KB of JSON, parsed whole: the last line of a plan's stream."""
    if reply.status != 200:
        return f"HTTP {reply.status}: {reply.body[:200]!r}", None
    last = reply.body.rstrip(b"\n").rpartition(b"\n")[2]
    try:
        answer = json.loads(last)
    except ValueError:
        return f"not JSON: {last[:200]!r}", None
    if not isinstance(answer, dict) or "json" not in answer:
        return f"no json in the answer: {last[:200]!r}", None
    streamed = reply.kind.startswith("application/x-ndjson")
    took = answer.get("took_ms")
    return "", took if (kind == "memory" or streamed) and isinstance(took, int | float) else None


# ------------------------------------------------------------------------------------------------- the mixes


def back_and_forth(start: int) -> Iterator[bytes]:
    """The repeated questions in order, then back, from ``start``: a slider moved to and fro."""
    order = [*range(len(REPEATED)), *range(len(REPEATED) - 2, 0, -1)]
    for index in itertools.islice(itertools.cycle(order), start % len(order), None):
        yield REPEATED[index]


UNCACHED_SEQ = itertools.count(FIRST_UNCACHED_SEQ)  # shared by all clients: next() on a count is atomic


def never_asked(_: int) -> Iterator[bytes]:
    while True:
        yield memory_question("llama-3.1-8b", 2, 1, next(UNCACHED_SEQ), 1)


def plans(start: int) -> Iterator[bytes]:
    yield from itertools.islice(itertools.cycle(PLANS), start % len(PLANS), None)


def mixes(clients: int, plan_clients: int) -> dict[str, tuple[list[Group], list[bytes]]]:
    """Each mix: its groups of clients, and the questions asked once before the clock starts."""
    repeated = Group("memory", "memory, repeated (cache)", clients, back_and_forth)
    return {
        "cached": ([repeated], REPEATED),
        "uncached": (
            [Group("memory", "memory, never asked (computed)", clients, never_asked, computed=True)],
            [memory_question("llama-3.1-8b", 2, 1, FIRST_UNCACHED_SEQ - 1, 1)],  # the answer code's first import
        ),
        "plans": (
            [
                Group("memory", "memory, repeated (cache)", clients - plan_clients, back_and_forth),
                Group("plan", "plan (4 plans: computed once, then cache)", plan_clients, plans),
            ],
            REPEATED,
        ),
    }


def warm(port: int, questions: list[bytes], timeout_s: float) -> None:
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
    try:
        for body in questions:
            connection.request("POST", "/api/answer", body=body, headers=HEADERS)
            response = connection.getresponse()
            data = response.read()
            if response.status != 200 or b'"json"' not in data:
                raise SystemExit(f"a warm-up question was not answered: HTTP {response.status} {data[:300]!r}")
    finally:
        connection.close()


def run_mix(groups: list[Group], warm_up: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    server = Server()
    try:
        warm(server.port, warm_up, args.timeout)
        lock, stop = threading.Lock(), threading.Event()
        tallies = {group.label: Tally(clients=group.clients) for group in groups}
        clients = [
            Client(server.port, group, number, tallies[group.label], lock)
            for group in groups
            for number in range(group.clients)
        ]
        cpu_before, server_cpu_before, machine_before = _own_cpu_s(), server.cpu_s(), _machine_busy_s()
        started = time.perf_counter()
        deadline = started + args.duration
        run_args = (started, deadline, args.think_ms / 1000, args.timeout, stop)
        threads = [threading.Thread(target=c.run, args=run_args, daemon=True) for c in clients]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:  # each ends after the answer it waits for at the deadline, or times out
                thread.join(max(0.0, deadline + args.timeout + 5 - time.perf_counter()))
        finally:
            stop.set()
        elapsed = time.perf_counter() - started
        with lock:
            for c, thread in zip(clients, threads, strict=True):
                if thread.is_alive() and c.in_flight:
                    c.tally.lost += 1  # no whole answer by the end
                    c.tally.lost_at_s.append(elapsed)
        server_cpu, machine_busy, client_cpu = server.cpu_s(), _machine_busy_s(), _own_cpu_s() - cpu_before
        others = None
        if server_cpu is not None and machine_busy is not None and machine_before is not None:
            others = machine_busy - machine_before - (server_cpu - (server_cpu_before or 0)) - client_cpu
        figures: dict[str, Any] = {
            "elapsed_s": round(elapsed, 2),
            "server_cpu_s": round(server_cpu - server_cpu_before, 2) if server_cpu is not None else None,
            "client_cpu_s": round(client_cpu, 2),
            "others_cpu_s": round(max(0.0, others), 2) if others is not None else None,
            "server_rss_mib": round(rss, 1) if (rss := server.rss_mib()) is not None else None,
            "kinds": [summary(group, tallies[group.label], elapsed) for group in groups],
        }
        if server.process.poll() is not None:
            figures["server_exited"] = f"{server.process.returncode}: {server.stderr()}"
        return figures
    finally:
        server.stop()


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux: /proc/stat): what other processes used
    during a mix is this less the server's and the clients'."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank percentile of sorted values."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(group: Group, tally: Tally, elapsed: float) -> dict[str, Any]:
    ordered = sorted(tally.latencies_ms)
    answered = len(ordered) - tally.errors
    rate = answered / elapsed if elapsed else 0.0
    took = sorted(tally.took_ms)
    return {
        "kind": group.label,
        "clients": group.clients,
        "sent": tally.sent,
        "answers": answered,
        "per_s": round(rate, 1),
        "p50_ms": _round(percentile(ordered, 0.50)),
        "p95_ms": _round(percentile(ordered, 0.95)),
        "max_ms": _round(ordered[-1] if ordered else None),
        "mean_ms": _round(sum(ordered) / len(ordered) if ordered else None),
        "clients_over_rate_ms": _round(1000 * group.clients / rate if rate else None),
        "errors": tally.errors,
        "lost": tally.lost,
        "lost_between_s": [round(min(tally.lost_at_s), 2), round(max(tally.lost_at_s), 2)] if tally.lost_at_s else None,
        "computed": len(tally.took_ms),
        "took_p50_ms": _round(percentile(took, 0.50)),
        "took_p95_ms": _round(percentile(took, 0.95)),
        "first_error": tally.first_error,
        "target_met": (
            group.kind == "memory"
            and tally.errors == 0
            and tally.lost == 0
            and ordered != []
            and (percentile(ordered, 0.95) or 0) < TARGET_P95_MS
        ),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# ----------------------------------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def print_mix(name: str, figures: dict[str, Any]) -> None:
    def shown(value: object) -> str:
        return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    print(
        f"\n{name}: {figures['elapsed_s']:.1f} s; CPU s used: server {shown(figures['server_cpu_s'])}, "
        f"clients {figures['client_cpu_s']:.1f}, other processes {shown(figures['others_cpu_s'])} "
        f"(of {figures['elapsed_s'] * (os.cpu_count() or 1):.0f}); server RSS {shown(figures['server_rss_mib'])} MiB"
    )
    columns = ("clients", "answers", "per_s", "p50_ms", "p95_ms", "max_ms", "mean_ms", "clients_over_rate_ms",
               "errors", "lost", "computed", "took_p50_ms", "took_p95_ms")  # fmt: skip
    heads = ("clients", "answers", "/s", "p50 ms", "p95 ms", "max ms", "mean ms", "N/(/s) ms", "errors", "lost",
             "computed", "took p50", "took p95")  # fmt: skip
    print(f"  {'kind':<42}" + "".join(f"{head:>10}" for head in heads))
    for row in figures["kinds"]:
        print(f"  {row['kind']:<42}" + "".join(f"{shown(row[c]):>10}" for c in columns))
        if row["first_error"]:
            print(f"    first error: {row['first_error'][:300]}")
        if row["lost_between_s"]:
            first, last = row["lost_between_s"]
            print(f"    lost responses: {row['lost']}, between {first:g} and {last:g} s after the start")
        if row["kind"].startswith("memory"):
            verdict = "met" if row["target_met"] else "not met"
            print(f"    target p95 < {TARGET_P95_MS:g} ms, no error, no lost response: {verdict}")
    if "server_exited" in figures:
        print(f"  the server exited: {figures['server_exited']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=None, help="clients at once (default 50; --quick: 10)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per mix (default 30; --quick: 5)")
    parser.add_argument("--think-ms", type=float, default=0.0, help="pause after each answer before the next ask")
    parser.add_argument("--plan-clients", type=int, default=None, help="clients asking plans (default clients/10)")
    parser.add_argument("--mix", default="cached,uncached,plans", help="which mixes, comma-separated")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a client waits for an answer")
    parser.add_argument("--quick", action="store_true", help="a smoke check: 10 clients, 5 s per mix")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    args.clients = args.clients or (10 if args.quick else 50)
    args.duration = args.duration or (5.0 if args.quick else 30.0)
    plan_clients = args.plan_clients if args.plan_clients is not None else max(1, args.clients // 10)
    available = mixes(args.clients, plan_clients)
    chosen = [name.strip() for name in args.mix.split(",") if name.strip()]
    if unknown := [name for name in chosen if name not in available]:
        parser.error(f"no mix {', '.join(unknown)}; the mixes are {', '.join(available)}")
    if args.clients < 1 or ("plans" in chosen and not 0 < plan_clients < args.clients):
        parser.error("--clients must be at least 1 (2 with the plans mix, --plan-clients between 1 and clients - 1)")
    if args.duration <= 0 or args.think_ms < 0 or args.timeout <= 0:
        parser.error("--duration and --timeout must be positive, --think-ms at least 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the server is stopped on a kill too

    about = machine()
    print(
        f"{args.clients} clients, {args.duration:g} s per mix, think time {args.think_ms:g} ms; "
        f"{about['cpus']} CPUs ({about['cpu_model']}), Python {about['python']}, "
        f"load average {' '.join(map(str, about['load_average']))}"
    )
    print("N/(/s): clients over answers a second, the mean latency plus think time a closed loop shows (Little's law); "
          "computed: answers computed for their request, whose server time is took p50/p95")  # fmt: skip
    results: dict[str, Any] = {}
    for name in chosen:
        groups, warm_up = available[name]
        try:
            results[name] = run_mix(groups, warm_up, args)
        except KeyboardInterrupt:  # run_mix has stopped the server
            print(f"\ninterrupted during the {name} mix; its server is stopped", file=sys.stderr)
            sys.exit(130)
        print_mix(name, results[name])
    if args.json:
        report = {
            "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": about,
            "arguments": {
                "clients": args.clients,
                "plan_clients": plan_clients,
                "duration_s": args.duration,
                "think_ms": args.think_ms,
                "timeout_s": args.timeout,
            },
            "target_p95_ms": TARGET_P95_MS,
            "mixes": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    main()
