"""The operator's and debugger's verbs behind ``turnkit`` (private): ``ask``, ``show``, ``events``, ``check``,
``repair``, ``db``, and the tree and timeline views they print. Applications reach them through :mod:`turnkit.cli`
or :class:`turnkit.TurnKit` (``check``, ``repair``)."""
