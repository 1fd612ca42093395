"""Looking around the head of a connected session: recipe, watchdog, engine log and API."""

from __future__ import annotations

from typing import Any

from spark_ops.discover.head import api_url, tilde
from spark_ops.discover.options import (
    DOCKER_CONTAINER,
    LOG_FILES,
    RECIPE_DIRS,
    WATCHDOG_CONFIG,
    InitOptions,
    NodeSpec,
)
from spark_ops.discover.watchdog import WatchdogProbe
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
from spark_ops.remote.programs.discover import DOCKER_NAMES, FIND_RECIPES, VLLM_UNITS, WORKER_KIND
from spark_ops.remote.programs.node import HOME
from spark_ops.sim import RANK_CHECK, RAYLET_CHECK, RAYLET_PORT_ENV
from spark_ops.watchdog.loop import find_loop_watchdogs


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


class Discovery(WatchdogProbe):
    """Looks around the head of a connected session and collects findings and inventory values."""

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
            path = tilde(p.strip(), self.home)
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
            models = await self._models_at(api_url(args))
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
            url = api_url(args)
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
