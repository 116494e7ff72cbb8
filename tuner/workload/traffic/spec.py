"""Write a workload spec whose traffic came from outside (metrics or a trace), validated before it is written."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tuner.profile.table import atomic_write_text
from tuner.workload.spec import Workload, WorkloadError, parse_workload
from tuner.workload.traffic.metrics import TrafficError

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
    """A new workload mapping: engine, model, speculative setup (its drafter) and serving copied from the base spec,
    traffic replaced."""
    base_traffic = base.spec.get("traffic") or {}
    traffic = dict(traffic)
    if "mean_context_len" in base_traffic:
        # The histogram says nothing about context length; keep the base spec's figure.
        traffic = {"mean_context_len": base_traffic["mean_context_len"], **traffic}
    if "widths" in traffic:
        widths = traffic["widths"]
        traffic["widths"] = {"kind": "histogram",
                             "counts": _FlowMap((w, _weight(c)) for w, c in sorted(widths.items()) if _weight(c) > 0)}
    if isinstance(traffic.get("load"), dict):
        # Length histograms on wrapped lines as well: a line per length would bury the rest of the section.
        load = dict(traffic["load"])
        for key in ("prompt_tokens", "output_tokens"):
            lengths = load.get(key)
            if isinstance(lengths, dict) and isinstance(lengths.get("counts"), dict):
                load[key] = {**lengths, "counts": _FlowMap(sorted(lengths["counts"].items()))}
        traffic["load"] = load
    spec = {
        "name": name,
        "description": description,
        **({"engine": base.spec["engine"]} if "engine" in base.spec else {}),  # its serving section is in its words
        "model": copy.deepcopy(base.spec["model"]),
    }
    if "speculative" in base.spec:
        spec["speculative"] = copy.deepcopy(base.spec["speculative"])
    spec.update(serving=copy.deepcopy(base.spec["serving"]), traffic=traffic)
    return spec


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
    text = render_workload(spec, header)
    # Missing parent folders are created (as for every --out), first: a trace path relative to `out` (../logs/..)
    # resolves only through folders that exist. A workload that would not load removes them again.
    created = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        workload = parse_workload(yaml.load(text, Loader=_SafeLoader), base_dir=out.parent, path=out)
    except WorkloadError as exc:
        for d in created:  # deepest first, all empty
            d.rmdir()
        raise TrafficError(f"the new workload would not load: {exc}") from None
    atomic_write_text(out, text)  # the mode of any new file (0644 under umask 022)
    return workload
