"""Real vLLM (CPU build) servers on 127.0.0.1 serving the tiny local models of the ground venv.

The venv, models and `vllm` shim come from `.ci/install-ground.sh` (default /opt/spark-ops-vllm, or
$SPARK_GROUND_VENV). A server is started with `vllm serve MODEL --host 127.0.0.1 --port P
--max-num-seqs N --kv-cache-memory-bytes 1G --enforce-eager`, is ready once a real completion
answers, and stops on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.engine.metrics import metric_sums
from spark_ops.engine.metrics import parse_metrics as metric_samples

from . import GroundError
from .sshd import free_port, pid_alive

VENV = Path(os.environ.get("SPARK_GROUND_VENV", "/opt/spark-ops-vllm"))
MODELS = ("tiny-llama", "tiny-moe", "tiny-llama-deep")
SERVED_NAME = "tiny"
BOOT_TIMEOUT = 300.0
STOP_TIMEOUT = 30.0


OWNER_ENV = "SPARK_GROUND_VLLM_OWNER"
RECIPE_TEMPLATE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "realvllm" / "tiny-llama.recipe.yaml.tmpl"
)


def tiny_llama_recipe(
    *,
    writer: str,
    port: int,
    env: dict[str, str],
    max_num_seqs: int = 32,
    kv_cache: str = "2G",
    models: Path | str = VENV / "models",
    name: str = "tiny-llama-cpu",
    description: str = "a tiny local Llama on the CPU build of vLLM 0.32",
    tensor_parallel: int | None = None,
    executor: str = "ray",
) -> str:
    """The tiny-llama recipe of the real-engine tests, from its one template.

    With `tensor_parallel`, the engine runs at that TP over the executor (`tensor_parallel` in
    defaults, `--tensor-parallel-size` and `--distributed-executor-backend ray`, or `mp` for ranks
    without Ray, on the command line).
    """
    from string import Template

    tp = tensor_parallel is not None
    return Template(RECIPE_TEMPLATE.read_text(encoding="utf-8")).substitute(
        writer=writer,
        name=name,
        description=description,
        models=models,
        port=port,
        max_num_seqs=max_num_seqs,
        kv_cache=kv_cache,
        env="".join(f"  {k}: {json.dumps(v)}\n" for k, v in env.items()),
        extra_defaults=f"  tensor_parallel: {tensor_parallel}\n" if tp else "",
        extra_flags=(
            " \\\n      --tensor-parallel-size {tensor_parallel} \\\n"
            f"      --distributed-executor-backend {executor}"
            if tp
            else ""
        ),
    )


def sweep_stale_servers() -> list[int]:
    """Kill ground vLLM processes whose owner test process died (OWNER_ENV); return their pids."""
    killed: list[int] = []
    marker = OWNER_ENV.encode() + b"="
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        owners = [item[len(marker) :] for item in environ if item.startswith(marker)]
        if not owners or not owners[0].isdigit() or pid_alive(int(owners[0])):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
    return killed


class VllmBootFailed(GroundError):
    """The vLLM server exited or missed its deadline before it answered a completion."""


def shim_path() -> Path:
    """The `vllm` executable the install script puts in the venv (a copy of scripts/vllm-shim)."""
    return VENV / "shim" / "vllm"


def model_path(name: str) -> Path:
    """The directory of a tiny model of the ground venv (tiny-llama, tiny-moe)."""
    return VENV / "models" / name


def vllm_unavailable_reason() -> str | None:
    """Return why a real vLLM cannot run here (venv, shim or a model missing), or None."""
    fix = "run: bash .ci/install-ground.sh"
    if not (VENV / "bin" / "python").is_file():
        return f"no vLLM CPU venv at {VENV} ({fix})"
    if not os.access(shim_path(), os.X_OK):
        return f"no vllm shim at {shim_path()} ({fix})"
    for name in MODELS:
        if not (model_path(name) / "config.json").is_file():
            return f"tiny model {model_path(name)} missing ({fix})"
    return None


def shm_in_use(pids: Sequence[int]) -> set[str]:
    """The names of the /dev/shm files the given processes map or hold open."""
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text(errors="replace").splitlines():
                if "/dev/shm/" in line:
                    found.add(line.rsplit("/", 1)[1].split()[0])
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/"):
                        found.add(target.rsplit("/", 1)[1].split()[0])
    return found


def remove_orphan_cpushm() -> list[str]:
    """Delete the `/dev/shm/*-cpushm_*` files no live process maps or holds; return their names.

    vLLM's CPU build names the shared memory of a TP>1 group after its rendezvous port
    (`<port>-tp:0-[0-1]-cpushm_<rank>`, vllm/v1/worker/cpu_worker.py) and a SIGKILLed engine
    leaves them: a later engine that draws the same free port fails "create shm in SHMManager
    failed. errno: 17" (CI, stop 39). The grounds that boot TP>1 engines call this first. A file
    younger than a minute is left alone: an engine of another test may be creating it now.
    """
    now = time.time()
    try:
        names = [
            p.name
            for p in Path("/dev/shm").iterdir()
            if "-cpushm_" in p.name and now - p.lstat().st_mtime > 60
        ]
    except OSError:
        return []
    if not names:
        return []
    live = shm_in_use([int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()])
    removed = []
    for name in names:
        if name not in live:
            with contextlib.suppress(OSError):
                (Path("/dev/shm") / name).unlink()
                removed.append(name)
    return removed


def parse_metrics(text: str) -> dict[str, float]:
    """Sum samples by metric name {'vllm:num_requests_running': 6.0}: spark-ops' one parser."""
    return metric_sums(text)


QUEUE_TIME_BUCKET = "vllm:request_queue_time_seconds_bucket"


def queue_time_buckets(text: str) -> dict[float, float]:
    """The WAITING-time histogram: finished requests by upper bound {0.3: 6.0, inf: 16.0}."""
    out: dict[float, float] = {}
    for sample in metric_samples(text, [QUEUE_TIME_BUCKET]):
        bound = float(sample.labels["le"])
        out[bound] = out.get(bound, 0.0) + sample.value
    return out


def waited_longer(before: str, after: str, seconds: float) -> tuple[float, int]:
    """(bound, requests finished between two /metrics pages that waited longer than bound).

    The bound is the histogram's largest bucket bound at most `seconds` (vLLM's first is 0.3 s);
    a request counted waited longer than that bound, so at least that long for a free slot.
    """
    old, new = queue_time_buckets(before), queue_time_buckets(after)
    bounds = [b for b in new if b <= seconds]
    if not bounds:
        raise AssertionError(f"no queue-time bucket at or below {seconds:.2f} s: {sorted(new)}")
    bound = max(bounds)
    total = new[math.inf] - old.get(math.inf, 0.0)
    within = new[bound] - old.get(bound, 0.0)
    return bound, round(total - within)


def queue_time_count(before: str, after: str) -> int:
    """How many requests the queue-time histogram counted between two /metrics pages."""
    return round(
        queue_time_buckets(after).get(math.inf, 0.0) - queue_time_buckets(before).get(math.inf, 0.0)
    )


def metrics_page(base_url: str, timeout: float = 10.0) -> str:
    """The engine's /metrics page."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as r:
        return str(r.read().decode())


def metrics_after(base_url: str, before: str, finished: int, timeout: float = 90.0) -> str:
    """The /metrics page once `finished` more requests are in the queue-time histogram.

    A request is observed there when its output is processed, which may be just after its
    client had the last token: the page is read again until it counts them (or the deadline; a
    busy machine's API server may record them late, so the deadline is generous and a caller
    compares `queue_time_count` with what it sent).
    """
    want = queue_time_buckets(before).get(math.inf, 0.0) + finished
    deadline = time.monotonic() + timeout
    while True:
        page = metrics_page(base_url)
        if queue_time_buckets(page).get(math.inf, 0.0) >= want or time.monotonic() > deadline:
            return page
        time.sleep(0.2)


@dataclass
class VllmServer:
    """One `vllm serve` process: its command line, log, port and how long it took to be ready."""

    model: str
    port: int
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] = field(repr=False)
    host: str = "127.0.0.1"
    served_model_name: str = SERVED_NAME
    started_at: float = field(default_factory=time.monotonic)
    boot_seconds: float | None = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the API server process is alive."""
        return self.proc.poll() is None

    def log_text(self) -> str:
        """Everything the server printed so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self, needle: str) -> list[str]:
        """The log lines containing needle."""
        return [line for line in self.log_text().splitlines() if needle in line]

    def non_default_args_line(self) -> str | None:
        """The `non-default args: {…}` start-up line, or None before it is printed."""
        lines = self.log_lines("non-default args:")
        return lines[0] if lines else None

    def get(self, path: str, *, timeout: float = 10.0) -> str:
        """GET path and return the body (raises urllib errors on failure)."""
        with urllib.request.urlopen(self.base_url + path, timeout=timeout) as resp:
            return str(resp.read().decode())

    def post_json(self, path: str, body: dict[str, Any], *, timeout: float = 30.0) -> Any:
        """POST a JSON body to path and return the decoded JSON answer."""
        req = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode())

    def stream_chat(self, prompt: str, *, max_tokens: int = 8, timeout: float = 60.0) -> list[Any]:
        """Stream a chat completion with a usage chunk; return every `data:` payload in order."""
        body = {
            "model": self.served_model_name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        req = urllib.request.Request(
            self.base_url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        events: list[Any] = []
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    payload = line[len("data:") :].strip()
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def complete(self, prompt: str = "Hello", *, max_tokens: int = 4, timeout: float = 30.0) -> Any:
        """Run a small non-streaming completion and return the JSON answer."""
        body = {"model": self.served_model_name, "prompt": prompt, "max_tokens": max_tokens}
        return self.post_json("/v1/completions", body, timeout=timeout)

    def metrics(self) -> dict[str, float]:
        """GET /metrics, summed by metric name."""
        return parse_metrics(self.get("/metrics"))

    def wait_ready(self, timeout: float = BOOT_TIMEOUT) -> float:
        """Wait until a real completion answers; return seconds since start, else VllmBootFailed."""
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise VllmBootFailed(self._failure(f"exited with code {self.proc.returncode}"))
            try:
                answer = self.complete(timeout=10.0)
            except (OSError, ValueError):
                time.sleep(1.0)
                continue
            if answer.get("choices"):
                self.boot_seconds = time.monotonic() - self.started_at
                return self.boot_seconds
        raise VllmBootFailed(self._failure(f"did not answer a completion within {timeout:.0f} s"))

    def wait_exit(self, timeout: float = BOOT_TIMEOUT) -> int:
        """Wait for the process to exit by itself; return its exit code (GroundError on timeout)."""
        remaining = max(0.0, self.started_at + timeout - time.monotonic())
        try:
            return self.proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired as exc:
            raise GroundError(f"vLLM on port {self.port} still runs after {timeout:.0f} s") from exc

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM the server, wait, SIGKILL its process group if it lingers; return exit code."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # engine/worker children left in its session
        return int(self.proc.returncode)

    def _failure(self, what: str) -> str:
        """Describe a failed boot with the log's error lines (or its tail)."""
        errors = [
            line for line in self.log_text().splitlines() if " ERROR " in line or "Error" in line
        ]
        tail = errors[-8:] or self.log_text().splitlines()[-15:]
        return f"vLLM {self.model} on port {self.port} {what}; log {self.log_path}:\n" + "\n".join(
            tail
        )


class VllmFactory:
    """Starts real vLLM servers in a work directory and stops them all on close()."""

    def __init__(self, workdir: Path) -> None:
        """Remember the work directory (logs, cwd of the servers)."""
        self.workdir = workdir
        self.servers: list[VllmServer] = []
        sweep_stale_servers()

    def __iter__(self) -> Iterator[VllmServer]:
        """Iterate over the servers started so far."""
        return iter(self.servers)

    def launch(
        self,
        model: str = "tiny-llama",
        *,
        max_num_seqs: int | None = 6,
        kv_cache_memory_bytes: str = "1G",
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> VllmServer:
        """Start `vllm serve` for a ground model name or a model path, without waiting for it."""
        path = model_path(model) if model in MODELS else Path(model)
        port = port or free_port()
        argv = [str(shim_path()), "serve", str(path), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--served-model-name", SERVED_NAME, "--enforce-eager"]
        argv += ["--kv-cache-memory-bytes", kv_cache_memory_bytes]
        if max_num_seqs is not None:
            argv += ["--max-num-seqs", str(max_num_seqs)]
        argv += list(extra_args)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / f"vllm-{len(self.servers) + 1}-{port}.log"
        run_env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
        run_env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        run_env[OWNER_ENV] = str(os.getpid())  # lets a later run kill what a killed run left
        run_env.update(env or {})
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=run_env,
                start_new_session=True,
            )
        server = VllmServer(model=model, port=port, argv=argv, log_path=log_path, proc=proc)
        self.servers.append(server)
        return server

    def start(
        self,
        model: str = "tiny-llama",
        *,
        max_num_seqs: int | None = 6,
        boot_timeout: float = BOOT_TIMEOUT,
        **kwargs: Any,
    ) -> VllmServer:
        """Start a server and wait until it answers a completion (VllmBootFailed otherwise)."""
        server = self.launch(model, max_num_seqs=max_num_seqs, **kwargs)
        try:
            server.wait_ready(boot_timeout)
        except VllmBootFailed:
            server.stop()
            raise
        return server

    def close(self) -> None:
        """Stop every server started here."""
        for server in self.servers:
            server.stop()
