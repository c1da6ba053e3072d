"""Parsing our sources in tests, proof against a parser bug of CPython 3.11."""

from __future__ import annotations

import ast
import gc


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` with the garbage collector held off. On CPython 3.11 a collection during ``ast.parse``
    can finalize an object whose error is reported through ``traceback``, which parses too and leaves the outer parse
    failing with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text, filename)
    finally:
        if enabled:
            gc.enable()
