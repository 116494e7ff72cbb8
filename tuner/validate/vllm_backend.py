"""Validation's device side through vLLM itself: for each list compared, vLLM's engine built in this process with the
list as the deployment's compilation config writes it; the engine's own figures read from the engine (the list it kept,
its KV cache in blocks, its graph-memory estimate, the pool its capture took, not a log); the validation's trace
replayed through vLLM's runner, each step dispatched by vLLM's own dispatcher (the mode and padded width it chose held
to the plan the cost model made); the engine shut down before the next list's."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.validate.backend import CaptureResult, ValidationError
from tuner.validate.trace import PlannedStep

if TYPE_CHECKING:
    from tuner.model.costmodel import CostModel, Evaluation
    from tuner.validate.served_load import ServedLoad

__all__ = ["VllmReplayBackend", "compilation_config_for", "dispatch_agreement", "engine_record", "run_in_process"]

log = logging.getLogger(__name__)

LOAD_TOGETHER = 8
"""Requests of the second host-overhead calibration (fewer where max_num_seqs is lower)."""
MAX_DISAGREEMENTS = 10
"""Steps listed where vLLM dispatched otherwise than the plan (the counts cover them all)."""


def compilation_config_for(model: CostModel, capture_sizes: Sequence[int]) -> dict[str, Any]:
    """The compilation config the run directory's `compilation_config.json` gives vLLM for the list: the engine's own
    emitter, so the engine validated is the one deployed."""
    from tuner import __version__
    from tuner.engines.vllm.emit import COMPILATION_CONFIG_FILE, Provenance

    stamp = Provenance(__version__, "-", "-", model.workload.name, "-")  # comments of the other files only
    files = model.engine.render_files(tuple(capture_sizes), model.workload.deployment,
                                      cudagraph_mode=model.cudagraph_mode, provenance=stamp)
    return json.loads(files[COMPILATION_CONFIG_FILE])


class VllmReplayBackend:
    """`validate_lists`' backend with vLLM's engine as the instrument (module docstring). `open_list` runs the list in
    a process of its own (`tuner.measure.vllm_engine.list_run`: build, read, replay, shut down), so every list starts
    on a clean device as a deployment does; `measure_estimate`, `capture` and `time_steps` return what that run
    measured, and `engine_record` what the engine said of the list."""

    def __init__(self, model: CostModel, device: str, *, chunk_steps: int = 512, any_version: bool = False,
                 seed: int = 0, timeout_s: float | None = None, served: ServedLoad | None = None) -> None:
        from tuner.measure.memory import device_metadata
        from tuner.measure.vllm_engine import api, engine

        if model.workload.engine.name != "vllm":
            raise ValidationError(f"--backend vllm: engine {model.workload.engine.name}: vLLM's engine validates "
                                  f"vLLM deployments (use --backend stand-in)")
        version, dist = api.installed_version()
        try:
            api.check_version(version, any_version=any_version)
        except api.VersionError as exc:
            raise ValidationError(str(exc)) from None
        from tuner.measure.vllm_engine.choose import release_problem

        reason = (release_problem(version, dist, model.workload, any_version=any_version)
                  or engine.unsupported_reason(model.workload))
        if reason:
            raise ValidationError(f"--backend vllm: {reason}")
        self.model = model
        self.device = device
        self.version, self.distribution = version, dist
        self.graphs_supported = device == "cuda"
        self.max_num_tokens: int | None = model.serving.max_num_batched_tokens
        self._meta = device_metadata(device)
        self.device_name = str(self._meta.get("device_name"))
        self.chunk_steps = chunk_steps
        self.seed = seed
        self.timeout_s = timeout_s
        self.served = served
        """The load each list's engine serves after the replay (`validate --rate`); None: none."""
        self._scratch: Any = None
        self._model_dir = ""
        self._draft_dir: str | None = None
        self._how = ""
        self._result: dict[str, Any] = {}
        self._record: dict[str, Any] = {}
        self._built: list[str] = []

    # ------------------------------------------------------------------ the engine per list
    def open_list(self, name: str, evaluation: Evaluation, plan: Sequence[PlannedStep] = ()) -> None:
        """Run vLLM's engine for `evaluation`'s list (its deployment's compilation config) in a process of its own,
        replaying `plan` through its runner. A start that runs out of device memory is recorded (the list does not
        fit); any other failure is a ValidationError (one line)."""
        from tuner.measure.vllm_engine import engine

        workload = self.model.workload
        if self._scratch is None:  # one scratch directory for every list: the model's config, vLLM's caches
            import tempfile

            self._scratch = tempfile.TemporaryDirectory(prefix="cgtune-validate-vllm-")
            self._model_dir, self._how = engine.model_source(workload, Path(self._scratch.name))
            # A model-based drafter is built beside the target as the profile built it: every step the engine runs
            # (the replayed trace's dummy steps, the served load's) drafts through it, as a deployment's does.
            self._draft_dir = engine.draft_source(workload, Path(self._scratch.name))
        scratch = Path(self._scratch.name)
        config = compilation_config_for(self.model, evaluation.capture_sizes)
        args = engine.engine_args(workload, self._model_dir, (), device=self.device,
                                  compile=not workload.serving.enforce_eager, seed=self.seed,
                                  draft_model=self._draft_dir)
        args["compilation_config"] = config
        request = {"engine_args": args, "environment": engine.engine_environment(workload, self.device, scratch),
                   "steps": [[p.num_tokens, p.uniform_decode] for p in plan],
                   "options": {"context_len": workload.traffic.mean_context_len, "chunk_steps": self.chunk_steps},
                   "load": None if self.served is None else self.served.request(
                       workload.model.shape.vocab_size, min(LOAD_TOGETHER, workload.serving.max_num_seqs))}
        result = run_in_process(request, scratch / f"list-{len(self._built)}", timeout_s=self.timeout_s)
        self._built.append(name)
        if result.get("error") and not result.get("started"):
            raise ValidationError(f"--backend vllm: vLLM {self.version} could not start with {name}'s list "
                                  f"({result['error']})")
        if result.get("error"):
            raise ValidationError(f"--backend vllm: vLLM {self.version} failed running {name}'s list "
                                  f"({result['error']})")
        self._result = result
        self._record = engine_record(name, config, args, result)
        if self.served is not None and result.get("load"):
            from tuner.validate.served_load import compare_load

            self._record["load"] = compare_load(self.model, evaluation.capture_sizes, self.served, result["load"],
                                                seed=self.seed)

    def engine_record(self) -> dict[str, Any]:
        """What the engine said of the last list opened (`engine_record`), its dispatch of the trace included."""
        return dict(self._record)

    def metadata(self) -> dict[str, Any]:
        return dict(self._meta, backend="vllm", vllm_version=self.version, distribution=self.distribution,
                    graphs=("vLLM's own capture for each list (its order and pool), its runner's dispatch"
                            if self.graphs_supported else
                            "vLLM's CPU build keeps no CUDA graphs: every list's steps run eager there"),
                    clock="CudaEventClock" if self.device == "cuda" else "WallClock",
                    model_source=self._how, engines_built=list(self._built),
                    process="one process per list (tuner.measure.vllm_engine.list_run)")

    def measure_estimate(self, graphs: Sequence[tuple[str, int]], runner: str) -> int | None:
        """The graph-memory estimate vLLM itself made starting (None where it made none: the CPU build, 0.34's
        extensible KV cache)."""
        value = self._record.get("estimate_bytes")
        return int(value) if value else None

    def capture(self, graphs: Sequence[tuple[str, int]]) -> CaptureResult:
        """The pool vLLM's own capture took for the list (its capture_model's figure), or the start's
        out-of-memory."""
        oom = self._result.get("oom")
        startup = float(self._result.get("startup_s") or 0.0)
        if oom:
            return CaptureResult(None, oom=oom, capture_s=startup)
        pool = self._record.get("pool_bytes")
        return CaptureResult(int(pool) if pool is not None and self.graphs_supported else None, capture_s=startup,
                             graphs=len(graphs))

    def time_steps(self, plan: Sequence[PlannedStep]) -> list[float]:
        """The replayed plan's times (the slowest rank's per step), vLLM dispatching each step; where vLLM chose
        another mode or padded width than the plan, the record says so (and how many drafter passes the target's
        steps left out, `drafter_calls_skipped`)."""
        ranks = self._result.get("replay") or []
        if not ranks or len(ranks[0]["samples_ms"]) != len(plan):
            raise ValidationError("--backend vllm: the list's run replayed another trace than planned")
        self._record["dispatch"] = dispatch_agreement(plan, ranks[0]["dispatched"])
        self._record["drafter_calls_skipped"] = ranks[0].get("drafter_calls_skipped")
        return [max(r["samples_ms"][i] for r in ranks) for i in range(len(plan))]

    def release(self) -> int | None:
        """Nothing to release: the list's process shut its engine down and exited."""
        return None

    def close(self) -> None:
        """Remove the scratch directory."""
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def engine_record(name: str, config: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """validation.json's `engine` entry of a list from its run's RESULT (`list_run`): the compilation config it was
    given, whether it started, the lists its config kept, its KV cache in blocks and bytes, its estimate and pool
    (the largest rank's), vLLM's memory figures."""
    record: dict[str, Any] = {"name": name, "compilation_config": config,
                              "engine_args": {k: v for k, v in args.items()
                                              if k not in ("model", "compilation_config")},
                              "started": bool(result.get("started")), "oom": result.get("oom"),
                              "startup_s": result.get("startup_s")}
    ranks = result.get("figures") or []
    if not record["started"] or not ranks:
        return record
    first = ranks[0]
    blocks, block = int(result["kv_blocks"]), int(result["block_size"])
    per_token = int(first["kv_cache"]["bytes_per_token"])
    record.update(
        ranks=len(ranks), runner=first["runner"], runner_class=first["runner_class"],
        cudagraph_mode=first["cudagraph_mode"], lists_kept=first["lists"], drafter_class=first.get("drafter_class"),
        kv_blocks=blocks, block_size=block,
        kv_tokens=blocks * block, kv_bytes_per_token=per_token, kv_cache_bytes=blocks * block * per_token,
        pool_bytes=_largest(r["pool_bytes"] for r in ranks),
        estimate_bytes=_largest(r["estimate_bytes"] for r in ranks),
        requested_bytes=first["requested_bytes"], kv_budget_bytes=first["kv_budget_bytes"],
        consumed_bytes=first["consumed_bytes"], peak_activation_bytes=first["peak_activation_bytes"])
    return record


def run_in_process(request: dict[str, Any], where: Path, *, timeout_s: float | None = None) -> dict[str, Any]:
    """`tuner.measure.vllm_engine.list_run` on `request` in a child process (this interpreter, this working
    directory), its log kept in `where`.log; the RESULT it wrote. ValidationError (one line) when it died without one
    or ran past `timeout_s`."""
    import subprocess
    import sys

    req, res = where.with_suffix(".request.json"), where.with_suffix(".result.json")
    log_path = where.with_suffix(".log")
    req.write_text(json.dumps(request))
    with log_path.open("w") as out:
        try:
            proc = subprocess.run([sys.executable, "-m", "tuner.measure.vllm_engine.list_run", str(req), str(res)],
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ValidationError(f"--backend vllm: the list's engine ran past {timeout_s:g} s") from None
    if proc.returncode != 0 or not res.is_file():
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["no output"]
        raise ValidationError(f"--backend vllm: the list's engine process exited {proc.returncode} ({tail[0][:200]})")
    return json.loads(res.read_text())


def _largest(values: Any) -> int | None:
    got = [int(v) for v in values if v is not None]
    return max(got) if got else None


def dispatch_agreement(plan: Sequence[PlannedStep], dispatched: dict[str, list[Any]]) -> dict[str, Any]:
    """The plan's dispatch (the cost model's) against vLLM's for every step: how many steps vLLM ran as planned (mode
    and padded width), how many otherwise, and the first MAX_DISAGREEMENTS distinct steps that differ."""
    same = other = 0
    listed: dict[tuple[int, bool], dict[str, Any]] = {}
    for p in plan:
        mode, width = dispatched.get(f"{p.num_tokens}:{int(p.uniform_decode)}", (None, None))
        planned_width = p.padded_size if p.padded_size is not None else p.num_tokens
        if mode == p.runtime_mode and width == planned_width:
            same += 1
            continue
        other += 1
        key = (p.num_tokens, p.uniform_decode)
        if key not in listed and len(listed) < MAX_DISAGREEMENTS:
            listed[key] = {"num_tokens": p.num_tokens, "uniform_decode": p.uniform_decode,
                           "planned": [p.runtime_mode, planned_width], "vllm": [mode, width]}
    return {"steps_as_planned": same, "steps_otherwise": other, "disagreements": list(listed.values())}
