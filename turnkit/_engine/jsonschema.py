"""A minimal JSON-schema check (types, enum, required, properties, items), as the gem's ``input_schema`` uses.

Enough for application input contracts; no ``$ref``, formats or combinators.
"""

from __future__ import annotations

from typing import Any

__all__ = ["schema_errors"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "input") -> list[str]:
    """Every way ``value`` fails ``schema``, as readable messages naming the path; [] when it conforms."""
    errors: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        ok = any(_is_type(value, str(name)) for name in names)
        if not ok:
            return [f"{path} must be {' or '.join(str(n) for n in names)}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path} must be one of {schema['enum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}.{key} is required")
        properties: dict[str, Any] = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors.extend(schema_errors(item, properties[key], f"{path}.{key}"))
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}.{key} is not allowed")
    if isinstance(value, list | tuple) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{path}[{index}]"))
    return errors


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False  # JSON booleans are not numbers
    return isinstance(value, _TYPES.get(name, (object,)))
