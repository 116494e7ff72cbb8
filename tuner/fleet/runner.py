"""A catalogue run on Ray: each deployment's fit checked against the cluster's nodes up front, its stored result held
to what a node of its kind would record now (skipped when current), then a profile, a search and a validate task
chained per deployment, their progress followed in the store and printed one line per move, and the index written."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.fleet.catalogue import CPU_KIND, Catalogue, Deployment
from tuner.fleet.store import (
    build_index,
    deployment_dir,
    fingerprint,
    read_status,
    staleness,
    write_index,
    write_status,
)
from tuner.fleet.tasks import KILL_AFTER_ENV

__all__ = ["RAY_REQUIREMENT", "FleetRunError", "progress_line", "run_catalogue", "unplaceable"]

RAY_REQUIREMENT = "ray>=2.40,<3"
"""The Ray the fleet is written for (pyproject.toml's `fleet` and `test` extras)."""

_RECHECK_S = 5.0
"""Seconds between looks at the cluster's nodes while tasks wait: a deployment whose last node of its kind died
is failed then, not left pending."""


class FleetRunError(RuntimeError):
    """The run cannot start (no ray, no cluster at --address); one line."""


def _resources(node: dict[str, Any]) -> dict[str, float]:
    return node.get("Resources") or {}


def unplaceable(dep: Deployment, nodes: list[dict[str, Any]]) -> str | None:
    """Why no alive node of the cluster can run the deployment's tasks (None when one can): its GPU kind (Ray's
    `accelerator_type:<kind>` resource) with `tensor_parallel_size` GPUs on ONE node, or a CPU for the cpu kind.
    Held against each node's resources rather than `ray.cluster_resources()`'s sums: two 1-GPU nodes are no
    2-GPU deployment. A node an autoscaler has not started yet counts as lacking."""
    if dep.gpu_kind == CPU_KIND:
        return None if any(_resources(n).get("CPU", 0) >= 1 for n in nodes) else "no node of the cluster has a CPU"
    key = f"accelerator_type:{dep.gpu_kind}"
    of_kind = [n for n in nodes if _resources(n).get(key, 0) > 0]
    if not of_kind:
        kinds = sorted({k.split(":", 1)[1] for n in nodes for k in _resources(n) if k.startswith("accelerator_type:")})
        return (f"gpu_kind {dep.gpu_kind}: no node of the cluster has it (resource {key}; the cluster has "
                f"{', '.join(kinds) or 'no GPU kind'})")
    most = max(int(_resources(n).get("GPU", 0)) for n in of_kind)
    if most < dep.num_gpus:
        return (f"gpu_kind {dep.gpu_kind}: {dep.num_gpus} GPU{'s' * (dep.num_gpus != 1)} asked (tensor_parallel_size "
                f"{dep.tensor_parallel_size}), the largest node of that kind has {most}")
    return None


def _placement(dep: Deployment, *, gpus: bool) -> dict[str, Any]:
    """Ray task options that put a task on a node of the deployment's kind: its GPUs (`gpus`), and a sliver of the
    kind's resource, as Ray's own `accelerator_type=` option asks, so a task without GPUs (probe, search) still
    runs on that kind's software."""
    options: dict[str, Any] = {"num_gpus": dep.num_gpus if gpus else 0}
    if dep.gpu_kind != CPU_KIND:
        options["resources"] = {f"accelerator_type:{dep.gpu_kind}": 0.001}
    return options


def progress_line(name: str, status: dict[str, Any] | None) -> str:
    """One deployment's line: `tiny-a (cpu): profiling 3/6 widths`, `... failed: profile: <reason>`."""
    status = status or {}
    state = status.get("state", "not run")
    kind = (status.get("fingerprint") or {}).get("gpu_kind") or status.get("gpu_kind") or "-"
    text = state
    if state == "profiling" and status.get("widths_total"):
        text = f"profiling {status.get('widths_done') or 0}/{status['widths_total']} widths"
    elif state == "failed":
        text = f"failed: {status.get('reason') or 'no reason recorded'}"
    elif state == "done" and status.get("skipped"):
        text = "done (current: same workload hash, GPU kind, backend and versions; skipped)"
    return f"fleet: {name} ({kind}): {text}"


@dataclass
class _Submitted:
    """The Ray tasks of one deployment in flight."""

    dep: Deployment
    """The deployment."""
    refs: list[Any] = field(default_factory=list)
    """Its profile, search and validate ObjectRefs; the last is waited on."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FleetRunError(f"ray is not installed: pip install '{RAY_REQUIREMENT}' (or cgtune's `fleet` extra)") \
            from None
    return ray


def run_catalogue(catalogue: Catalogue, *, address: str | None = None, progress: Callable[[str], None] = print,
                  poll_s: float = 0.5, probe_timeout_s: float = 120.0) -> dict[str, Any]:
    """Run every deployment of the catalogue on the Ray cluster at `address` (None: the one this process is already
    connected to, else a local one started here and shut down after) and return the index written to the store.
    A deployment whose kind no node has fails at once with its reason; one whose stored result is current is
    skipped; a stale one is redone from scratch; an unfinished one of the same fingerprint resumes its profile."""
    ray = _ray()
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise FleetRunError(f"--address {address}: cannot join the Ray cluster ({str(exc).splitlines()[0]})") \
                from None
        started = True
    try:
        return _run(ray, catalogue, progress, poll_s, probe_timeout_s)
    finally:
        if started:
            ray.shutdown()


def _alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _run(ray: Any, catalogue: Catalogue, progress: Callable[[str], None], poll_s: float,
         probe_timeout_s: float) -> dict[str, Any]:
    from tuner.fleet import tasks

    store = catalogue.store
    store.mkdir(parents=True, exist_ok=True)
    names = [d.name for d in catalogue.deployments]
    kinds = {d.name: d.gpu_kind for d in catalogue.deployments}
    kill_after = os.environ.get(KILL_AFTER_ENV)
    probe = ray.remote(tasks.probe)
    profile = ray.remote(tasks.profile_task)
    search = ray.remote(tasks.search_task)
    validate = ray.remote(tasks.validate_task)

    nodes = _alive_nodes(ray)
    placeable: list[Deployment] = []
    for dep in catalogue.deployments:
        why = unplaceable(dep, nodes)
        if why is None:
            placeable.append(dep)
            continue
        # Nothing is submitted for it: Ray would keep such a task pending forever.
        progress(progress_line(dep.name, write_status(store, dep.name, "failed", reason=why, gpu_kind=dep.gpu_kind)))

    by_kind: dict[str, list[Deployment]] = {}
    for dep in placeable:
        by_kind.setdefault(dep.gpu_kind, []).append(dep)
    probes = {kind: probe.options(num_cpus=0, max_retries=catalogue.max_retries, **_placement(deps[0], gpus=False))
              .remote([d.as_dict() for d in deps]) for kind, deps in by_kind.items()}
    submitted: dict[str, _Submitted] = {}
    seen: dict[str, int] = {}
    for dep in placeable:
        try:
            node = ray.get(probes[dep.gpu_kind], timeout=probe_timeout_s)[by_kind[dep.gpu_kind].index(dep)]
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is this deployment's reason
            reason = f"probe of a {dep.gpu_kind} node: {str(exc).strip().splitlines()[0] if str(exc) else exc!r}"
            progress(progress_line(dep.name, write_status(store, dep.name, "failed", reason=reason,
                                                          gpu_kind=dep.gpu_kind)))
            continue
        if node["backend"] == "unavailable":
            progress(progress_line(dep.name, write_status(store, dep.name, "failed", reason=f"profile: {node['why']}",
                                                          gpu_kind=dep.gpu_kind)))
            continue
        now = fingerprint(dep, node)
        status = read_status(store, dep.name)
        stale = staleness(status, now)
        if stale is None:
            status = write_status(store, dep.name, "done", skipped=True)
            progress(progress_line(dep.name, status))
            continue
        resume = status is not None and status.get("fingerprint") == now
        if not resume and deployment_dir(store, dep.name).exists():
            progress(f"fleet: {dep.name} ({dep.gpu_kind}): stale ({stale}): redone from scratch")
            shutil.rmtree(deployment_dir(store, dep.name))
        elif resume:
            progress(f"fleet: {dep.name} ({dep.gpu_kind}): {stale}: resumed (its profile keeps the widths it has)")
        queued = write_status(store, dep.name, "queued", fingerprint=now, gpu_kind=dep.gpu_kind, skipped=False,
                              backend_why=node["why"], node=node["host"], widths_done=None, widths_total=None)
        seen[dep.name] = len(queued["history"])  # its moves from here on get a line each
        progress(progress_line(dep.name, queued))
        spec = dep.as_dict()
        p = profile.options(num_cpus=1, max_retries=catalogue.max_retries, retry_exceptions=False,
                            **_placement(dep, gpus=True)).remote(spec, str(store),
                                                                 int(kill_after) if kill_after else None)
        s = search.options(num_cpus=1, max_retries=catalogue.max_retries, retry_exceptions=False,
                           **_placement(dep, gpus=False)).remote(spec, str(store), catalogue.storage, p)
        v = validate.options(num_cpus=1, max_retries=catalogue.max_retries, retry_exceptions=False,
                             **_placement(dep, gpus=True)).remote(spec, str(store), s)
        submitted[dep.name] = _Submitted(dep, [p, s, v])
    write_index(store, build_index(store, names, kinds))  # `cgtune fleet status STORE` reads it while tasks run

    printed = {name: progress_line(name, {"state": "queued", "gpu_kind": kinds[name]}) for name in submitted}

    def follow(name: str) -> None:
        status = read_status(store, name) or {}
        history = status.get("history", [])
        for move in history[seen[name]:-1]:  # moves made between two looks still get their line
            progress(f"fleet: {name} ({kinds[name]}): {move['state']}")
        seen[name] = max(seen[name], len(history))
        line = progress_line(name, status)
        if line != printed[name]:
            printed[name] = line
            progress(line)

    last_check = time.monotonic()
    while submitted:
        by_ref = {s.refs[-1]: name for name, s in submitted.items()}
        ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=poll_s)
        for ref in ready:
            name = by_ref[ref]
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a stage's own failure is already in its status
                _record_crash(store, submitted[name], exc, catalogue.max_retries)
            del submitted[name]
        if time.monotonic() - last_check > _RECHECK_S:
            last_check = time.monotonic()
            _fail_the_stranded(ray, store, submitted, progress)
        for name in printed:
            follow(name)
    index = build_index(store, names, kinds)
    write_index(store, index)
    return index


def _record_crash(store: Any, sub: _Submitted, exc: BaseException, max_retries: int) -> None:
    """A chain that ended in an error its stage did not write (a worker or node that died past its retries, a
    cancelled task): the deployment fails with that, one line."""
    status = read_status(store, sub.dep.name) or {}
    if status.get("state") == "failed":
        return
    stage = {"queued": "profile", "profiling": "profile", "searching": "search", "validating": "validate"}.get(
        status.get("state", ""), "task")
    kind = type(exc).__name__
    if "WorkerCrashed" in kind or "NodeDied" in kind or "ActorDied" in kind:
        reason = f"{stage}: its worker died {max_retries + 1} times (Ray retried it {max_retries} times; {kind})"
    else:
        text = str(exc).strip().splitlines()
        reason = f"{stage}: {kind}: {text[-1] if text else ''}".rstrip(": ")
    write_status(store, sub.dep.name, "failed", reason=reason)


def _fail_the_stranded(ray: Any, store: Any, submitted: dict[str, _Submitted],
                       progress: Callable[[str], None]) -> None:
    """Deployments whose kind no alive node has any more (their node died and no other of the kind is left):
    cancelled and failed, instead of pending until a node comes back."""
    nodes = _alive_nodes(ray)
    for name, sub in list(submitted.items()):
        why = unplaceable(sub.dep, nodes)
        if why is None:
            continue
        for ref in sub.refs:
            ray.cancel(ref, force=True)
        write_status(store, name, "failed", reason=f"the cluster lost its nodes for it: {why}")
        progress(progress_line(name, read_status(store, name)))
        del submitted[name]
