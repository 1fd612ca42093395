"""Programs that read the node itself: the account's home, its memory, whether sudo asks nothing."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, result, stdout_if_ok

# The account's home on the node, as its shell expands $HOME (None when the shell fails)
HOME = RemoteProgram("home", 'printf "%s" "$HOME"', (), stdout_if_ok)

# /proc/meminfo as the kernel shows it
MEMINFO = RemoteProgram("meminfo", "cat /proc/meminfo", (), result)

# exit 0 when sudo runs without asking for a password
SUDO_OK = RemoteProgram("sudo without password", "sudo -n true", (), result)
