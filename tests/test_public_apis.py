"""TurnKit uses only the public APIs of SQLAlchemy, asyncpg and aiosqlite (issue 37, item 6).

A private name of theirs can change in any release, a patch release included, without a word in the changelog; a
public one is what their version ranges in ``pyproject.toml`` promise. This reads the source of ``turnkit/``,
``workflows/`` and ``activities/`` (no import of it) and fails on:

1. **An import of a private module or name** from those packages: a module or a name that starts with ``_`` (a
   dunder excepted), a name missing from its module's ``__all__`` when the module has one, and the modules those
   projects keep for themselves (:data:`INTERNAL_MODULES`: SQLAlchemy's DBAPI adapters and utilities, aiosqlite's
   submodules, asyncpg's protocol). SQLAlchemy's adapter classes (``AsyncAdapt_*``) are flagged wherever they are
   named.
2. **An attribute ``x._name``**, or a ``getattr``/``setattr``/``hasattr``/``delattr`` of ``"_name"``, in a module
   that imports one of those packages, unless ``_name`` is TurnKit's own:

   - on ``self`` or ``cls`` in a class of TurnKit's, a name that class defines (or, in a class with no base from those
     packages, any name TurnKit defines);
   - on any other object, a name TurnKit defines (a ``def``/``class``, an assignment, an attribute assigned, a
     ``__slots__`` entry) that none of those packages uses as a private name of its own (:func:`foreign_private_names`
     reads their source); a name both use is TurnKit's only when listed in :data:`TURNKIT_OWN` (none is, today).

   Also flagged anywhere in TurnKit's code: ``x._name`` when ``_name`` is a private name of those packages that
   TurnKit never defines. :data:`PUBLIC_UNDERSCORE` lists the names SQLAlchemy documents as public despite their
   underscore (``Row._mapping``...).
3. **A class of TurnKit's that subclasses one of theirs** and defines or overrides a private name of its base (a
   method, an attribute assigned on ``self``): a name-mangled ``__name`` is the only private name such a class may
   keep for itself.
4. **A ``# pyright: ignore`` that names ``reportPrivateUsage``, or names no rule at all**, in a module that imports
   one of those packages: pyright's own check of private names (strict mode) is the other half of this test, for
   every access whose type it knows.

``test_the_scan_finds_what_it_is_for`` shows each rule flagging a sample, including every private use that issue 37
found in TurnKit (the code before its fix fails this test).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

from tests.sources import parse

ROOT = Path(__file__).resolve().parent.parent
#: TurnKit's code (``turnkit/_workflows`` and ``turnkit/_activities`` are links to the last two).
SCANNED = ("turnkit", "workflows", "activities")
PACKAGES = ("sqlalchemy", "asyncpg", "aiosqlite")

#: Modules of those packages that are theirs alone, whatever the names in them (a prefix matches its submodules).
INTERNAL_MODULES = (
    "sqlalchemy.connectors",  # the asyncio DBAPI adapters (AsyncAdapt_*)
    "sqlalchemy.dialects.postgresql.asyncpg",  # the asyncpg adapter (the dialect is reached through the URL)
    "sqlalchemy.dialects.sqlite.aiosqlite",  # the aiosqlite adapter
    "sqlalchemy.testing",
    "sqlalchemy.util",
    "aiosqlite.",  # aiosqlite's public API is its package's __all__ (aiosqlite.core, .context, .cursor are not)
    "asyncpg.protocol",
    "asyncpg.pgproto",
    "asyncpg.connect_utils",
    "asyncpg.introspection",
)

#: Names SQLAlchemy documents as public although they start with ``_`` (``Row``'s named-tuple-like methods).
PUBLIC_UNDERSCORE = frozenset({"_mapping", "_asdict", "_fields", "_t", "_tuple"})

#: TurnKit's own private names that those packages also use privately, and that TurnKit reads on objects other than
#: ``self`` (which the scan cannot tell from theirs). Each needs a reason here; there is none today.
TURNKIT_OWN: frozenset[str] = frozenset()

_IGNORE = re.compile(r"#\s*pyright:\s*ignore(\[(?P<rules>[^\]]*)\])?")


def _private(name: str) -> bool:
    """``_name`` or ``__name``, not ``__dunder__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _mangled(name: str) -> bool:
    return name.startswith("__") and not name.endswith("__")


def _of_packages(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


@cache
def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _check_import(module: str, name: str | None) -> str | None:
    """Why importing ``name`` from ``module`` (or the module itself, ``name`` None) is private, or None."""
    if any(_private(part) for part in module.split(".")):
        return f"private module {module}"
    if any(module.startswith(internal if internal.endswith(".") else internal + ".") for internal in INTERNAL_MODULES):
        return f"internal module {module}"
    if module in INTERNAL_MODULES:
        return f"internal module {module}"
    if name is None:
        return None
    if _private(name):
        return f"private name {module}.{name}"
    if name.startswith("AsyncAdapt"):
        return f"SQLAlchemy's DBAPI adapter {module}.{name}"
    public = getattr(_module(module), "__all__", None)
    if public is not None and name not in public:
        if _module(f"{module}.{name}") is None:
            return f"{module}.{name} is not in {module}.__all__"
        return _check_import(f"{module}.{name}", None)  # a submodule: as if imported itself
    return None


@cache
def foreign_private_names() -> frozenset[str]:
    """Every private name the three packages use in their Python source (defined, assigned or read as ``x._name``)."""
    names: set[str] = set()
    pattern = re.compile(r"(?:\.|\bdef |\bclass |^\s*)(_[A-Za-z]\w*)", re.MULTILINE)
    slots = re.compile(r"[\"'](_[A-Za-z]\w*)[\"']")
    for package in PACKAGES:
        loaded = _module(package)
        if loaded is None or loaded.__file__ is None:
            continue
        for path in Path(loaded.__file__).parent.rglob("*.py"):
            text = path.read_text(encoding="utf-8", errors="replace")
            names.update(pattern.findall(text))
            names.update(slots.findall(text))
    return frozenset(name for name in names if _private(name))


def _class_private_names(cls: type) -> set[str]:
    """The private names a class of those packages (and its bases there) defines or assigns on ``self``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not _of_packages(klass.__module__):
            continue
        names.update(name for name in vars(klass) if _private(name))
        names.update(name for slot in getattr(klass, "__slots__", ()) for name in [slot] if _private(name))
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names.update(name for name in re.findall(r"\bself\.(_[A-Za-z]\w*)", source) if _private(name))
    return names


@dataclass
class _Source:
    path: Path
    text: str
    tree: ast.Module
    #: Local name -> the module (of those packages) or ``module:name`` it was imported as.
    imports: dict[str, str] = field(default_factory=dict)
    imports_packages: bool = False


def _sources(root: Path) -> Iterator[_Source]:
    seen: set[Path] = set()
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            text = path.read_text(encoding="utf-8")
            source = _Source(path, text, parse(text, str(path)))
            for node in ast.walk(source.tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if _of_packages(alias.name):
                            source.imports_packages = True
                            local = alias.asname or alias.name.split(".")[0]
                            source.imports[local] = alias.name if alias.asname else alias.name.split(".")[0]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _of_packages(node.module):
                    source.imports_packages = True
                    for alias in node.names:
                        source.imports[alias.asname or alias.name] = f"{node.module}:{alias.name}"
            yield source


def turnkit_private_names(sources: Iterable[_Source]) -> frozenset[str]:
    """Every private name TurnKit's code defines: functions, classes, assignments, attributes it assigns, slots."""
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(source.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
            ):
                names.update(
                    constant.value
                    for constant in ast.walk(node.value)
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str)
                )
    return frozenset(name for name in names if _private(name))


def _resolve(source: _Source, node: ast.expr) -> object | None:
    """The object of those packages that ``node`` (a name or a dotted name) names, when it is one."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in source.imports:
        return None
    origin = source.imports[node.id]
    if ":" in origin:
        module, name = origin.split(":")
        obj: object | None = getattr(_module(module), name, None)
    else:
        obj = _module(origin)
    for part in parts:
        obj = getattr(obj, part, None)
    return obj


def _class_defines(cls: ast.ClassDef) -> set[str]:
    """The names a TurnKit class defines: in its body, and assigned on ``self``/``cls`` in its methods."""
    names: set[str] = set()
    for statement in cls.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
            if any(isinstance(target, ast.Name) and target.id == "__slots__" for target in targets):
                assert statement.value is not None
                names.update(
                    constant.value
                    for constant in ast.walk(statement.value)
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str)
                )
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return names


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _enclosing_class(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.ClassDef | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.ClassDef):
            return node
    return None


def scan(root: Path = ROOT) -> list[str]:
    """Every private use of SQLAlchemy, asyncpg or aiosqlite in the code under ``root``, one line each."""
    sources = list(_sources(root))
    own = turnkit_private_names(sources)
    foreign = foreign_private_names()
    found: list[str] = []
    for source in sources:
        where = source.path.relative_to(root)
        parents = _parents(source.tree)
        foreign_bases: dict[ast.ClassDef, list[type]] = {}
        for node in ast.walk(source.tree):
            if isinstance(node, ast.ClassDef):
                bases = [base for base in map(lambda b: _resolve(source, b), node.bases) if isinstance(base, type)]
                if bases:
                    foreign_bases[node] = bases

        def flag(node: ast.AST, why: str, where: Path = where) -> None:
            found.append(f"{where}:{getattr(node, 'lineno', 0)}: {why}")

        # 1. Imports, and SQLAlchemy's adapter classes wherever they are named.
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _of_packages(alias.name) and (why := _check_import(alias.name, None)):
                        flag(node, why)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _of_packages(node.module):
                for alias in node.names:
                    if why := _check_import(node.module, alias.name):
                        flag(node, why)
            elif isinstance(node, ast.Name | ast.Attribute):
                name = node.id if isinstance(node, ast.Name) else node.attr
                if name.startswith("AsyncAdapt"):
                    flag(node, f"SQLAlchemy's DBAPI adapter {name}")

        # 2. Private attributes.
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Attribute):
                receiver, name = node.value, node.attr
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                receiver, name = node.args[0], node.args[1].value
            else:
                continue
            if not _private(name) or name in PUBLIC_UNDERSCORE:
                continue
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                cls = _enclosing_class(node, parents)
                if cls is not None and (name in _class_defines(cls) or (cls not in foreign_bases and name in own)):
                    continue
                if (cls is not None and cls in foreign_bases) or source.imports_packages:
                    flag(node, f"private attribute {name} (not defined by this class)")
                continue
            if source.imports_packages:
                if name in TURNKIT_OWN or (name in own and name not in foreign):
                    continue
                flag(node, f"private attribute {name}")
            elif name in foreign and name not in own:
                flag(node, f"private attribute {name} (a private name of {'/'.join(PACKAGES)})")

        # 3. A subclass of theirs that defines or overrides one of its base's private names.
        for cls, bases in foreign_bases.items():
            theirs = set().union(*(_class_private_names(base) for base in bases))
            for name in sorted(_class_defines(cls)):
                if _private(name) and not _mangled(name) and name in theirs:
                    flag(cls, f"{cls.name} defines {name}, a private name of its base")

        # 4. pyright ignores that would hide a private name.
        if source.imports_packages:
            for token in tokenize.generate_tokens(io.StringIO(source.text).readline):
                if token.type != tokenize.COMMENT:
                    continue
                match = _IGNORE.search(token.string)
                if match is None:
                    continue
                rules = match.group("rules")
                if rules is None:
                    found.append(f"{where}:{token.start[0]}: a pyright ignore of every rule")
                elif "reportPrivateUsage" in rules:
                    found.append(f"{where}:{token.start[0]}: a pyright ignore of reportPrivateUsage")
    return sorted(found, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


def test_turnkit_uses_only_public_apis_of_its_database_packages() -> None:
    found = scan()
    assert not found, "private names of SQLAlchemy, asyncpg or aiosqlite:\n" + "\n".join(found)


_SAMPLES = {
    # Each private use that issue 37 found, as it was written.
    "handle_dbapi_exception.py": """
from sqlalchemy.engine import Connection
def f(connection: Connection) -> None:
    connection._handle_dbapi_exception(None, "", (), None, None)  # pyright: ignore[reportPrivateUsage]
""",
    "aiosqlite_internals.py": """
import aiosqlite
from aiosqlite import context as aiosqlite_context
class Trip(aiosqlite.Connection):
    async def _execute(self, fn, *args, **kwargs):
        return await super()._execute(fn, *args, **kwargs)
    @property
    def raw(self):
        return self._conn
def connect(connection):
    connection._thread.daemon = True
""",
    "asyncpg_adapter.py": """
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
def f(adapter: AsyncAdapt_asyncpg_connection, dialect) -> None:
    adapter._transaction = None
    schema_as_of = dialect._invalidate_schema_cache_asof  # pyright: ignore
""",
    "engine_hook.py": """
import sqlalchemy
def f(conn):
    return getattr(conn.connection.dbapi_connection, "_connection", None)
""",
    "compiled.py": """
from sqlalchemy.engine._row_cy import BaseRow
def f(compiled, metadata):
    return compiled._bind_processors, metadata._key_to_index
""",
    # Anywhere, a private name of theirs that TurnKit never defines (this module imports none of them).
    "elsewhere.py": """
def f(result):
    return result._soft_closed
""",
}


def test_the_scan_finds_what_it_is_for(tmp_path: Path) -> None:
    """Every rule flags its samples: the scan above cannot pass for want of looking."""
    package = tmp_path / "turnkit"
    package.mkdir()
    for name, text in _SAMPLES.items():
        (package / name).write_text(text)
    found = "\n".join(scan(tmp_path))
    expected = [
        "handle_dbapi_exception.py:4: private attribute _handle_dbapi_exception",
        "handle_dbapi_exception.py:4: a pyright ignore of reportPrivateUsage",
        "aiosqlite_internals.py:3: internal module aiosqlite.context",
        "aiosqlite_internals.py:4: Trip defines _execute, a private name of its base",
        "aiosqlite_internals.py:6: private attribute _execute",
        "aiosqlite_internals.py:9: private attribute _conn (not defined by this class)",
        "aiosqlite_internals.py:11: private attribute _thread",
        "asyncpg_adapter.py:2: internal module sqlalchemy.dialects.postgresql.asyncpg",
        "asyncpg_adapter.py:3: SQLAlchemy's DBAPI adapter AsyncAdapt_asyncpg_connection",
        "asyncpg_adapter.py:4: private attribute _transaction",
        "asyncpg_adapter.py:5: private attribute _invalidate_schema_cache_asof",
        "asyncpg_adapter.py:5: a pyright ignore of every rule",
        "engine_hook.py:4: private attribute _connection",
        "compiled.py:2: private module sqlalchemy.engine._row_cy",
        "compiled.py:4: private attribute _bind_processors",
        "compiled.py:4: private attribute _key_to_index",
        "elsewhere.py:3: private attribute _soft_closed",
    ]
    missing = [line for line in expected if line not in found]
    assert not missing, f"not flagged: {missing}\nfound:\n{found}"


def test_turnkit_own_private_names_pass(tmp_path: Path) -> None:
    """TurnKit's own private names are its own: on ``self``, on its objects, and name-mangled in a subclass."""
    package = tmp_path / "turnkit"
    package.mkdir()
    (package / "own.py").write_text(
        """
import aiosqlite
from sqlalchemy.engine import Row
class Holder:
    def __init__(self) -> None:
        self._statements = {}
    def count(self, other: "Holder", row: Row) -> int:
        return len(self._statements) + len(other._statements) + len(row._mapping)
class Connection(aiosqlite.Connection):
    def __init__(self) -> None:
        super().__init__(lambda: None, 64)
        self.__state = 1
"""
    )
    assert scan(tmp_path) == []


if __name__ == "__main__":  # python -m tests.test_public_apis [ROOT]: what the scan finds under ROOT
    print("\n".join(scan(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)) or "nothing found")
