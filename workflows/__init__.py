"""Temporal workflow definitions of TurnKit (deterministic code only): ``ConversationWorkflow`` (the lane,
:mod:`.lane`) and ``TurnWorkflow`` (one turn, :mod:`.turn`); :mod:`.registry` lists them for a worker. They import
:mod:`turnkit.kernel` and nothing else of TurnKit."""
