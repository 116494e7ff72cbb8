"""Write a workload spec whose traffic came from outside (metrics or a trace), validated before it is written."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tuner.traffic.metrics import TrafficError
from tuner.workload import Workload, WorkloadError, parse_workload

__all__ = ["derived_spec", "render_workload", "write_workload"]


class _FlowMap(dict):
    """A mapping YAML writes on wrapped lines (`{1: 3.0, 2: 3.0, ...}`): thousands of widths stay readable."""


# libyaml when present: a spread histogram can hold thousands of widths, and the pure-Python codec takes a
# second over them.
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(_SafeDumper):  # type: ignore[valid-type, misc]
    pass


_Dumper.add_representer(_FlowMap, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True))


def _weight(value: float) -> float | int:
    """Six significant digits: the spread is an estimate, so more digits would only pretend precision."""
    rounded = float(f"{value:.6g}")
    return int(rounded) if rounded.is_integer() else rounded


def derived_spec(base: Workload, traffic: dict[str, Any], *, name: str, description: str) -> dict[str, Any]:
    """A new workload mapping: model and serving copied from the base spec, traffic replaced."""
    base_traffic = base.spec.get("traffic") or {}
    traffic = dict(traffic)
    if "mean_context_len" in base_traffic:
        # The histogram says nothing about context length; keep the base spec's figure.
        traffic = {"mean_context_len": base_traffic["mean_context_len"], **traffic}
    if "widths" in traffic:
        widths = traffic["widths"]
        traffic["widths"] = {"kind": "histogram",
                             "counts": _FlowMap((w, _weight(c)) for w, c in sorted(widths.items()) if _weight(c) > 0)}
    return {
        "name": name,
        "description": description,
        "model": copy.deepcopy(base.spec["model"]),
        "serving": copy.deepcopy(base.spec["serving"]),
        "traffic": traffic,
    }


def render_workload(spec: dict[str, Any], header: list[str]) -> str:
    """YAML text with `header` lines as a leading comment."""
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header)
    return comment + yaml.dump(spec, Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=False)


def write_workload(spec: dict[str, Any], header: list[str], out: Path, *, force: bool = False) -> Workload:
    """Validate the spec as the loader will read it from `out`, then write it atomically; returns the workload."""
    if out.exists() and not force:
        raise TrafficError(f"--out: {out} exists (pass --force to replace it)")
    if out.exists() and not out.is_file():
        raise TrafficError(f"--out: {out} is not a file")
    if not out.parent.is_dir():
        raise TrafficError(f"--out: directory {out.parent} does not exist")
    text = render_workload(spec, header)
    try:
        workload = parse_workload(yaml.load(text, Loader=_SafeLoader), base_dir=out.parent, path=out)
    except WorkloadError as exc:
        raise TrafficError(f"the new workload would not load: {exc}") from None
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a workload file is meant to be shared
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return workload
