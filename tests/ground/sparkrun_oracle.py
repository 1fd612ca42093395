"""Run inside sparkrun's own venv: load recipe files with sparkrun's loader, print commands.

Usage: <sparkrun venv>/bin/python sparkrun_oracle.py FILE... -> JSON list, one entry a file:
{"path", "runtime", "command", "env"} or {"path", "error"}. Also "--flag-maps" prints sparkrun's
vLLM and SGLang flag maps. Run offline (tests/ground/sparkrun.py sets that up).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    """Load each file, generate its solo serve command with the runtime sparkrun resolves."""
    from sparkrun.core.bootstrap import get_runtime, init_sparkrun
    from sparkrun.core.recipe import Recipe

    if argv[:1] == ["--flag-maps"]:
        from sparkrun.runtimes import _vllm_common, sglang

        print(
            json.dumps(
                {
                    "vllm": _vllm_common.VLLM_FLAG_MAP,
                    "vllm_bool": sorted(_vllm_common.VLLM_BOOL_FLAGS),
                    "vllm_negatable": sorted(_vllm_common.VLLM_NEGATABLE_BOOL_FLAGS),
                    "sglang": sglang._SGLANG_FLAG_MAP,
                }
            )
        )
        return 0
    init_sparkrun()
    out: list[dict[str, object]] = []
    for path in argv:
        try:
            recipe = Recipe.load(path, offline=True)
            runtime = get_runtime(recipe.runtime)
            command = runtime.generate_command(recipe, {}, is_cluster=False, num_nodes=1)
            out.append(
                {"path": path, "runtime": recipe.runtime, "command": command, "env": recipe.env}
            )
        except Exception as exc:  # reported to the test, which asserts on it
            out.append({"path": path, "error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
