"""The shipped multi-LoRA and data-parallel workloads' files, read back by vLLM's own `vllm serve` parser
(tests/vllm/vllm_serve_parse.py, in a process of its own): 0.33.0 installed, 0.34.0 from CGTUNE_VLLM034_PATH. The flag
line and the YAML carry `--enable-lora`, `--max-loras`, `--max-lora-rank` (and `--specialize-active-lora`), the
compilation config `cudagraph_specialize_lora`, and `--data-parallel-size`, with the tuned lists under each release's
names. The slow cases search each workload end to end on a synthetic profile (a fixture, never a measurement: the widths
written here from each release's own key widths, since benchmarks/bench_search.py's writer puts 0.34's negative decode
keys among the widths) and parse what `cgtune search` wrote. GPU validation, whose replay runs one engine's steps with
no adapter, refuses both deployments in one line before any work."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))
from handmade_profiles import GIB, MIB, handmade_profile  # noqa: E402
from vllm_code import require_vllm_033, vllm_034_code  # noqa: E402

from tuner.engines.engine import flag_file_line  # noqa: E402
from tuner.workload.spec import Workload, load_workload  # noqa: E402

LORA = ROOT / "workloads/lora-llama-3.1-8b.yaml"
DP = ROOT / "workloads/dp4-moe-cpu.yaml"
VERSIONS = {"0.33": "0.33.0", "0.34": "0.34.0"}


def _pinned(path: Path, version: str) -> Workload:
    wl = load_workload(path)
    return dataclasses.replace(wl, serving=dataclasses.replace(wl.serving, vllm_version=version))


def _parse(version: str, argvs: dict[str, list[str]]) -> dict[str, Any]:
    """vLLM `version`'s own parse of each `vllm serve` argv."""
    env = dict(os.environ)
    if version == "0.34":
        env["PYTHONPATH"] = os.pathsep.join([str(vllm_034_code()), str(ROOT)])
    else:
        require_vllm_033()
    proc = subprocess.run([sys.executable, str(TESTS / "vllm/vllm_serve_parse.py")], env=env, cwd=ROOT,
                          input=json.dumps({"version": VERSIONS[version], "parse": argvs}), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["status"] == "ok", answer
    return answer["parsed"]


def _files(wl: Workload, out: Path) -> Path:
    """The engine's files for its default list, written into `out`."""
    from tuner.engines.vllm.emit import Provenance

    engine = wl.engine
    provenance = Provenance("test", "none", "handmade test fixture", wl.name, "2026-01-01T00:00Z")
    for name, text in engine.render_files(engine.defaults().sizes, wl.deployment, provenance=provenance,
                                          cudagraph_mode=engine.effective_cudagraph_mode).items():
        (out / name).write_text(text)
    return out


def _argvs(out: Path) -> dict[str, list[str]]:
    """`vllm serve` argv of the run's YAML and of its flag line."""
    line = flag_file_line(out / "vllm-flags.txt")
    assert line is not None
    return {"yaml": ["--config", str(out / "vllm-serve.yaml")], "flags": ["some/model", *shlex.split(line)]}


def _check(parsed: dict[str, Any], out: Path, wl: Workload) -> None:
    """vLLM's own parser read the LoRA and DP settings, and the lists, from both the YAML and the flag line."""
    cc = json.loads((out / "compilation_config.json").read_text())
    s = wl.serving
    for form, got in parsed.items():
        assert got["data_parallel_size"] == s.data_parallel_size, form
        if s.lora is None:
            assert got["lora"] is None, form
        else:
            assert got["lora"] == {"max_loras": s.lora.max_loras, "max_lora_rank": s.lora.max_lora_rank,
                                   "specialize_active_lora": s.lora.specialize_active_lora,
                                   "cudagraph_specialize_lora": s.lora.cudagraph_specialize_lora}, form
        for name in ("cudagraph_capture_sizes", "prefill_cudagraph_capture_token_sizes",
                     "decode_cudagraph_capture_request_sizes"):
            if name in cc:
                assert got[name] == cc[name], (form, name)


def _cases() -> dict[str, Workload]:
    """The shipped workloads under each release, and the LoRA one with both LoRA graph settings off their default."""
    cases = {f"{name}-{v}": _pinned(path, v) for name, path in (("lora", LORA), ("dp", DP)) for v in VERSIONS}
    wl = cases["lora-0.34"]
    lora = dataclasses.replace(wl.serving.lora, specialize_active_lora=True, cudagraph_specialize_lora=False)
    cases["lora off defaults-0.34"] = dataclasses.replace(wl, serving=dataclasses.replace(wl.serving, lora=lora))
    return cases


@pytest.fixture(scope="module")
def parsed_files(tmp_path_factory) -> dict[str, tuple[Workload, Path, dict[str, Any]]]:
    """Each case's files and vLLM's parse of them: one parser process per release."""
    out: dict[str, tuple[Workload, Path, dict[str, Any]]] = {}
    for version in VERSIONS:
        runs = {name: (wl, _files(wl, tmp_path_factory.mktemp(name.replace(" ", "-"))))
                for name, wl in _cases().items() if name.endswith(version)}
        argvs = {f"{name}/{form}": argv for name, (_, run) in runs.items() for form, argv in _argvs(run).items()}
        parsed = _parse(version, argvs)
        for name, (wl, run) in runs.items():
            out[name] = (wl, run, {form: parsed[f"{name}/{form}"] for form in ("yaml", "flags")})
    return out


@pytest.mark.parametrize("case", list(_cases()))
def test_vllms_own_parser_reads_the_lora_and_dp_settings(parsed_files, case):
    wl, run, parsed = parsed_files[case]
    _check(parsed, run, wl)


def _synthetic_profile(wl: Workload, out: Path) -> Path:
    """A made-up profile at the deployment's scale over the release's default graphs' widths, every decode width and
    a 64-token grid above 512 (a fixture)."""
    s, q = wl.serving, wl.serving.decode_query_len
    widths = (set(wl.engine.key_widths(wl.engine.defaults().sizes)) | {n * q for n in range(1, s.max_num_seqs + 1)}
              | set(range(576, s.max_num_batched_tokens + 1, 64)))
    big = wl.model.preset is not None
    return handmade_profile(out, wl, sorted(w for w in widths if 0 < w <= s.max_num_batched_tokens),
                            eager_ms=lambda w: 6.0 + 0.004 * w, full_ms=lambda w: 1.5 + 0.004 * w,
                            piecewise_ms=lambda w: 3.5 + 0.004 * w,
                            standalone_bytes=lambda w: 64 * MIB + 600_000 * w, delta_bytes=lambda w: 2 * MIB + 4096 * w,
                            total_memory_bytes=(141 if big else 8) * GIB, weights_bytes=wl.model.weight_bytes(),
                            activation_peak_bytes=(4 if big else 1) * GIB, name="synthetic")


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33", "0.34"])
@pytest.mark.parametrize("path", [LORA, DP], ids=["lora", "dp"])
def test_the_shipped_workload_is_searched_and_emitted_end_to_end(tmp_path, path, version):
    wl = _pinned(path, version)
    profile = _synthetic_profile(wl, tmp_path / "profile")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "search", str(path), "--profile", str(profile), "--out",
                           str(out), "--trials", "8", "--no-progress", "--vllm-version", version],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    notes = " ".join(summary["notes"])
    if wl.serving.lora is not None:
        assert "captures every graph once per LoRA case" in notes and "LoRA weight buffers" in notes
    else:
        assert "data_parallel_size 4: each step a rank replays" in notes
    _check(_parse(version, _argvs(out)), out, wl)
    # The GPU replay runs one engine's steps with no adapter: it refuses to stand for such a deployment.
    from tuner.validate.validation import ValidationError, validate_run

    with pytest.raises(ValidationError, match="is not validated yet"):
        validate_run(out, backend=object())  # type: ignore[arg-type]


@pytest.mark.parametrize("path, field", [(LORA, "serving.enable_lora: true"), (DP, "serving.data_parallel_size: 4")])
def test_validation_refuses_lora_and_dp_in_one_line_before_any_work(tmp_path, capsys, path, field):
    from cli_runner import run

    profile = tmp_path / "profile.csv"
    profile.write_text("not read: the refusal comes first\n")
    for argv in (("tune", path, "--profile", profile, "--out", tmp_path / "tuned", "--validate", 1, "--no-progress"),
                 ("validate", tmp_path / "exact", "--workload", path, "--profile", profile)):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.strip().count("\n") == 0, (argv[0], err)
        assert f"{field} is not validated yet" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.csv"]
