"""Typed reading of a workload's mappings: each field read as the type it must be, in its bounds, and every error
naming the field's full path as the user wrote it (`serving.max_num_seqs: 0 must be >= 1`;
`serving.max_running_requests: -1 must be >= 1` where an engine reads that key as max_num_seqs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["FieldReader", "WorkloadError"]


class WorkloadError(ValueError):
    """A workload field with a bad value; the message starts with the field path."""


class FieldReader:
    """Reads typed fields out of a mapping and names the full field path in every error."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise WorkloadError(f"{path or 'workload'}: {data!r} must be a mapping")
        self.data = data
        self.path = path
        self.used: set[str] = set()
        self.optional: set[str] = set()
        """Keys the section takes beyond those read (named when a key is unknown): `takes`."""
        self.written: dict[str, str] = {}
        """Key read -> the key the user wrote for it (an engine's own name read under vLLM's)."""

    def at(self, key: str) -> str:
        key = self.written.get(key, key)
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def int(self, key: str, default: Any = ..., *, minimum: int | None = None, maximum: int | None = None) -> Any:
        value = self.raw(key)
        if value is None:
            if default is ...:
                raise WorkloadError(f"{self.at(key)}: missing (an integer is required)")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkloadError(f"{self.at(key)}: {value!r} must be an integer")
        if minimum is not None and value < minimum:
            raise WorkloadError(f"{self.at(key)}: {value} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise WorkloadError(f"{self.at(key)}: {value} must be <= {maximum}")
        return value

    def float(self, key: str, default: Any = ..., *, minimum: float | None = None, maximum: float | None = None,
              exclusive_minimum: bool = False) -> Any:
        value = self.raw(key)
        if value is None:
            if default is ...:
                raise WorkloadError(f"{self.at(key)}: missing (a number is required)")
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise WorkloadError(f"{self.at(key)}: {value!r} must be a finite number")
        if minimum is not None and (value <= minimum if exclusive_minimum else value < minimum):
            raise WorkloadError(f"{self.at(key)}: {value} must be {'>' if exclusive_minimum else '>='} {minimum}")
        if maximum is not None and value > maximum:
            raise WorkloadError(f"{self.at(key)}: {value} must be <= {maximum}")
        return float(value)

    def str(self, key: str, default: Any = ..., *, choices: tuple[str, ...] | None = None) -> Any:
        value = self.raw(key)
        if value is None:
            if default is ...:
                raise WorkloadError(f"{self.at(key)}: missing (a string is required)")
            return default
        if not isinstance(value, str):
            raise WorkloadError(f"{self.at(key)}: {value!r} must be a string")
        if choices is not None and value not in choices:
            raise WorkloadError(f"{self.at(key)}: {value!r} must be one of {', '.join(choices)}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise WorkloadError(f"{self.at(key)}: {value!r} must be true or false")
        return value

    def sub(self, key: str) -> FieldReader:
        return FieldReader(self.raw(key), self.at(key))

    def takes(self, *keys: str) -> None:
        """Say the section also takes `keys` (read only when present), for the unknown-field message."""
        self.optional.update(keys)

    def done(self) -> None:
        unknown = sorted(set(map(str, self.data)) - self.used)
        if unknown:
            also = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
            known = ", ".join(sorted({self.written.get(k, k) for k in self.used} | self.optional))
            raise WorkloadError(f"{self.at(unknown[0])}: unknown field{also}; {self.path or 'a workload'} takes "
                                f"{known}")
