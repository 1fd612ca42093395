"""The reference watchdog (`spark-watchdog`): a program of its own, run on the head by itself.

It probes the vLLM engine, restarts it within a budget (its actions: recipe, launcher, systemd,
docker, command, sparkrun) and stands down when the budget is spent. It speaks the contract
spark-ops speaks with any watchdog, and so imports from spark_ops only that contract's pieces and
the foundation: the config format (spark_ops/watchdog/config.py, which spark-ops reads too), the
history format (history.py), the lease (lease.py), headlib, files, the recipe renderer, errors,
log, account and yamlsafe (tests/test_house.py lists them). Nothing in spark_ops imports this
package: the embedded cluster (spark_ops/sim/) starts it as a process, by module name.
"""
