"""Issue 21's list of bad input that used to get through (a traceback, a silent truncation, a file made, the wrong
deployment modelled): each is now one line naming the file or field and the value, exit code 2, and nothing written.
Hand-made profiles: test fixtures, never measurements."""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (import-mode=importlib)
from handmade_profiles import handmade_spec, mixed_traffic, write_handmade_inputs  # noqa: E402
from cli_runner import run  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SGLANG = ROOT / "workloads/sglang-eagle-llama-3.1-8b.yaml"
TRTLLM = ROOT / "workloads/trtllm-eagle3-llama-3.1-8b.yaml"
SPEC = handmade_spec(name="bad-hand", max_num_seqs=8, num_speculative_tokens=1, max_num_batched_tokens=64,
                     traffic=mixed_traffic(8, 64))


def one_line(code: int, out: str, err: str, *needles: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr holding every needle, no traceback."""
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def refused_search(capsys, tmp_path: Path, spec: dict, *needles: str) -> None:
    """`cgtune search` of a workload (written as given) on a profile for SPEC: one line, and no run directory."""
    _, profile, _ = write_handmade_inputs(tmp_path, SPEC, list(range(1, 65)))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "run"
    one_line(*run(capsys, "search", path, "--profile", profile, "--out", out, "--no-progress"), *needles)
    assert not out.exists()


def edited(base: Path | dict, **sections: dict) -> dict:
    """A copy of a workload (a shipped file or a mapping) with keys of its sections replaced."""
    data = yaml.safe_load(base.read_text()) if isinstance(base, Path) else copy.deepcopy(base)
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return data


# ------------------------------------------------------------------------------------------------- workload fields
def test_an_infinite_kv_requirement_is_one_line(tmp_path, capsys):
    refused_search(capsys, tmp_path, edited(SPEC, serving={"required_kv_gib": float("inf")}),
                   "serving.required_kv_gib: inf must be a finite number")


def test_v2_pinned_for_suffix_decoding_is_refused(tmp_path, capsys):
    spec = edited(SPEC, serving={"model_runner": "v2", "num_speculative_tokens": 4},
                  speculative={"method": "suffix"})
    refused_search(capsys, tmp_path, spec, "serving.model_runner: model_runner='v2': vLLM 0.33 has no V2 support "
                                           "for speculative method 'suffix'; use auto or v1")


@pytest.mark.parametrize(("base", "speculative", "needle"), [
    (SPEC, {"method": "ngram", "parallel_drafting": True},
     "speculative.parallel_drafting: true needs a drafter trained to draft in parallel (method eagle, eagle3, "
     "draft_model, dflash, dspark), not method 'ngram'"),
    (TRTLLM, {"method": "eagle3", "parallel_drafting": True, "drafter": {"num_layers": 1}},
     "speculative.parallel_drafting: true is vLLM's (P-EAGLE/PARD on its V1 runner); engine trtllm has no such "
     "setting"),
])
def test_parallel_drafting_where_nothing_drafts_in_parallel_is_refused(tmp_path, capsys, base, speculative, needle):
    spec = edited(base, speculative=speculative)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    one_line(*run(capsys, "defaults", path), needle)


@pytest.mark.parametrize(("base", "serving", "needle"), [
    (SGLANG, {"max_running_requests": -1}, "serving.max_running_requests: -1 must be >= 1"),
    (SGLANG, {"context_length": 0}, "serving.context_length: 0 must be >= 1"),
    (TRTLLM, {"max_batch_size": 0}, "serving.max_batch_size: 0 must be >= 1"),
    (TRTLLM, {"max_draft_len": "three"}, "serving.max_draft_len: 'three' must be an integer"),
    # a traffic error names the engine's request cap too
    (SGLANG, {"max_running_requests": 64}, "traffic.requests.max: 128 must be <= max_running_requests=64"),
])
def test_engine_field_errors_name_the_key_the_user_wrote(tmp_path, capsys, base, serving, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(edited(base, serving=serving)))
    code, out, err = run(capsys, "defaults", path)
    one_line(code, out, err, needle)
    assert "max_num_seqs" not in err and "num_speculative_tokens" not in err


def test_a_key_given_twice_is_refused_with_its_line(tmp_path, capsys):
    text = yaml.safe_dump(SPEC, sort_keys=False).replace("  max_num_seqs: 8\n", "  max_num_seqs: 8\n  max_num_seqs: 64\n")
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    line = text.splitlines().index("  max_num_seqs: 64") + 1
    one_line(*run(capsys, "defaults", path),
             f"twice.yaml line {line}: duplicate key 'max_num_seqs' (YAML would keep the last one silently)")


def test_a_yaml_that_is_not_utf8_names_the_file(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(yaml.safe_dump(SPEC).encode().replace(b"name: bad-hand", b"name: bad-hand\ndescription: caf\xe9"))
    one_line(*run(capsys, "defaults", path), "latin1.yaml: not UTF-8 text (byte 0xe9 at offset")


def test_a_trace_row_flagged_uniform_that_no_decode_step_is_is_refused(tmp_path, capsys):
    # q = 17 (16 draft tokens): 32 requests make 544 tokens, so 545 tokens flagged uniform is no uniform decode step.
    trace = tmp_path / "steps.csv"
    trace.write_text("num_tokens,num_reqs,is_uniform_decode\n544,32,true\n545,32,true\n")
    spec = handmade_spec(name="traced", max_num_seqs=32, num_speculative_tokens=16, max_num_batched_tokens=1024,
                         traffic={"trace": "steps.csv"})
    path = tmp_path / "traced.yaml"
    path.write_text(yaml.safe_dump(spec))
    one_line(*run(capsys, "defaults", path),
             "traffic.trace: steps.csv line 3: is_uniform_decode=true but num_tokens=545 is not num_reqs=32 x q=17 = "
             "544: not a uniform decode step")


# ----------------------------------------------------------------------------------------------------- profiles
def test_a_fractional_token_count_in_a_profile_is_not_truncated(tmp_path, capsys):
    wl, profile, _ = write_handmade_inputs(tmp_path, SPEC, list(range(1, 65)))
    lines = profile.read_text().splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.startswith("64,"))
    lines[row] = "64.5," + lines[row].split(",", 1)[1]
    profile.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    one_line(*run(capsys, "search", wl, "--profile", profile, "--out", out, "--no-progress"),
             f"line {row + 1}: num_tokens: '64.5' must be a whole number")
    assert not out.exists()


# -------------------------------------------------------------------------------------------------------- commands
def test_status_of_a_mistyped_sqlite_storage_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line(*run(capsys, "status", "--storage", "sqlite:///typo.db"),
             "--storage: sqlite:///typo.db names no database file (typo.db does not exist)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("base", [SGLANG, TRTLLM], ids=["sglang", "trtllm"])
def test_from_metrics_with_a_base_that_exports_no_vllm_metrics_is_one_line(tmp_path, capsys, base):
    out = tmp_path / "real.yaml"
    one_line(*run(capsys, "workload", "from-metrics", tmp_path / "metrics.prom", "--base", base, "--out", out),
             f"--base: {base} deploys on", "whose server exports no vllm:iteration_tokens_total histogram")
    assert not out.exists()


def test_from_trace_keeps_the_bases_engine(tmp_path, capsys):
    # The derived workload used to lose `engine:` and be read as vLLM's ("serving.max_num_seqs: missing").
    trace = tmp_path / "steps.csv"
    trace.write_text("num_tokens\n64\n128\n8192\n")
    out = tmp_path / "traced.yaml"
    code, printed, err = run(capsys, "workload", "from-trace", trace, "--base", SGLANG, "--out", out)
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["engine"] == "sglang" and ": 3 steps," in printed


@pytest.fixture()
def finished_run(tmp_path, capsys):
    wl, profile, _ = write_handmade_inputs(tmp_path, SPEC, list(range(1, 65)))
    out = tmp_path / "run"
    code, _, err = run(capsys, "search", wl, "--profile", profile, "--out", out, "--trials", 6, "--no-progress")
    assert code == 0, err
    return out


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_report_into_a_read_only_run_dir_is_one_line(finished_run, capsys):
    before = _files(finished_run)
    finished_run.chmod(0o555)
    try:
        one_line(*run(capsys, "report", finished_run), f"run_dir: {str(finished_run)!r} cannot be written")
    finally:
        finished_run.chmod(0o755)
    assert _files(finished_run) == before


def test_report_whose_folder_refuses_a_file_is_one_line_and_leaves_the_run_as_it_was(finished_run, capsys,
                                                                                       monkeypatch):
    # What a read-only folder answers, for any user (root may write anywhere): the staging folder cannot be made.
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(finished_run))

    before = _files(finished_run)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    one_line(*run(capsys, "report", finished_run),
             f"run_dir: {str(finished_run)!r} cannot be written: Permission denied")
    assert _files(finished_run) == before


def test_the_engine_note_on_unmodelled_drafters_is_a_whole_sentence(tmp_path):
    wl = yaml.safe_load(SGLANG.read_text())
    spec = handmade_spec(name="sg", engine="sglang", max_num_seqs=8, num_speculative_tokens=0,
                         max_num_batched_tokens=64, speculative=wl["speculative"])
    spec["serving"] = {"max_running_requests": 8, "speculative_num_steps": 3, "chunked_prefill_size": 64,
                       "context_length": 64}
    _, profile, workload = write_handmade_inputs(tmp_path, spec, list(range(1, 65)))
    notes = CostModel.from_files(profile, workload).notes
    assert ("sglang's drafter graphs and passes are not modelled (vLLM's rules only); the drafter's weights and KV "
            "layers are counted") in notes


# ------------------------------------------------------------------------------------------------- issue 50's list
@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_a_max_num_seqs_no_deployment_has_is_one_line_at_once_from_flags_and_from_a_file(tmp_path, capsys, release):
    # It once ran 164 s and grew to 23 GB before it was killed: every request count is a step the model weighs.
    one_line(*run(capsys, "defaults", "--max-num-seqs", 1_000_000_000, "--num-speculative-tokens", 3,
                  "--vllm-version", release),
             "argument --max-num-seqs: 1000000000 must be <= 65536 (the most requests per step cgtune models")
    refused_search(capsys, tmp_path, edited(SPEC, serving={"max_num_seqs": 1_000_000_000, "vllm_version": release,
                                                           "max_num_batched_tokens": 10**10}),
                   "serving.max_num_seqs: 1000000000 must be <= 65536")


@pytest.mark.parametrize("out", ["/proc/cgtune-x", "/proc"])
def test_an_out_folder_the_filesystem_takes_nothing_in_is_one_line(tmp_path, capsys, out):
    _, profile, _ = write_handmade_inputs(tmp_path, SPEC, list(range(1, 65)))
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    one_line(*run(capsys, "search", path, "--profile", profile, "--out", out, "--no-progress"),
             f"cgtune search: error: --out: {out!r} cannot be written: ", "('/proc' takes no new files)")
    assert not Path("/proc/cgtune-x").exists() and not list(tmp_path.glob("**/.cgtune-probe-*"))


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_a_max_model_len_no_kv_cache_holds_is_blamed_on_itself_not_on_the_list(tmp_path, capsys, release):
    refused_search(capsys, tmp_path, edited(SPEC, serving={"max_model_len": 10**12, "vllm_version": release}),
                   "no capture list fits, not even the empty one: serving.max_model_len=1000000000000: one request "
                   "that long needs ", "(lower serving.max_model_len, or give the deployment more memory)")


def test_the_common_flag_is_taken_after_a_commands_action_too(capsys):
    # `cgtune workload buckets X --vllm-version 0.33` was refused as an unrecognized argument.
    after = run(capsys, "workload", "buckets", ROOT / "workloads/dflash-llama-3.1-8b.yaml", "--vllm-version", "0.34")
    before = run(capsys, "workload", "--vllm-version", "0.34", "buckets", ROOT / "workloads/dflash-llama-3.1-8b.yaml")
    assert after[0] == 0 and after == before
    one_line(*run(capsys, "workload", "buckets", ROOT / "workloads/dflash-llama-3.1-8b.yaml", "--vllm-version", "0.4"),
             "argument --vllm-version: invalid choice: '0.4'")
