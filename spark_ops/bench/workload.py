"""The sweep's workload: unique code-implementation prompts and the request bodies."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from spark_ops.errors import BenchError
from spark_ops.yamlsafe import load_yaml

APIS = ("chat", "completions")
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Prompt:
    """One prompt of the workload: a task in a language."""

    task: str
    language: str
    text: str


def _read_prompt_file(path: Path | None) -> tuple[str, str]:
    """Return (text, name) of the prompt file: the packaged one unless a path is given."""
    if path is None:
        ref = resources.files("spark_ops") / "data" / "prompts.yaml"
        return ref.read_text(encoding="utf-8"), "spark_ops/data/prompts.yaml"
    try:
        return Path(path).read_text(encoding="utf-8"), str(path)
    except OSError as exc:
        raise BenchError(f"{path}: cannot read the prompt file: {exc.strerror}") from exc


def load_prompts(path: Path | None = None) -> list[Prompt]:
    """Expand the prompt file (template x tasks x languages) into unique prompts, task-major."""
    text, name = _read_prompt_file(path)
    data = load_yaml(text, source=name, error=BenchError)
    if not isinstance(data, dict):
        raise BenchError(f"{name}: expected a mapping with keys template, languages, tasks")
    template = data.get("template")
    languages = data.get("languages")
    tasks = data.get("tasks")
    if not isinstance(template, str) or "{title}" not in template:
        raise BenchError(f"{name}: key 'template' must be a string containing {{title}}")
    if not isinstance(languages, list) or not all(isinstance(x, str) for x in languages):
        raise BenchError(f"{name}: key 'languages' must be a list of strings")
    if not isinstance(tasks, list) or not tasks:
        raise BenchError(f"{name}: key 'tasks' must be a non-empty list")
    prompts: list[Prompt] = []
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not all(
            isinstance(task.get(k), str) for k in ("id", "title", "detail")
        ):
            raise BenchError(f"{name}: tasks[{i}] needs string keys id, title and detail")
        for language in languages:
            try:
                body = template.format(
                    title=task["title"], detail=task["detail"], language=language
                )
            except (KeyError, IndexError, AttributeError, ValueError) as exc:
                raise BenchError(
                    f"{name}: key 'template' cannot be filled ({type(exc).__name__}: {exc}); "
                    "allowed placeholders: {title}, {detail}, {language}, and {{ }} for a brace"
                ) from exc
            prompts.append(Prompt(task=task["id"], language=language, text=body.strip()))
    seen: set[str] = set()
    for p in prompts:
        if p.text in seen:
            raise BenchError(f"{name}: duplicate prompt for task {p.task!r} in {p.language}")
        seen.add(p.text)
    return prompts


def build_payload(
    prompt: Prompt,
    *,
    model: str,
    api: str = "chat",
    output_tokens: int = 300,
    temperature: float = 0.0,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """Build a streaming request body (chat or completions) asking for exactly output_tokens."""
    if api not in APIS:
        raise BenchError(f"api {api!r} is not supported; allowed: {', '.join(APIS)}")
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": output_tokens,
        "temperature": temperature,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body
