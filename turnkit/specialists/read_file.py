"""``read_file``: the oracle's default tool, reading text files confined to one directory (behaviour §1.8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from turnkit.kernel.errors import ToolError
from turnkit.specialists.read_only import ReadOnlyTool
from turnkit.tools import ToolContext

__all__ = ["DEFAULT_MAX_BYTES", "ReadFileTool"]

#: The default cap on the bytes one ``read_file`` call returns.
DEFAULT_MAX_BYTES = 100_000


class ReadFileTool(ReadOnlyTool):
    """Read a file under ``root``; neither ``..`` nor a symlink can reach outside it, and at most ``max_bytes`` are
    returned (``truncated`` says when the file is longer)."""

    name = "read_file"
    description = "Read a text file from the project (paths are relative to its root)."
    usage_hint = "Use when an answer depends on what a file says."

    class Arguments(BaseModel):
        path: str = Field(description="The file's path, relative to the project root.")

    def __init__(self, root: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        """Confine reads to ``root`` (resolved now, symlinks included).

        Raises:
            ValueError: ``root`` is not a directory, or ``max_bytes`` is not a positive integer.
        """
        resolved = Path(root).resolve()
        if not resolved.is_dir():
            raise ValueError(f"read_file root is not a directory: {root}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError("max_bytes must be a positive integer")
        self.root = resolved
        self.max_bytes = max_bytes

    def call(self, context: ToolContext, *, path: str) -> dict[str, Any]:
        """Return ``{path, content, bytes, truncated}``.

        Raises:
            ToolError: The path leaves the root, does not exist or is not a file.
        """
        # resolve() follows symlinks and folds "..", so the check sees where the read would really go.
        target = (self.root / path).resolve()
        if not target.is_relative_to(self.root):
            raise ToolError(f"path is outside the root: {path}")
        if not target.is_file():
            raise ToolError(f"no such file: {path}")
        with target.open("rb") as handle:
            data = handle.read(self.max_bytes + 1)
        return {
            "path": target.relative_to(self.root).as_posix(),
            "content": data[: self.max_bytes].decode("utf-8", errors="replace"),
            "bytes": min(len(data), self.max_bytes),
            "truncated": len(data) > self.max_bytes,
        }
