"""Looking around the head of a connected session: recipe, watchdog, engine log and API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_ops.discover.options import (
    BASH_WATCHDOGS,
    DOCKER_CONTAINER,
    HISTORY_GLOBS,
    LOG_FILES,
    RECIPE_DIRS,
    WATCHDOG_CONFIG,
    Finding,
    InitOptions,
    NodeSpec,
)
from spark_ops.engine import EngineAPI
from spark_ops.errors import SparkOpsError
from spark_ops.inventory import (
    DEFAULT_WORKER_CHECK,
    Cluster,
    EngineSettings,
    Node,
    RecipeSettings,
    SSHSettings,
    WatchdogSettings,
)
from spark_ops.recipe import render_recipe
from spark_ops.remote import ClusterSession, RemoteProgram, Result
from spark_ops.remote.programs.discover import (
    DOCKER_NAMES,
    FIND_FILES,
    FIND_RECIPES,
    HAS_RESTART_NOW,
    TEST_PATH,
    VLLM_UNITS,
    WATCHDOG_ON_PATH,
    WORKER_KIND,
)
from spark_ops.remote.programs.node import HOME
from spark_ops.sim import RANK_CHECK, RAYLET_CHECK, RAYLET_PORT_ENV
from spark_ops.watchdog.config import WatchdogConfigError, parse_config
from spark_ops.watchdog.loop import (
    LoopFacts,
    find_loop_watchdogs,
    other_engines,
    pick_loop,
    several_loops,
    split_loops,
    url_port,
    volatile_history,
)
from spark_ops.yamlsafe import load_yaml


def bare_cluster(nodes: list[NodeSpec], opts: InitOptions) -> Cluster:
    """An in-memory cluster to connect with (placeholders where init has not looked yet)."""
    ssh = _ssh_settings(opts)
    built = tuple(
        Node(n.name, n.host, n.port or ssh.port, opts.user, "head" if i == 0 else "worker")
        for i, n in enumerate(nodes)
    )
    return Cluster(
        name=opts.name,
        tensor_parallel=len(built),
        nodes=built,
        ssh=ssh,
        recipe=RecipeSettings("~/recipe.yaml", (built[0].name,)),
        watchdog=WatchdogSettings("true", "~/restarts"),
        engine=EngineSettings(),
        source="spark-ops init",
    )


def _ssh_settings(opts: InitOptions) -> SSHSettings:
    """SSH settings from the options."""
    return SSHSettings(
        user=opts.user,
        port=opts.port or 22,
        known_hosts=_local_path(opts.known_hosts) if opts.known_hosts else None,
        identity=tuple(_local_path(i) for i in opts.identity),
        connect_timeout=opts.connect_timeout,
    )


def _local_path(path: str) -> str:
    """A local file path made absolute, so that the inventory works from any directory."""
    import os

    return os.path.abspath(os.path.expanduser(path))


def _tilde(path: str, home: str) -> str:
    """Write a path under the remote home as ~/…"""
    home = home.rstrip("/")
    if home and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home) :]
    return path


class Discovery:
    """Looks around the head of a connected session and collects findings and inventory values."""

    def __init__(self, session: ClusterSession, opts: InitOptions) -> None:
        """Bind to a session whose nodes are connected (or have errors recorded)."""
        self.session = session
        self.opts = opts
        self.cluster = session.cluster
        self.head = self.cluster.head.name
        self.findings: list[Finding] = []
        self.values: dict[str, Any] = {}
        self.home = ""

    def found(self, key: str, value: Any, detail: str) -> None:
        """Record something found and the value to write."""
        self.values[key] = value
        self.findings.append(Finding(key, "found", value, detail))

    def missing(self, key: str, detail: str) -> None:
        """Record something not found (a TODO line)."""
        self.findings.append(Finding(key, "missing", None, detail))

    def warn(self, key: str, detail: str, value: Any = None) -> None:
        """Record a warning (written, but worth a look)."""
        self.findings.append(Finding(key, "warn", value, detail))

    async def sh(
        self, program: RemoteProgram[Result], *args: str, host: str | None = None
    ) -> tuple[bool, str]:
        """Run a read-only program on the head (or host); (exit 0, stdout)."""
        res = await self.session.call(host or self.head, program, *args)
        return res.ok, res.stdout

    async def exists(self, path: str, host: str | None = None, test: str = "-f") -> bool:
        """Whether a path exists on a node (`test -f` by default)."""
        return await self.session.call(host or self.head, TEST_PATH, test, path)

    async def run(self) -> None:
        """Look for everything, in order: recipe, watchdog, engine log, engine API."""
        out = await self.session.call(self.head, HOME)
        ok, out = out is not None, out or ""
        self.home = out.strip() if ok else ""
        config = await self.read_watchdog_config()
        loops = await find_loop_watchdogs(self.session, self.head)
        if loops:  # the recipe first: its port tells this cluster's loop from another's
            await self.find_recipe()
            if not await self._loop_watchdog(loops):  # each probes another engine
                await self.find_watchdog(config)
        else:
            await self.find_watchdog(config)
            await self.find_recipe()
        await self.find_engine_log(config)
        await self.find_engine_api()
        await self.find_worker_check()

    async def find_worker_check(self) -> None:
        """How the engine spans the nodes (the recipe's backend: Ray or ranks) and how to tell a
        worker's part runs: a `raylet` process, the sim's raylet port, or the sim's rank."""
        workers = [n.name for n in self.cluster.workers if n.name in self.session.connectors]
        backend = (self.values.get("recipe.args") or {}).get("--distributed-executor-backend")
        if backend == "mp":
            self.found(
                "engine.executor",
                "mp",
                "the recipe's --distributed-executor-backend mp: one rank per node without Ray",
            )
        if not workers:
            return
        answers = {
            h: (
                await self.sh(
                    WORKER_KIND, DEFAULT_WORKER_CHECK, RAYLET_PORT_ENV, RANK_CHECK, host=h
                )
            )[1].strip()
            for h in workers
        }
        if backend == "mp":
            if all(a == "sim-rank" for a in answers.values()):
                self.found(
                    "engine.worker_check",
                    RANK_CHECK,
                    "the embedded cluster's worker ranks: each keeps its pid in a file",
                )
            return  # no Ray worker to look for; the restart starts every rank
        if all(a == "sim" for a in answers.values()):
            self.found(
                "engine.worker_check",
                RAYLET_CHECK,
                "the embedded cluster's workers: their Ray worker is a port, not a process",
            )
            return
        down = sorted(h for h, a in answers.items() if a != "raylet")
        if down:
            self.warn(
                "engine.worker_check",
                f"no `raylet` process on {', '.join(down)} (Ray not running there?); kept the "
                f"default check `{DEFAULT_WORKER_CHECK}`: doctor will flag those nodes",
            )

    async def find_recipe(self) -> None:
        """--recipe or the watchdog's, else the one `vllm serve` recipe in the usual places."""
        named = self.values.pop("config:recipe.path", None)
        if self.opts.recipe or named:
            path = self.opts.recipe or named
            how = (
                "given with --recipe" if self.opts.recipe else f"action.recipe in {WATCHDOG_CONFIG}"
            )
            if await self.exists(path):
                await self._recipe_found(path, how)
            else:
                self.missing("recipe.path", f"{path} ({how}) does not exist on {self.head}")
            return
        out = (await self.session.call(self.head, FIND_RECIPES, *RECIPE_DIRS)).stdout
        candidates: list[tuple[str, Any]] = []
        for p in out.splitlines():
            path = _tilde(p.strip(), self.home)
            text = await self.session.read_file(self.head, path)
            if text is None:
                continue
            try:
                rendered = render_recipe(text, source=path)
                if rendered.is_vllm_serve():
                    candidates.append((path, rendered))
            except SparkOpsError:
                continue
        where = ", ".join(RECIPE_DIRS)
        if len(candidates) == 1:
            await self._recipe_found(candidates[0][0], f"the only vllm serve recipe under {where}")
            return
        if not candidates:
            self.missing(
                "recipe.path",
                f"no `vllm serve` recipe under {where} on {self.head}; pass --recipe PATH",
            )
            return
        served = await self._served_by_candidates(candidates)
        if len(served) == 1:
            await self._recipe_found(served[0], "the recipe whose model the running engine serves")
            return
        self.missing(
            "recipe.path",
            f"{len(candidates)} recipes found ({', '.join(c[0] for c in candidates[:6])}) and the "
            "running engine does not tell which; pass --recipe PATH",
        )

    async def _served_by_candidates(self, candidates: list[tuple[str, Any]]) -> list[str]:
        """The candidates whose served model name answers on their port on the head."""
        hits = []
        for path, rendered in candidates:
            try:
                args = rendered.args()
            except SparkOpsError:
                continue
            names = {str(args.get("--served-model-name") or rendered.model or "")}
            models = await self._models_at(_api_url(args))
            if names & set(models):
                hits.append(path)
        return hits

    async def _recipe_found(self, path: str, how: str) -> None:
        """Record the recipe, the nodes that hold a copy and its API settings."""
        holders = []
        for node in self.cluster.nodes:
            if node.name in self.session.connectors and await self.exists(path, node.name):
                holders.append(node.name)
        self.found("recipe.path", path, f"{how} (on {', '.join(holders)})")
        self.values["recipe.nodes"] = holders
        text = await self.session.read_file(self.head, path)
        try:
            args = render_recipe(text or "", source=path).args()
        except SparkOpsError:
            return
        self.values["recipe.args"] = args
        tp = args.get("--tensor-parallel-size")
        if isinstance(tp, str) and tp.isdigit():
            self.values["tensor_parallel"] = int(tp)
            if int(tp) != len(self.cluster.nodes):
                self.warn(
                    "tensor_parallel",
                    f"the recipe asks for --tensor-parallel-size {tp} but "
                    f"{len(self.cluster.nodes)} node(s) were given; one GPU per DGX Spark means "
                    "one node per rank",
                    int(tp),
                )

    async def read_watchdog_config(self) -> dict[str, Any] | None:
        """The reference watchdog's config on the head as {inventory key: value}; None if absent."""
        text = await self.session.read_file(self.head, WATCHDOG_CONFIG)
        if text is None:
            return None
        where = f"{self.head}:{WATCHDOG_CONFIG}"
        try:
            data = load_yaml(text, source=where, error=WatchdogConfigError)
        except WatchdogConfigError as exc:
            self.warn("watchdog", f"{exc.message}; its values were not read")
            return {}
        source = f"{self.home}/{WATCHDOG_CONFIG[2:]}" if self.home else WATCHDOG_CONFIG
        try:
            cfg = parse_config(data, source=source)
        except SparkOpsError as exc:
            self.warn("watchdog", f"{where} is not a valid spark-watchdog config: {exc.message}")
            return {}
        p = cfg.paths
        return {
            "watchdog.history_file": self._path(p.history),
            "watchdog.history_format": p.format,
            "watchdog.lock_file": self._path(p.lock),
            "watchdog.journal_file": self._path(p.journal),
            "watchdog.pause_file": self._path(p.pause),
            "watchdog.gave_up_file": self._path(p.gave_up),
            "watchdog.budget.max_restarts": cfg.budget.max,
            "watchdog.budget.window_s": int(cfg.budget.window),
            "watchdog.probe.interval_s": cfg.probe.interval,
            "watchdog.probe.timeout_s": cfg.probe.timeout,
            "watchdog.probe.failures": cfg.probe.failures,
            "engine.log.path": self._path(p.engine_log),
            "engine.pid_file": self._path(p.pid) if p.pid else None,
            "engine.api.url": cfg.engine.base_url,
            "recipe.path": self._path(cfg.action.recipe) if cfg.action.recipe else None,
            "engine.model": cfg.engine.model,
        }

    async def find_watchdog(self, config: dict[str, Any] | None) -> None:
        """Restart command, history, lock, journal, pause / gave-up files and budget: of the
        reference watchdog, else of a bash script (a loop that runs: `_loop_watchdog`)."""
        if config is not None:
            await self._reference_watchdog(config)
        else:
            await self._bash_watchdog()

    def _path(self, value: Any) -> str:
        """A path written as ~/… when under the remote home."""
        return _tilde(str(value), self.home)

    async def _reference_watchdog(self, cfg: dict[str, Any]) -> None:
        """The reference spark-watchdog: its config names every file."""
        ok, where = await self.sh(WATCHDOG_ON_PATH)
        base = f"spark-watchdog --config {WATCHDOG_CONFIG}"
        restart = f"{base} --restart-now --force --reason {{reason}} --by {{by}}"
        if ok:
            self.found(
                "watchdog.restart_command",
                restart,
                f"spark-watchdog at {where.strip()}, config {WATCHDOG_CONFIG}",
            )
        else:
            self.values["watchdog.restart_command"] = restart
            self.warn(
                "watchdog.restart_command",
                f"{WATCHDOG_CONFIG} exists but spark-watchdog is not on the head's PATH for "
                "SSH commands; use its absolute path",
                restart,
            )
        self.values["watchdog.status_command"] = f"{base} --status --json"
        self.values["watchdog.reports_stamp"] = True
        if not cfg:
            self.missing(
                "watchdog.history_file",
                f"{WATCHDOG_CONFIG} could not be read; set the history file the watchdog writes",
            )
            return
        for key in (
            "watchdog.history_file",
            "watchdog.lock_file",
            "watchdog.journal_file",
            "watchdog.pause_file",
            "watchdog.gave_up_file",
            "watchdog.budget.max_restarts",
            "watchdog.budget.window_s",
        ):
            self.found(key, cfg[key], f"from {WATCHDOG_CONFIG}")
        self.values["watchdog.history_format"] = cfg["watchdog.history_format"]
        for key in ("watchdog.probe.interval_s", "watchdog.probe.timeout_s"):
            self.values[key] = cfg[key]
        self.found(
            "watchdog.probe.failures",
            cfg["watchdog.probe.failures"],
            f"from {WATCHDOG_CONFIG}: a probe every {cfg['watchdog.probe.interval_s']:g} s, "
            f"timeout {cfg['watchdog.probe.timeout_s']:g} s (bench and experiment lease beyond it)",
        )
        if cfg.get("engine.pid_file"):
            self.found("engine.pid_file", cfg["engine.pid_file"], f"from {WATCHDOG_CONFIG}")
        for key in ("engine.log.path", "engine.api.url", "recipe.path", "engine.model"):
            if cfg.get(key):
                self.values[f"config:{key}"] = cfg[key]

    async def _loop_watchdog(self, loops: list[LoopFacts]) -> bool:
        """A watchdog that only loops, recognised from what runs on the head (its process, its
        script, its environment): every value it names. False when every loop there probes
        another engine's port (none is this cluster's: said, and nothing of theirs taken)."""
        args = self.values.get("recipe.args")  # not read: the engine's port is not known
        port = url_port(_api_url(args)) if args is not None else None
        mine, others = split_loops(loops, port)
        if others:
            self.warn("watchdog.kind", other_engines(others, port))
        facts = pick_loop(loops, port=port)
        if facts is None:
            return False
        if len(mine) > 1:
            self.warn("watchdog.kind", several_loops(mine, facts), "loop")
        where = f"{facts.script} (pid {facts.pid}, running on {self.head})"
        self.found("watchdog.kind", "loop", f"{where} only loops: it has no forced restart")
        if facts.restart_command:
            self.found(
                "watchdog.restart_command", facts.restart_command,
                f"the launcher's stop and start, as {facts.script} runs them",
            )  # fmt: skip
        else:
            self.missing(
                "watchdog.restart_command",
                f"{facts.script}'s restart was not read; write the launcher's stop and start",
            )
        if facts.history_file:
            self.found("watchdog.history_file", facts.history_file, f"the stamps {where} appends")
            self.values["watchdog.history_format"] = "stamps"
            reboot = await volatile_history(self.session, self.head, facts.history_file)
            if reboot:
                self.warn("watchdog.history_file", reboot, facts.history_file)
        for key, value in (
            ("watchdog.pause_file", facts.pause_file),
            ("watchdog.gave_up_file", facts.gave_up_file),
            ("watchdog.grace_s", facts.grace_s),
        ):
            if value is not None:
                self.found(key, value, f"from {facts.script}")
        self.values["watchdog.reports_stamp"] = False
        self.values["watchdog.history_locked"] = facts.history_locked
        if not facts.history_locked:
            self.warn("watchdog.history_locked", f"{facts.script} appends without a lock", False)
        self.values["watchdog.restarts_missing_engine"] = facts.restarts_missing_engine
        if not facts.restarts_missing_engine:
            self.warn(
                "watchdog.restarts_missing_engine",
                f"{facts.script} reads a missing engine as stopped on purpose: after a crash "
                "nothing restarts it (`spark-ops restart` does)",
                False,
            )
        if facts.max_restarts is not None and facts.window_s:
            self.found("watchdog.budget.max_restarts", facts.max_restarts, f"from {facts.script}")
            self.found("watchdog.budget.window_s", int(facts.window_s), f"from {facts.script}")
        return True

    async def _bash_watchdog(self) -> None:
        """A bash watchdog of the community kind: find the script and its stamps history."""
        script = None
        for path in BASH_WATCHDOGS:
            if await self.exists(path):
                script = path
                break
        if script is None:
            self.missing(
                "watchdog.restart_command",
                f"no {WATCHDOG_CONFIG} and no watchdog script at {', '.join(BASH_WATCHDOGS)}; "
                "write your watchdog's forced-restart command (docs/adopting-a-watchdog.md)",
            )
        else:
            ok = await self.session.call(self.head, HAS_RESTART_NOW, script)
            if ok:
                cmd = f"{script} --restart-now --force"
                self.found("watchdog.restart_command", cmd, f"{script} accepts --restart-now")
            else:
                self.missing(
                    "watchdog.restart_command",
                    f"{script} found but it has no --restart-now switch; write the command "
                    "that forces a restart through it (docs/adopting-a-watchdog.md)",
                )
        out = (await self.session.call(self.head, FIND_FILES, *HISTORY_GLOBS)).stdout
        found = [_tilde(p.strip(), self.home) for p in out.splitlines() if p.strip()]
        if len(found) == 1:
            self.found("watchdog.history_file", found[0], "the only restart history found")
            self.values["watchdog.history_format"] = "auto"
            parent = str(Path(found[0]).parent)
            for key, name in (
                ("watchdog.pause_file", "pause"),
                ("watchdog.gave_up_file", "gave-up"),
            ):
                if await self.exists(f"{parent}/{name}"):
                    self.found(key, f"{parent}/{name}", "present beside the history")
            if "watchdog.pause_file" not in self.values:
                self.warn(
                    "watchdog.pause_file",
                    "optional, not found beside the history: set watchdog.pause_file (and "
                    "gave_up_file) if your watchdog has them, so doctor and budget report them",
                )
        elif found:
            self.missing(
                "watchdog.history_file",
                f"several restart histories found ({', '.join(found)}); keep the right one",
            )
        else:
            self.missing(
                "watchdog.history_file",
                "no restart history found; set the file your watchdog writes stamps to",
            )

    async def find_engine_log(self, config: dict[str, Any] | None) -> None:
        """The engine log: the watchdog config's, a docker container, a systemd unit, or a file."""
        named = self.values.pop("config:engine.log.path", None)
        if named and await self.exists(named):
            self.found("engine.log", {"kind": "file", "path": named}, f"from {WATCHDOG_CONFIG}")
            return
        ok, out = await self.sh(DOCKER_NAMES)
        if ok and DOCKER_CONTAINER in out.split():
            self.found(
                "engine.log",
                {"kind": "docker", "container": DOCKER_CONTAINER},
                f"docker container {DOCKER_CONTAINER} is running",
            )
            return
        ok, out = await self.sh(VLLM_UNITS)
        units = [ln.split()[0] for ln in out.splitlines() if ln.strip()] if ok else []
        if len(units) == 1:
            self.found(
                "engine.log", {"kind": "journalctl", "unit": units[0]}, f"systemd unit {units[0]}"
            )
            return
        files = [p for p in LOG_FILES if await self.exists(p)]
        if len(files) == 1:
            self.found("engine.log", {"kind": "file", "path": files[0]}, "the only engine log file")
            return
        why = (
            f"several candidates ({', '.join(files + units)})"
            if files or units
            else (
                f"no container {DOCKER_CONTAINER}, no vllm* systemd unit, "
                f"none of {', '.join(LOG_FILES)}"
            )
        )
        self.missing("engine.log", f"engine log not identified: {why}; set engine.log")

    async def _models_at(self, url: str) -> list[str]:
        """Models served at a URL as seen from the head (through a tunnel); [] when no answer."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        try:
            local = await self.session.tunnel(
                self.head, parts.hostname or "127.0.0.1", parts.port or 80
            )
        except SparkOpsError:
            return []
        async with EngineAPI(f"{parts.scheme}://127.0.0.1:{local}", timeout=5) as api:
            return await api.models()

    async def find_engine_api(self) -> None:
        """The API URL from the recipe's --host/--port (or 8000), checked through a tunnel."""
        args = self.values.get("recipe.args") or {}
        url = self.values.pop("config:engine.api.url", None)
        if self.values.get("config:engine.model"):
            self.values["engine.model"] = self.values.pop("config:engine.model")
        from_where = f"engine.base_url in {WATCHDOG_CONFIG}"
        if not (isinstance(url, str) and url.startswith("http")):
            url = _api_url(args)
            from_where = "the recipe's --port" if "--port" in args else "vLLM's default port"
        models = await self._models_at(url)
        if models:
            self.found(
                "engine.api.url",
                url,
                f"{from_where}; answers through a tunnel to "
                f"{self.head}, serving {', '.join(models)}",
            )
            if len(models) == 1 and not self.values.get("engine.model"):
                # the name requests must carry is the one the engine serves (its
                # --served-model-name), not a launcher's model id (sparkrun's job records the
                # Hugging Face id): doctor's engine-model check asks for exactly this name
                self.values["engine.model"] = models[0]
        else:
            self.values["engine.api.url"] = url
            self.warn(
                "engine.api.url",
                f"{url} ({from_where}) did not answer /v1/models through a "
                f"tunnel to {self.head}; written anyway, check it",
                url,
            )


def _api_url(args: dict[str, Any]) -> str:
    """http://HOST:PORT from recipe flags (0.0.0.0 and unset mean loopback on the head)."""
    host = str(args.get("--host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    port = str(args.get("--port") or "8000")
    return f"http://{host}:{port}"
