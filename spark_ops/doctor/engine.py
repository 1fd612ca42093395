"""Doctor checks of what is served: the recipe on its nodes, the engine's log and its API."""

from __future__ import annotations

import time
from typing import Any

from spark_ops.doctor.report import Checker, parse_kv
from spark_ops.engine.identity import EngineReading, read_engine
from spark_ops.engine.instance import stop_hint
from spark_ops.engine.ranks import ambiguous_hint, ambiguous_words, rank_warning, rank_words
from spark_ops.errors import RecipeError, SparkOpsError
from spark_ops.recipe import load_recipe_text, render_recipe, unified_diff
from spark_ops.remote.programs.doctor import CONTAINER_STATUS, LOG_FILE_READABLE, UNIT_EXISTS
from spark_ops.remote.shell import REPLACEABLE
from spark_ops.workflows.operation import Operation


class EngineChecks(Checker):
    """The recipe (present, parseable, identical), the engine log source and the engine's API."""

    async def check_recipe(self) -> str | None:
        """The recipe on every node that holds it: present, parseable, renderable, identical."""
        rs = self.cluster.recipe
        texts: dict[str, str] = {}
        for host in rs.nodes:
            if not self.up(host):
                continue
            source = f"{host}:{rs.path}"
            try:
                text = await self.session.read_file(host, rs.path, sudo=True)
            except SparkOpsError as exc:
                self.report.add(
                    "recipe",
                    host,
                    "fail",
                    f"cannot read {rs.path}: {exc.message}",
                    "check the file's permissions, or set sudo: true for the node",
                )
                continue
            if text is None:
                self.report.add(
                    "recipe",
                    host,
                    "fail",
                    f"{rs.path} not found",
                    f"copy the recipe to {host}:{rs.path}, or fix recipe.path / recipe.nodes "
                    "in the inventory (spark-ops init finds it for you)",
                )
                continue
            try:
                load_recipe_text(text, source=source)
                rendered = render_recipe(text, source=source)
                args = rendered.args()
            except RecipeError as exc:
                self.report.add(
                    "recipe",
                    host,
                    "fail",
                    exc.message,
                    exc.hint or f"fix the recipe at {source} (see the message)",
                )
                continue
            texts[host] = text
            seqs = args.get("--max-num-seqs", "default")
            self.report.add(
                "recipe",
                host,
                "ok",
                f"{rs.path} parses; model {rendered.model or '?'}, --max-num-seqs {seqs}",
            )
            await self._check_recipe_writable(host)
        if len(texts) > 1:
            first = next(iter(texts))
            differ = [h for h, t in texts.items() if t != texts[first]]
            if differ:
                diff = unified_diff(texts[first], texts[differ[0]], f"{differ[0]}:{rs.path}")
                lines = [
                    ln
                    for ln in diff.splitlines()
                    if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))
                ]
                self.report.add(
                    "recipe-same",
                    ",".join(texts),
                    "fail",
                    f"the copy on {', '.join(differ)} differs from {first}: "
                    + " | ".join(lines[:4]),
                    f"make the copies agree (e.g. copy {first}:{rs.path} to {', '.join(differ)}), "
                    "or run apply with --force to overwrite them all",
                )
            else:
                self.report.add(
                    "recipe-same", ",".join(texts), "ok", f"identical on {len(texts)} nodes"
                )
        return texts.get(self.head) or next(iter(texts.values()), None)

    async def _check_recipe_writable(self, host: str) -> None:
        """The recipe replaceable the way the atomic writer does it, as the SSH user of host:
        a temp file created beside its target (a symlink's end), renamed over it."""
        rs = self.cluster.recipe
        res = await self.session.call(host, REPLACEABLE, rs.path, sudo=True)
        kv = parse_kv(res.stdout)
        target = kv.get("target", rs.path)
        where = (target.rsplit("/", 1)[0] or "/") if "/" in target else "."
        user = self.cluster.node(host).user or "the SSH user"
        problems = []
        state = kv.get("dir", "unknown")
        if state != "writable":
            problems.append(
                f"its directory {where} is {state.replace('-', ' ')} for {user} (the new recipe "
                "is written to a temp file there, then renamed over the old one)"
            )
        if kv.get("file") == "not-readable":
            problems.append(f"{target} is not readable by {user}")
        if "flags" in kv:
            flags, _, path = kv["flags"].partition(" ")
            problems.append(f"{path} is immutable or append-only (lsattr {flags}): no rename")
        if not problems:
            self.report.add(
                "recipe-writable", host, "ok", f"{rs.path} replaceable ({where} writable)"
            )
            return
        self.report.add(
            "recipe-writable",
            host,
            "fail",
            f"{host}:{rs.path}: " + "; ".join(problems),
            f"on {host}: let {user} write {where} (chown/chmod; `chattr -i` on an immutable "
            "file or directory; remount a read-only file system), or set sudo: true for "
            f"{host} in the inventory",
        )

    async def check_engine(self) -> None:
        """The engine's API: reachable (directly or by tunnel), version, model, a completion."""
        if not self.up(self.head) and self.cluster.engine.tunnel:
            return
        eng = self.cluster.engine
        op = Operation(self.session, "doctor")
        how = "through an SSH tunnel to the head" if eng.tunnel else "directly"
        try:
            await op.api_url()
        except SparkOpsError as exc:
            self.report.add(
                "engine-api",
                self.head,
                "fail",
                f"{eng.api_url} {how}: {exc.message}",
                "check engine.api.url; the head's sshd must allow TCP forwarding",
            )
            return
        fix = (
            f"check the engine on the head (spark-ops status; its log: {eng.log_kind} "
            f"{eng.log_target}) and engine.api.url ({eng.api_url}) in the inventory"
        )
        async with op.engine(timeout=min(eng.probe_timeout_s, 10.0)) as api:
            if not await api.health():
                self.report.add(
                    "engine-api",
                    self.head,
                    "fail",
                    f"{eng.api_url} ({how}) does not answer /health",
                    fix,
                )
                return
            version = await api.version()
            models = await api.models()
            self.report.add(
                "engine-api",
                self.head,
                "ok",
                f"{eng.api_url} ({how}): vLLM {version or '?'}, "
                f"serving {', '.join(models) or 'no model'}",
            )
            if eng.model and eng.model not in models:
                self.report.add(
                    "engine-model",
                    self.head,
                    "fail",
                    f"engine.model {eng.model!r} is not served (served: {models})",
                    "set engine.model to one of the served names, or remove it",
                )
            probe = await api.probe_serving(eng.probe_timeout_s)
        if probe.ok:
            self.report.add("engine-completion", self.head, "ok", probe.describe())
        else:
            self.report.add(
                "engine-completion",
                self.head,
                "fail",
                probe.describe() + (" (a Ray worker lost, NCCL hung)" if probe.timed_out else ""),
                "see docs/troubleshooting.md, 'The engine answers /health but nothing else "
                '("wedged")\'; a restart is needed before apply can prove its own: '
                "spark-ops restart",
            )

    async def check_engine_log(self) -> None:
        """The engine's log source exists, so apply can follow the boot."""
        if not self.up(self.head):
            return
        eng = self.cluster.engine
        if eng.log_kind == "file":
            program, what = LOG_FILE_READABLE, f"log file {eng.log_target}"
            fix = "set engine.log.path to the file the engine writes (or kind: docker / journalctl)"
        elif eng.log_kind == "docker":
            program = CONTAINER_STATUS
            what, fix = (
                f"container {eng.log_target}",
                "set engine.log.container to the engine's container",
            )
        elif eng.log_kind == "journalctl":
            program = UNIT_EXISTS
            what, fix = f"systemd unit {eng.log_target}", "set engine.log.unit to the engine's unit"
        else:
            self.report.add("engine-log", self.head, "ok", f"log command: {eng.log_target}")
            return
        res = await self.session.call(self.head, program, eng.log_target, sudo=True)
        if res.ok:
            self.report.add("engine-log", self.head, "ok", f"{what} readable")
        else:
            self.report.add(
                "engine-log",
                self.head,
                "fail",
                f"{what} not readable: {res.stderr.strip()[-200:] or 'absent'}",
                fix,
            )

    async def check_engine_leftovers(self) -> None:
        """No process left by a dead engine (a killed boot's EngineCore, workers); other engine
        processes on the head are named as a warning; an engine run as ranks: no worker runs a
        rank of an earlier engine (the plan refuses a restart then, naming the same). One
        reading of the engine serves both (engine.identity.read_engine), as in the plan."""
        if not self.up(self.head):
            return
        reading = await read_engine(self.session, self.cluster)
        self._head_leftovers(reading)
        self._rank_leftovers(reading)

    def _rank_leftovers(self, reading: EngineReading) -> None:
        """One engine-leftovers check per worker of an engine run as ranks (ranks without Ray)."""
        if self.cluster.engine.executor != "mp":
            return
        try:
            found = reading.rank_leftovers()
        except SparkOpsError as exc:
            for worker in self.cluster.workers:
                self.report.add(
                    "engine-leftovers", worker.name, "warn", f"not checked: {exc.message}"
                )
            return
        for host, procs in found.nodes.items():
            if isinstance(procs, str):
                self.report.add("engine-leftovers", host, "warn", f"not checked: {procs}")
            elif procs and not found.engine_running:
                self.report.add(
                    "engine-leftovers", host, "warn", rank_warning(host, procs),
                    "start the engine (spark-ops restart), or stop the rank first",
                )  # fmt: skip
            elif procs:
                self.report.add(
                    "engine-leftovers", host, "fail",
                    f"{rank_words(host, procs)}; it outlived the engine's last restart and holds "
                    "its share of the node's memory: the next boot's rank there would find less "
                    "free than it asks",
                    f"stop it on {host}: {stop_hint(procs)}",
                )  # fmt: skip
            if host in found.ambiguous:
                self.report.add(
                    "engine-leftovers", host, "fail",
                    ambiguous_words(host, found.ambiguous[host]),
                    ambiguous_hint(host, found.ambiguous[host]),
                )  # fmt: skip
            elif not procs:
                self.report.add("engine-leftovers", host, "ok", "no rank of an earlier engine")

    def _head_leftovers(self, reading: EngineReading) -> None:
        """The head: no process left by a dead engine; other engine processes named."""
        try:
            instance, own, others = reading.leftovers()
        except SparkOpsError as exc:
            self.report.add("engine-leftovers", self.head, "warn", f"not checked: {exc.message}")
            return

        def names(procs: list[Any]) -> str:
            """`12 (VLLM::EngineCore) since 09:01:02, …`."""
            return ", ".join(
                f"{p.label()} since {time.strftime('%H:%M:%S', time.localtime(p.started_at))}"
                for p in procs
            )

        if own and instance is not None:
            self.report.add(
                "engine-leftovers", self.head, "fail",
                f"the engine ({instance.label()}) is dead, its processes still run: {names(own)}",
                f"they hold memory (GPU memory on a real node) into the next boot: "
                f"{stop_hint(own)}",
            )  # fmt: skip
        elif others:
            self.report.add(
                "engine-leftovers", self.head, "warn",
                f"engine processes outside the running engine: {names(others)}",
                "if they are not this cluster's engine, stop them before the next boot",
            )  # fmt: skip
        else:
            engine = (
                f"; the engine: {instance.engine.label()}" if instance and instance.engine else ""
            )
            self.report.add(
                "engine-leftovers", self.head, "ok", f"no engine process left over{engine}"
            )
