"""What spark-ops speaks with the cluster's watchdog, whichever it is.

contract (force a restart over SSH, find its stamp, prune it, the watchdog's own status), history
(the restart history's formats, budget and exact-line prune; sent to the head), identify (which
entry a forced restart wrote), lease (the pause file a planned disruption holds), loop (a watchdog
that only loops), policy (systemd / Docker restart policies as a budget) and config (the reference
watchdog's config format, which spark-ops reads to check the inventory). The reference watchdog
itself, a program of its own, is the refwatchdog package beside spark_ops.
"""
