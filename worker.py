"""Run a TurnKit worker from a source checkout: ``python worker.py --app myapp.agents``.

The same program as ``turnkit worker`` (:mod:`turnkit._temporal.worker`, where its options are described). This file
is the design card's entry point; it is not installed: an installed TurnKit puts only ``turnkit`` on the import path.
"""

from turnkit._temporal.worker import main

if __name__ == "__main__":
    main()
