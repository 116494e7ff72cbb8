"""A fleet catalogue read and validated: the results store, and per deployment its workload file, the GPU kind it
targets and how it is profiled, searched and validated (docs/commands.md, `cgtune fleet`)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.fields import FieldReader, WorkloadError
from tuner.yaml_file import YamlFileError, read_yaml

__all__ = ["BACKENDS", "CPU_KIND", "Catalogue", "CatalogueError", "Deployment", "load_catalogue"]

CPU_KIND = "cpu"
"""The GPU kind of a deployment measured on a CPU (`--device cpu`, the stand-in decoder, no GPU asked of Ray): what
the tests and a rehearsal run; a CPU profile has no graph rows, so such a deployment is searched on `search_profile`."""

BACKENDS = ("auto", "vllm", "stand-in")
"""`cgtune profile --backend` choices, the instrument each deployment is profiled with."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""A deployment name and a GPU kind: a plain file stem (it names a folder of the store; Ray's accelerator types,
H100, A100-80G, H200, fit it)."""



class CatalogueError(ValueError):
    """A catalogue with a bad field; the one-line message names the file, the field and its value."""


@dataclass(frozen=True)
class Deployment:
    """One deployment of the catalogue: a workload on one GPU kind, and how its profile, search and validation run."""

    name: str
    """Unique in the catalogue; its folder in the store is `deployments/<name>/`."""
    workload_path: Path
    """The workload YAML (absolute; relative paths are read from the catalogue's folder)."""
    gpu_kind: str
    """Ray's accelerator type the deployment targets (`accelerator_type:<kind>` resource, e.g. H200), or `cpu`."""
    tensor_parallel_size: int
    """The workload's `model.tensor_parallel_size`: the GPUs its profile and validate tasks ask Ray for."""
    workload_hash: str
    """`Workload.content_hash` of the file when the catalogue was read: what makes a stored result current."""
    backend: str = "auto"
    """The profile's instrument (`cgtune profile --backend`)."""
    max_widths: int | None = None
    """Thin the candidate widths to this many (`cgtune profile --max-widths`); None: every candidate."""
    sizes: tuple[int, ...] | None = None
    """Measure exactly these widths (`cgtune profile --sizes`) instead of the candidates."""
    warmup_ms: float | None = None
    """Warm-up budget per width and mode (None: `cgtune profile`'s default for the device)."""
    rep_ms: float | None = None
    """Timed-repetition budget per width and mode (None: the device's default)."""
    min_reps: int | None = None
    """At least this many timed repetitions (None: the device's default)."""
    compile: bool | None = None
    """Profile the torch.compile'd model (None: unless the workload sets serving.enforce_eager; false is
    `cgtune profile --no-compile`)."""
    trials: int = 100
    """Optuna trials of the search after the exact solver; 0: the exact solver's optimum alone (no optuna)."""
    validate_steps: int = 3000
    """Steps of the validation's replayed trace (`cgtune validate --steps`); 0: no validation."""
    search_profile: Path | None = None
    """A `cpu` deployment only: the profile the search and validation use instead of the measured one (a CPU profile
    has no graph rows to search; as `scripts/gpu_run.py --validate-profiles`, a rehearsal, never a measurement)."""

    @property
    def device(self) -> str:
        """The device the profile and validation run on: `cpu` for the cpu kind, else `cuda` (Ray sets
        CUDA_VISIBLE_DEVICES to the GPUs it gave the task)."""
        return "cpu" if self.gpu_kind == CPU_KIND else "cuda"

    @property
    def num_gpus(self) -> int:
        """GPUs the profile and validate tasks ask for: none on the cpu kind, else one per tensor-parallel rank."""
        return 0 if self.gpu_kind == CPU_KIND else self.tensor_parallel_size

    def settings_hash(self) -> str:
        """A hash of how the deployment is measured, searched and validated (every field but its name, its paths
        and the workload, which the fingerprint names itself): a result made under other settings is stale."""
        settings = {k: v for k, v in asdict(self).items() if k not in (
            "name", "workload_path", "workload_hash", "gpu_kind", "tensor_parallel_size", "search_profile")}
        if self.search_profile is not None:  # its content, not where it lies: a moved catalogue stays current
            settings["search_profile"] = hashlib.sha256(self.search_profile.read_bytes()).hexdigest()[:12]
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def as_dict(self) -> dict[str, Any]:
        """The deployment as plain data (what a Ray task is handed and `from_dict` reads back)."""
        d = asdict(self)
        d["workload_path"] = str(self.workload_path)
        d["search_profile"] = None if self.search_profile is None else str(self.search_profile)
        d["sizes"] = None if self.sizes is None else list(self.sizes)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Deployment:
        d = dict(data)
        d["workload_path"] = Path(d["workload_path"])
        d["search_profile"] = None if d.get("search_profile") is None else Path(d["search_profile"])
        d["sizes"] = None if d.get("sizes") is None else tuple(d["sizes"])
        return cls(**d)


@dataclass(frozen=True)
class Catalogue:
    """A catalogue file read: where the results go and the deployments in it."""

    path: Path
    """The catalogue file."""
    store: Path
    """The results store: a directory every node can write (absolute)."""
    storage: str | None
    """The optuna storage URL every search's study goes to (PostgreSQL across hosts); None: in memory."""
    max_retries: int
    """Times Ray retries a task whose worker or node died (a profile resumes from the widths it had)."""
    deployments: tuple[Deployment, ...]
    """In catalogue order."""

    def deployment(self, name: str) -> Deployment:
        for d in self.deployments:
            if d.name == name:
                return d
        raise KeyError(name)


def _read_sizes(fields: FieldReader, key: str, default: Any) -> tuple[int, ...] | None:
    value = fields.raw(key)
    if value is None:
        return default
    if not isinstance(value, list) or not value or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in value):
        raise WorkloadError(f"{fields.at(key)}: {value!r} must be a non-empty list of integers >= 1")
    return tuple(value)


def _options(fields: FieldReader, defaults: dict[str, Any]) -> dict[str, Any]:
    """The per-deployment settings a `defaults:` section or a deployment gives (each falling back to `defaults`)."""
    return {
        "backend": fields.str("backend", defaults.get("backend", "auto"), choices=BACKENDS),
        "max_widths": fields.int("max_widths", defaults.get("max_widths"), minimum=1),
        "sizes": _read_sizes(fields, "sizes", defaults.get("sizes")),
        "warmup_ms": fields.float("warmup_ms", defaults.get("warmup_ms"), minimum=0.0),
        "rep_ms": fields.float("rep_ms", defaults.get("rep_ms"), minimum=0.0),
        "min_reps": fields.int("min_reps", defaults.get("min_reps"), minimum=1),
        "compile": fields.bool("compile", defaults.get("compile")),
        "trials": fields.int("trials", defaults.get("trials", 100), minimum=0),
        "validate_steps": fields.int("validate_steps", defaults.get("validate_steps", 3000), minimum=0),
    }


def _gpu_kind(fields: FieldReader, defaults: dict[str, Any]) -> str:
    kind = fields.str("gpu_kind", defaults.get("gpu_kind", ...))
    if not _NAME.match(kind):
        raise WorkloadError(f"{fields.at('gpu_kind')}: {kind!r} must be a Ray accelerator type (H200, A100-80G, ...) "
                            f"or {CPU_KIND}")
    return kind


def _path(base: Path, text: str) -> Path:
    path = Path(text).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def load_catalogue(path: str | Path) -> Catalogue:
    """The catalogue file at `path` read and checked, every workload file loaded (its hash and tensor-parallel size);
    CatalogueError (one line: the file, the field, the value) on anything wrong, before anything is run or written."""
    from tuner.workload.spec import load_workload

    path = Path(path)
    try:
        data = read_yaml(path)
    except (YamlFileError, OSError) as exc:
        raise CatalogueError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    base = path.resolve().parent
    try:
        top = FieldReader(data, "")
        store_text = top.str("store")
        storage = top.str("storage", None)
        if storage is not None and "://" not in storage:
            raise WorkloadError(f"storage: {storage!r} is not a storage URL (an SQLite file is sqlite:///PATH)")
        max_retries = top.int("max_retries", 3, minimum=0)
        defaults_fields = FieldReader(top.raw("defaults", {}) or {}, "defaults")
        defaults_fields.takes("gpu_kind")
        defaults = {**_options(defaults_fields, {}), "gpu_kind": None}
        if defaults_fields.has("gpu_kind"):
            defaults["gpu_kind"] = _gpu_kind(defaults_fields, {})
        defaults_fields.done()
        if defaults["gpu_kind"] is None:
            defaults.pop("gpu_kind")
        entries = top.raw("deployments")
        if not isinstance(entries, list) or not entries:
            raise WorkloadError(f"deployments: {entries!r} must be a non-empty list of deployments")
        unknown = sorted(set(map(str, top.data)) - top.used)
        if unknown:
            raise WorkloadError(f"{unknown[0]}: unknown field; a catalogue takes store, storage, max_retries, "
                                f"defaults, deployments")
        deployments: list[Deployment] = []
        seen: dict[str, int] = {}
        for i, entry in enumerate(entries):
            fields = FieldReader(entry, f"deployments[{i}]")
            fields.takes("search_profile")
            workload_text = fields.str("workload")
            workload_path = _path(base, workload_text)
            try:
                workload = load_workload(workload_path)
            except (WorkloadError, OSError) as exc:
                raise WorkloadError(f"{fields.at('workload')}: {workload_text!r}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
            kind = _gpu_kind(fields, defaults)
            name = fields.str("name", f"{workload.name}-{kind}")
            if not _NAME.match(name):
                raise WorkloadError(f"{fields.at('name')}: {name!r} must be a plain name (letters, digits, . _ -)")
            if name in seen:
                raise WorkloadError(f"{fields.at('name')}: {name!r} is deployments[{seen[name]}]'s name too")
            seen[name] = i
            options = _options(fields, defaults)
            if options["sizes"] is not None and options["max_widths"] is not None:
                raise WorkloadError(f"{fields.at('sizes')}: give sizes or max_widths, not both")
            if options["compile"] and workload.serving.enforce_eager:
                raise WorkloadError(f"{fields.at('compile')}: true, but {workload_text!r} sets serving.enforce_eager: "
                                    f"true (vLLM runs no compiled model there)")
            search_profile = None
            if fields.has("search_profile"):
                text = fields.str("search_profile")
                if kind != CPU_KIND:
                    raise WorkloadError(f"{fields.at('search_profile')}: {text!r}: only a {CPU_KIND} deployment takes "
                                        f"one (on a GPU the profile measured there is searched)")
                search_profile = _path(base, text)
                if not search_profile.is_file():
                    raise WorkloadError(f"{fields.at('search_profile')}: {text!r} is not a file")
            fields.done()
            deployments.append(Deployment(
                name=name, workload_path=workload_path, gpu_kind=kind,
                tensor_parallel_size=workload.model.tensor_parallel_size, workload_hash=workload.content_hash,
                search_profile=search_profile, **options))
    except WorkloadError as exc:
        raise CatalogueError(f"{path}: {exc}") from None
    store = _path(base, store_text)
    if store.exists() and not store.is_dir():
        raise CatalogueError(f"{path}: store: {store_text!r} exists and is not a directory")
    return Catalogue(path=path, store=store, storage=storage, max_retries=max_retries, deployments=tuple(deployments))
