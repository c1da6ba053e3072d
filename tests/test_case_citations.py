"""Every acceptance case of the gem (T01 to T106, docs/behaviour.md §10) is cited by the docstring of a test that
checks it, or listed in §10's table of cases this port does not run, with the reason: a case cannot silently drop out
of the suite when a test is renamed, rewritten or deleted."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {f"T{number:02d}" for number in range(1, 107)}
_CASE = re.compile(r"\bT\d{2,3}\b")
#: §10's table of cases not run here: a row per case, `| T101 | why |`.
_NOT_RUN_ROW = re.compile(r"^\| (T\d{2,3}) \| (.+?) \|$", re.MULTILINE)


def _cited_by_tests() -> dict[str, list[str]]:
    """Each case id, and the tests whose docstrings cite it."""
    cited: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                for case in _CASE.findall(ast.get_docstring(node) or ""):
                    cited.setdefault(case, []).append(f"{path.name}::{node.name}")
    return cited


def _not_run() -> dict[str, str]:
    """The cases §10 says this port does not run, and why."""
    text = (ROOT / "docs" / "behaviour.md").read_text()
    section = text[text.index("## §10 Acceptance cases") :]
    return {case: why.strip() for case, why in _NOT_RUN_ROW.findall(section)}


def test_every_acceptance_case_is_cited_by_a_test_or_listed_as_not_run() -> None:
    """T01 to T106: each in a test's docstring or in §10's list with a reason; none in both, and no other id."""
    cited = _cited_by_tests()
    not_run = _not_run()
    assert not_run, "docs/behaviour.md §10 lists no case as not run: its table is missing or malformed"
    missing = sorted(CASES - cited.keys() - not_run.keys())
    assert not missing, f"acceptance cases no test docstring cites and §10 does not list: {missing}"
    both = {case: cited[case] for case in sorted(not_run.keys() & cited.keys())}
    assert not both, f"cases listed as not run that tests cite: {both}"
    unknown = sorted((cited.keys() | not_run.keys()) - CASES)
    assert not unknown, f"ids that are no acceptance case (T01 to T106): {unknown}"
    assert all(len(why) > 20 for why in not_run.values()), not_run
