"""The simulated nodes' `nvidia-smi`: one NVIDIA GB10 per node, answering as a DGX Spark does.

The embedded cluster simulates DGX Spark nodes (vLLM, the raylet, meminfo); this is their GPU
tool, on each node's PATH, so that programs that probe the hardware over SSH (sparkrun's
placement probe) see what a GB10 reports. It answers the `--query-gpu` form only:

- `name` is `NVIDIA GB10`, `driver_version` 580.95.05, `compute_cap` 12.1, `count` 1, `index` 0;
- the memory columns (`memory.total`, `memory.used`, `memory.free`) are `[N/A]`: GB10's memory is
  unified with the host's, so `nvidia-smi` has no figure (free memory is /proc/meminfo's);
- `utilization.gpu` is 0 %, `temperature.gpu` 40, `power.draw` 5.00 W; any other field is
  `[Not Supported]`.

`--format=csv` prints a header line unless `noheader` is given; `nounits` drops the units. Any
other use (no `--query-gpu`, `-L`, a bare call) prints the one-line device list of `-L`.
`--query-compute-apps=FIELDS` lists no process (the simulated engine is no GPU process: only the
header, unless `noheader`). An unknown option is refused with exit status 2 naming it. `sim up`
installs it in every node's `~/bin` (`install`), so README's `spark-ops exec -- nvidia-smi -L`
answers on the embedded cluster; spark-ops' own post-boot check reads `--query-compute-apps`
(and skips a node without the tool).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "NVIDIA GB10"
UUID = "GPU-5f1e0d6c-0b10-4b10-8b10-0000000000b1"
#: field -> (value, unit appended unless nounits); None: unified memory, no figure
FIELDS: dict[str, tuple[str | None, str]] = {
    "name": (NAME, ""),
    "driver_version": ("580.95.05", ""),
    "compute_cap": ("12.1", ""),
    "count": ("1", ""),
    "index": ("0", ""),
    "uuid": (UUID, ""),
    "memory.total": (None, ""),
    "memory.used": (None, ""),
    "memory.free": (None, ""),
    "utilization.gpu": ("0", " %"),
    "temperature.gpu": ("40", ""),
    "power.draw": ("5.00", " W"),
}
HEADERS = {"memory.total": "memory.total [MiB]", "utilization.gpu": "utilization.gpu [%]"}


def query(fields: list[str], fmt: set[str]) -> str:
    """The CSV answer to `--query-gpu=FIELDS --format=FMT` for the node's one GB10."""
    values = []
    for field in fields:
        value, unit = FIELDS.get(field, ("[Not Supported]", ""))
        if value is None:
            values.append("[N/A]")
        else:
            values.append(value + ("" if "nounits" in fmt else unit))
    lines = [] if "noheader" in fmt else [", ".join(HEADERS.get(f, f) for f in fields)]
    return "\n".join([*lines, ", ".join(values)]) + "\n"


def install(bin_dir: Path) -> Path:
    """Put `nvidia-smi` (this module, run by this Python) in a node's bin directory."""
    path = bin_dir / "nvidia-smi"
    path.write_text(  # PYTHONSAFEPATH: nothing imported from the node's home (`-m` would)
        f'#!/bin/sh\nPYTHONSAFEPATH=1 exec {sys.executable} -m spark_ops.sim.nvidia_smi "$@"\n'
    )
    path.chmod(0o755)
    return path


def main(argv: list[str] | None = None) -> int:
    """`nvidia-smi [--query-gpu=F,… --format=csv[,noheader][,nounits]] | -L`."""
    args = sys.argv[1:] if argv is None else argv
    fields: list[str] = []
    apps: list[str] = []
    fmt: set[str] = set()
    for arg in args:
        if arg.startswith("--query-compute-apps="):
            apps = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--query-gpu="):
            fields = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--format="):
            fmt = {f.strip() for f in arg.split("=", 1)[1].split(",")}
        elif arg not in ("-L", "--list-gpus"):
            sys.stderr.write(f"Invalid combination of input arguments: {arg!r}\n")
            return 2
    if apps or fields:
        if "csv" not in fmt:
            sys.stderr.write("--query-gpu/--query-compute-apps needs --format=csv\n")
            return 2
        if apps:  # no compute process on the simulated GPU
            sys.stdout.write("" if "noheader" in fmt else ", ".join(apps) + "\n")
        else:
            sys.stdout.write(query(fields, fmt))
    else:
        sys.stdout.write(f"GPU 0: {NAME} (UUID: {UUID})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
