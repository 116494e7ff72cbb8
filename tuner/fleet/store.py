"""The results store of a fleet run: per deployment its status file, profile and run directory, and the catalogue
index (deployment, GPU kind, status, the list shipped and its predicted saving) as JSON and as a table.

Layout (every file written atomically, so a reader on any node sees a whole file):

    STORE/index.json, STORE/index.md          the catalogue index
    STORE/deployments/<name>/status.json      state, widths done/total, reason, timestamps, fingerprint, history
    STORE/deployments/<name>/profile/         the profile (<workload>.csv + .json), resumed after a retry
    STORE/deployments/<name>/profile/measured.jsonl   one line per width timed, with the pid that timed it
    STORE/deployments/<name>/run/             the run directory (cgtune search's files, validation.json)
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from tuner.profile.table import atomic_write_text

__all__ = ["FINGERPRINT_KEYS", "INDEX_FILE", "STATES", "append_measured", "build_index", "deployment_dir",
           "fingerprint", "index_table", "read_index", "read_status", "staleness", "write_index", "write_status"]

STATES = ("queued", "profiling", "searching", "validating", "done", "failed")
"""The states a deployment moves through, in order; `failed` carries a one-line reason."""

INDEX_FILE = "index.json"
"""The catalogue index in the store."""

FINGERPRINT_KEYS = ("workload_hash", "gpu_kind", "backend", "cgtune_version", "vllm_version", "settings")
"""What a result must record, equal, to be current: the workload file's content hash, the GPU kind, the profile's
instrument as resolved on a node of that kind (stand-in, or vLLM and its version), cgtune's and vLLM's versions
there, and the deployment's settings (widths, budgets, trials, steps)."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def deployment_dir(store: Path, name: str) -> Path:
    return Path(store) / "deployments" / name


def read_status(store: Path, name: str) -> dict[str, Any] | None:
    """A deployment's status file, or None when it has none (never run) or it is unreadable."""
    try:
        data = json.loads((deployment_dir(store, name) / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_status(store: Path, name: str, state: str, **fields: Any) -> dict[str, Any]:
    """Move a deployment to `state` (keeping the fields it had; `fields` replace theirs) and write its status file
    atomically; a new state is appended to its history with the time. Returns the status written."""
    if state not in STATES:
        raise ValueError(f"{state=} must be one of {', '.join(STATES)}")
    status = read_status(store, name) or {"deployment": name, "history": []}
    now = _now()
    if status.get("state") != state:
        status["history"] = [*status.get("history", []), {"state": state, "at": now}]
    if state != "failed":
        status.pop("reason", None)
    status.update(fields, state=state, updated_at=now)
    status.setdefault("started_at", now)
    atomic_write_text(deployment_dir(store, name) / "status.json", json.dumps(status, indent=2, default=str) + "\n")
    return status


def fingerprint(deployment: Any, node: dict[str, Any]) -> dict[str, Any]:
    """What a result of `deployment` made now would record (FINGERPRINT_KEYS): `node` is what a node of its kind
    answered (`tuner.fleet.tasks.probe`: the backend it resolves, cgtune's and vLLM's versions there)."""
    return {"workload_hash": deployment.workload_hash, "gpu_kind": deployment.gpu_kind, "backend": node["backend"],
            "cgtune_version": node["cgtune_version"], "vllm_version": node["vllm_version"],
            "settings": deployment.settings_hash()}


def staleness(status: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """Why a stored result is not current (the first fingerprint field that differs, then and now), or None when it
    is: done, under the same fingerprint."""
    if status is None:
        return "no result yet"
    then = status.get("fingerprint") or {}
    for key in FINGERPRINT_KEYS:
        if then.get(key) != now.get(key):
            return f"{key} was {then.get(key)!r}, now {now.get(key)!r}"
    if status.get("state") != "done":
        return f"left {status.get('state')!r}" + (f" ({status['reason']})" if status.get("reason") else "")
    return None


def append_measured(profile_dir: Path, width: int, in_table: int, requested: int) -> None:
    """One line per width the profile timed, with this process's pid, appended and synced before anything else
    happens to the process: a retried profile's log shows which attempt measured which width."""
    profile_dir.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"width": width, "pid": os.getpid(), "in_table": in_table, "requested": requested,
                       "at": _now()})
    with open(profile_dir / "measured.jsonl", "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _shipped(run_dir: Path) -> dict[str, Any]:
    """The list the run directory ships and its predicted saving against the engine's default (summary.json), and
    what validation said (validation.json); None each when the run has no summary."""
    out: dict[str, Any] = dict.fromkeys(("shipped_list", "shipped_sizes", "device_name", "expected_step_ms",
                                         "default_step_ms", "predicted_saving_ms", "predicted_saving_share",
                                         "validation"))
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return out
    shipped = summary.get("shipped") or {}
    which = "compact" if shipped.get("list") == "compact" and summary.get("compact") else "tuned"
    chosen, default = summary.get(which) or {}, summary.get("default") or {}
    out.update(shipped_list=shipped.get("list"), shipped_sizes=shipped.get("capture_sizes"),
               device_name=summary.get("device_name"))
    step_ms, default_ms = chosen.get("expected_step_ms"), default.get("expected_step_ms")
    if step_ms is not None and default_ms:
        out.update(expected_step_ms=step_ms, default_step_ms=default_ms,
                   predicted_saving_ms=default_ms - step_ms, predicted_saving_share=1.0 - step_ms / default_ms)
    try:
        validation = json.loads((run_dir / "validation.json").read_text())
    except (OSError, ValueError):
        return out
    out["validation"] = {"emitted": validation.get("emitted"), "device_name": validation.get("device_name"),
                         "warnings": validation.get("warnings") or []}
    return out


def build_index(store: Path, names: list[str], gpu_kinds: dict[str, str]) -> dict[str, Any]:
    """The catalogue index, one entry per deployment in catalogue order: its GPU kind, status (and reason), widths,
    the profile and run directory, the list shipped and its predicted saving (from the run's own summary.json)."""
    entries = []
    for name in names:
        status = read_status(store, name) or {}
        d = deployment_dir(store, name)
        entry = {"deployment": name, "gpu_kind": gpu_kinds.get(name, (status.get("fingerprint") or {}).get("gpu_kind")),
                 "status": status.get("state", "not run"), "reason": status.get("reason"),
                 "widths_done": status.get("widths_done"), "widths_total": status.get("widths_total"),
                 "profile": status.get("profile_csv"), "searched_profile": status.get("searched_profile"),
                 "run_dir": str(d / "run") if (d / "run").is_dir() else None,
                 "fingerprint": status.get("fingerprint"), "updated_at": status.get("updated_at")}
        entry.update(_shipped(d / "run"))
        entries.append(entry)
    return {"store": str(store), "written_at": _now(), "deployments": entries}


def write_index(store: Path, index: dict[str, Any]) -> tuple[Path, Path]:
    """index.json and index.md (the same as a table) in the store."""
    json_path, md_path = Path(store) / INDEX_FILE, Path(store) / "index.md"
    atomic_write_text(json_path, json.dumps(index, indent=2, default=str) + "\n")
    atomic_write_text(md_path, index_table(index, markdown=True) + "\n")
    return json_path, md_path


def read_index(store: Path) -> dict[str, Any]:
    """The index a fleet run wrote in `store`, refreshed from the status files (a run in progress moves them);
    ValueError (one line) when `store` holds no fleet results."""
    store = Path(store)
    try:
        index = json.loads((store / INDEX_FILE).read_text())
    except OSError:
        raise ValueError(f"{str(store)!r} holds no {INDEX_FILE} (not a results store of `cgtune fleet run`)") from None
    except ValueError:
        raise ValueError(f"{store / INDEX_FILE}: not JSON") from None
    names = [e["deployment"] for e in index.get("deployments", [])]
    kinds = {e["deployment"]: e.get("gpu_kind") for e in index.get("deployments", [])}
    return build_index(store, names, kinds)


def _sizes(sizes: list[int] | None) -> str:
    if not sizes:
        return "-"
    return f"{len(sizes)} graphs, max {max(sizes)}" if len(sizes) > 6 else " ".join(map(str, sizes))


def index_table(index: dict[str, Any], *, markdown: bool = False) -> str:
    """The index as a table: deployment, GPU kind, status (widths or the reason), the list shipped and its
    predicted saving of expected step latency against the engine's default."""
    header = ["deployment", "gpu kind", "status", "shipped list", "predicted saving"]
    rows = []
    for e in index.get("deployments", []):
        status = e["status"]
        if status == "profiling" and e.get("widths_total"):
            status = f"profiling {e.get('widths_done') or 0}/{e['widths_total']} widths"
        elif status == "failed" and e.get("reason"):
            status = f"failed: {e['reason']}"
        saving = "-"
        if e.get("predicted_saving_share") is not None:
            saving = (f"{e['predicted_saving_share'] * 100:+.1f}% ({e['default_step_ms']:.3f} -> "
                      f"{e['expected_step_ms']:.3f} ms)")
        shipped = _sizes(e.get("shipped_sizes"))
        if e.get("shipped_list"):
            shipped = f"{e['shipped_list']}: {shipped}"
        rows.append([e["deployment"], e.get("gpu_kind") or "-", status, shipped, saving])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows])
