"""TurnKit's kernel: everything workflow code needs, and nothing that does I/O.

Payload types, records and turn state, the names of TurnKit's workflows, updates, signals and activities, error names,
the constants workflows decide by, and the metrics they record. TurnKit's own workflows import this package and
nothing else of TurnKit, and so may a team's workflows (through :mod:`turnkit.workflow`): importing it loads pydantic
and temporalio, never SQLAlchemy, a database driver, a provider SDK, an activity or a client module
(``tests/test_layers.py`` checks it in a fresh interpreter). The worker's sandbox passes it through, so it is imported
once per process.
"""
