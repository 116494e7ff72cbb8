"""Read a YAML file a user wrote, strictly: UTF-8 text, safe constructors only, and a key given twice in one mapping
an error (YAML keeps the last one silently, so a doubled `max_num_seqs:` would tune another deployment)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlFileError", "read_yaml"]

# The C safe loader when present: same safety as yaml.safe_load, ~10x faster on the large width histograms
# `cgtune workload from-metrics` writes.
_SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlFileError(ValueError):
    """A file that is not the YAML it must be; the one-line message names the file (and the line)."""


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _StrictLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a mapping that gives one key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges are YAML's own, not a repeat
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:  # an unhashable key: the safe constructor below refuses it with its own message
                break
            if repeated:
                raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """The file's YAML document (None when empty); YamlFileError naming the file for bytes that are not UTF-8, YAML
    that does not parse, or a duplicate key."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{path.name}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                            f"{exc.start}); save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else "?"
        raise YamlFileError(f"{path.name} line {line}: {exc.problem} (YAML would keep the last one silently)") \
            from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise YamlFileError(f"{path.name} is not valid YAML{where}") from None
