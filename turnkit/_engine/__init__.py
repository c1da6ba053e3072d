"""TurnKit's engine (private): the services a turn uses, called by the activities and the client API.

Store transactions of the turn's steps, budgets and charges, deliveries and waits, controls, authorization, prompts,
compaction and media. Nothing here is application API: applications import from :mod:`turnkit`.
"""
