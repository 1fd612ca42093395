"""`python -m refwatchdog`: the reference watchdog's command line, as `spark-watchdog`."""

from __future__ import annotations

from refwatchdog.daemon import main

if __name__ == "__main__":
    main()
