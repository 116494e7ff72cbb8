"""`cgtune workload`: make workloads from real traffic (vLLM metrics, step traces) and the buckets that resolve it."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import textwrap
import time
from pathlib import Path

from tuner.cli import Command, UsageError
from tuner.commands.common import check_out_dir, load_workload_arg, positive_float
from tuner.workload.spec import Workload
from tuner.workload.traffic import (
    ITERATION_TOKENS,
    Scrapes,
    TrafficError,
    buckets_json,
    derived_spec,
    observed_load,
    parse_exposition,
    read_histogram,
    read_source,
    spread_histogram,
    write_workload,
)
from tuner.workload.traffic.metrics import TokenHistogram

__all__ = ["WorkloadCommand"]

# The clock and the pause of --wait, names of their own so a test replaces them without touching the time module.
_clock = time.monotonic
_sleep = time.sleep


def _timed_read(source: str, timeout_s: float) -> tuple[float, str]:
    """A scrape and when it was taken: the middle of the fetch, since the server renders it somewhere in between."""
    start = _clock()
    text = read_source(source, timeout_s=timeout_s)
    return (start + _clock()) / 2, text


def _source_label(source: str) -> str:
    return "stdin" if source == "-" else source


def _name_for(args: argparse.Namespace, out: Path) -> str:
    name = args.name if args.name is not None else out.stem
    if not name or any(c in name for c in "/\\ \t\n"):
        raise UsageError(f"--name: {name!r} must be non-empty without spaces or slashes (it defaults to the --out stem)")
    return name


def _check_out(out: Path, force: bool) -> None:
    """Fail before any scraping when the output cannot be written, so no work is thrown away."""
    if out.exists() and not force:
        raise UsageError(f"--out: {out} exists (pass --force to replace it)")
    check_out_dir(out, directory=False)  # missing parent folders are created, as every command's --out


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _series_text(hist: TokenHistogram) -> str:
    labels = [",".join(f"{k}={v}" for k, v in key) or "(no labels)" for key in hist.series]
    return "; ".join(labels)


class WorkloadCommand(Command):
    help = "make a workload from a running vLLM server's metrics or a step trace; print the buckets that resolve it"
    description = (
        "Build a workload's traffic from what a real vLLM server did, instead of guessing it.\n\n"
        "  buckets       print the --custom-histogram-buckets JSON that makes vLLM's\n"
        "                vllm:iteration_tokens_total histogram resolve every candidate capture size\n"
        "  from-metrics  read that histogram from a /metrics scrape (or two, for an interval) and write\n"
        "                a workload whose traffic.widths is the observed step-width distribution (and,\n"
        "                over an interval, traffic.load: request rate, lengths, acceptance)\n"
        "  from-trace    write a workload whose traffic is a per-step CSV trace you logged yourself\n\n"
        "recipe:\n"
        "  vllm serve MODEL ... --custom-histogram-buckets \"$(cgtune workload buckets base.yaml)\"\n"
        "  cgtune workload from-metrics http://127.0.0.1:8000/metrics --base base.yaml --out real.yaml\n"
        "  cgtune defaults real.yaml   # then profile / search with real.yaml"
    )

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest="workload_action", metavar="ACTION", required=True)
        fmt = argparse.RawDescriptionHelpFormatter

        b = sub.add_parser(
            "buckets", formatter_class=fmt,
            help="print the --custom-histogram-buckets JSON that resolves a workload's candidate capture sizes",
            description=(
                "Print {\"iteration_tokens\": [...]} for vLLM's --custom-histogram-buckets. The bounds are every\n"
                "candidate capture size of the workload's serving config (vLLM's default grid, every uniform\n"
                "decode width n x q up to max_num_seqs, and vLLM's 16-token stride grid continued above the\n"
                "512/1024 ceiling to the widest decode batch) plus max_num_batched_tokens. A server started\n"
                "with them counts steps per capture size exactly, so `cgtune workload from-metrics` needs no\n"
                "guess about where inside a bucket the steps were.\n\n"
                "example:\n"
                "  vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 128 ... \\\n"
                "      --custom-histogram-buckets \"$(cgtune workload buckets workloads/dflash-llama-3.1-8b.yaml)\""
            ),
        )
        b.add_argument("workload", help="workload YAML whose serving section matches the server's flags")

        m = sub.add_parser(
            "from-metrics", formatter_class=fmt,
            help="write a workload whose step widths (and load) come from vLLM's metrics",
            description=(
                "Read vllm:iteration_tokens_total (a Prometheus histogram of tokens per engine step) from a\n"
                "scrape and write a workload: model and serving from --base, traffic.widths from the\n"
                "histogram. Series of all engines and models are summed unless --engine/--model-name pick\n"
                "one. With --before, only the steps between the two scrapes count (e.g. one benchmark run).\n"
                "Inside a bucket the steps are spread by the serving config (decode steps at multiples of\n"
                "q = 1 + num_speculative_tokens); what was assumed goes into traffic.source_note and the\n"
                "file's header comment. Bad input prints one line, exits 2 and writes nothing.\n\n"
                "Over an interval of known length (--wait, or --before with --elapsed) it also writes\n"
                "traffic.load (the lengths and acceptance `cgtune search --rate` simulates): rate_per_s =\n"
                "finished requests (vllm:request_success_total, every finished_reason) / seconds;\n"
                "prompt_tokens and output_tokens from vllm:request_prompt_tokens / vllm:request_generation_tokens,\n"
                "each bucket's requests at its middle whole length rounded down (the +Inf bucket ends at\n"
                "serving.max_model_len; the longest prompt and output cut in proportion when together they\n"
                "exceed it); and, when --base speculates, acceptance = 1 + vllm:spec_decode_num_accepted_tokens /\n"
                "vllm:spec_decode_num_drafts (clipped to 1..q). Without an interval's seconds, or when the\n"
                "scrapes lack one of these metrics, no traffic.load is written and one note line on stderr\n"
                "says why.\n\n"
                "examples:\n"
                "  cgtune workload from-metrics http://127.0.0.1:8000/metrics --base base.yaml --out real.yaml\n"
                "  cgtune workload from-metrics http://127.0.0.1:8000/metrics --wait 600 --base base.yaml --out hour.yaml\n"
                "  curl -s localhost:8000/metrics > t0.prom; run-benchmark; curl -s localhost:8000/metrics > t1.prom\n"
                "  cgtune workload from-metrics t1.prom --before t0.prom --elapsed 900 --base base.yaml --out b.yaml\n"
                "  curl -s localhost:8000/metrics | cgtune workload from-metrics - --base base.yaml --out real.yaml"
            ),
        )
        m.add_argument("source", nargs="?", metavar="SOURCE",
                       help="the (later) scrape: a saved Prometheus text file, '-' for stdin, or an "
                            "http://host:port/metrics URL")
        m.add_argument("--after", metavar="SOURCE", help="the later scrape, same as SOURCE (give one of the two)")
        m.add_argument("--before", metavar="SOURCE",
                       help="an earlier scrape of the same server run: only steps and requests after it count")
        m.add_argument("--base", required=True, metavar="WORKLOAD",
                       help="workload YAML supplying model and serving config (must match the server's flags)")
        m.add_argument("--out", required=True, type=Path, metavar="NEW.yaml", help="workload file to write")
        m.add_argument("--force", action="store_true", help="replace --out if it exists")
        m.add_argument("--name", help="workload name (default: the --out file name without .yaml)")
        m.add_argument("--engine", metavar="E",
                       help="use only series with label engine=E (vLLM's engine index, e.g. 0), of every metric "
                            "read; default: sum all")
        m.add_argument("--model-name", metavar="M",
                       help="use only series with label model_name=M (the served model name), of every metric "
                            "read; default: sum all")
        m.add_argument("--metric", default=ITERATION_TOKENS,
                       help=f"histogram to read (default {ITERATION_TOKENS})")
        m.add_argument("--wait", type=positive_float, metavar="SECONDS",
                       help="scrape the SOURCE URL twice, this many seconds apart, and keep only the steps and "
                            "requests in between (instead of --before); the real time between the scrapes is "
                            "measured for the request rate")
        m.add_argument("--elapsed", type=positive_float, metavar="SECONDS",
                       help="with --before: the seconds between the two saved scrapes, for traffic.load's request "
                            "rate (--wait measures its own)")
        m.add_argument("--timeout", type=positive_float, default=5.0, metavar="SECONDS",
                       help="give up on a URL after this long (default 5)")

        t = sub.add_parser(
            "from-trace", formatter_class=fmt,
            help="write a workload whose traffic is a per-step CSV trace",
            description=(
                "Write a workload whose traffic is `trace: TRACE.csv` (referenced relative to --out, so keep\n"
                "the two together). The CSV has a num_tokens column per engine step and optionally num_reqs\n"
                "and is_uniform_decode (true/false); without them a step is taken as uniform decode when\n"
                "num_tokens is a multiple of q within max_num_seqs x q. The trace is validated against\n"
                "--base's serving config before anything is written.\n\n"
                "example:\n"
                "  cgtune workload from-trace steps.csv --base workloads/dflash-llama-3.1-8b.yaml --out traced.yaml"
            ),
        )
        t.add_argument("trace", metavar="TRACE.csv", help="per-step CSV: num_tokens[, num_reqs, is_uniform_decode]")
        t.add_argument("--base", required=True, metavar="WORKLOAD", help="workload YAML supplying model and serving")
        t.add_argument("--out", required=True, type=Path, metavar="NEW.yaml", help="workload file to write")
        t.add_argument("--force", action="store_true", help="replace --out if it exists")
        t.add_argument("--name", help="workload name (default: the --out file name without .yaml)")

    def run(self, args: argparse.Namespace) -> int:
        try:
            if args.workload_action == "buckets":
                print(buckets_json(_vllm_base(args.workload, "workload").serving))
                return 0
            if args.workload_action == "from-metrics":
                return self._from_metrics(args)
            return self._from_trace(args)
        except TrafficError as exc:
            raise UsageError(str(exc)) from None

    # ----------------------------------------------------------------------- from-metrics
    def _scrapes(self, args: argparse.Namespace, after: str) -> Scrapes:
        """The scrape text(s): one; the URL twice, --wait apart (the seconds between them measured); or --before's."""
        where = _source_label(after)
        select = {"engine": args.engine, "model_name": args.model_name}
        if args.wait is not None:
            first_at, early_text = _timed_read(after, args.timeout)
            # Both scrapes come from the same URL; the first is checked at once so a typo fails before the wait.
            parse_exposition(early_text, args.metric, where=where)
            if sys.stderr.isatty():  # progress for a person waiting; never mixed into captured error output
                print(f"scraped {after}; scraping again in {args.wait:g} s", file=sys.stderr)
            _sleep(args.wait)
            second_at, late_text = _timed_read(after, args.timeout)
            first = f"{where} (first scrape)"
            return Scrapes(late_text, where, early_text, first, first, elapsed_s=second_at - first_at, **select)
        late_text = read_source(after, timeout_s=args.timeout)
        if args.before is None:
            return Scrapes(late_text, where, **select)
        early_where = _source_label(args.before)
        early_text = read_source(args.before, timeout_s=args.timeout)
        return Scrapes(late_text, where, early_text, early_where, f"--before {early_where}", elapsed_s=args.elapsed,
                       **select)

    def _histogram(self, args: argparse.Namespace, scrapes: Scrapes) -> TokenHistogram:
        hist = read_histogram(scrapes, args.metric)
        if hist.count <= 0:
            span = "between the two scrapes" if scrapes.before is not None else "yet"
            raise TrafficError(f"{scrapes.where}: {args.metric} holds zero steps {span} (send traffic to the server "
                               "first)")
        return hist

    def _from_metrics(self, args: argparse.Namespace) -> int:
        if args.source is not None and args.after is not None:
            raise UsageError("--after: give the later scrape either as SOURCE or as --after, not both")
        after = args.source if args.source is not None else args.after
        if after is None:
            raise UsageError("SOURCE: required (a metrics file, '-' for stdin, or an http://host:port/metrics URL)")
        if after == "-" and args.before == "-":
            raise UsageError("--before: stdin ('-') can hold only one of the two scrapes")
        if args.wait is not None:
            if args.before is not None:
                raise UsageError("--wait: give either --wait (two scrapes of one URL) or --before, not both")
            if not after.startswith(("http://", "https://")):
                raise UsageError(f"--wait: needs SOURCE to be a URL to scrape twice, not {after!r}")
        if args.elapsed is not None and args.before is None:
            raise UsageError("--elapsed: only with --before (the seconds between the two saved scrapes; "
                             "--wait measures its own)")
        name = _name_for(args, args.out)
        _check_out(args.out, args.force)
        base = _vllm_base(args.base, "--base")

        scrapes = self._scrapes(args, after)
        hist = self._histogram(args, scrapes)
        where = scrapes.where
        spread = spread_histogram(hist, base.serving, where=where)
        # Read before anything is written: corrupt request metrics (a counter that went down) fail the command.
        load = observed_load(scrapes, q=base.serving.decode_query_len, max_model_len=base.serving.max_model_len)
        if args.wait is not None:
            assert scrapes.elapsed_s is not None
            source = f"{where} (interval of {args.wait:g} s; {scrapes.elapsed_s:.6g} s measured between the scrapes)"
        elif args.before is not None:
            timed = f" of {args.elapsed:g} s" if args.elapsed is not None else ""
            source = f"{_source_label(args.before)} -> {where} (interval{timed})"
        else:
            source = where
        observed_mean = hist.mean_width
        facts = [
            f"Step widths from {args.metric} at {source}, read {_now()}: {hist.count:g} steps, "
            f"series summed: {_series_text(hist)}.",
            f"Mean width: {observed_mean:.1f} tokens observed (_sum/_count), {spread.mean_width:.1f} in this spread."
            if observed_mean is not None else f"Mean width in this spread: {spread.mean_width:.1f} tokens.",
        ]
        if spread.unresolved:
            shown = ", ".join(map(str, spread.unresolved[:8])) + (", ..." if len(spread.unresolved) > 8 else "")
            resolution = (
                f"The buckets leave {len(spread.unresolved)} of {spread.candidates} candidate capture sizes inside a "
                f"bucket ({shown}); for exact counts run vLLM with --custom-histogram-buckets from "
                f"`cgtune workload buckets {args.base}`."
            )
        else:
            resolution = f"The buckets resolve all {spread.candidates} candidate capture sizes."
        note = " ".join([*facts, *spread.assumptions, resolution, *load.facts])
        shown_source = where if "://" in where else Path(where).name
        description = f"{base.description or base.name}; traffic from vLLM metrics ({shown_source})"
        traffic: dict[str, object] = {"widths": spread.counts, "source_note": note}
        if load.section is not None:
            traffic["load"] = load.section
        spec = derived_spec(base, traffic, name=name, description=description)
        header = [
            f"Made by `cgtune workload from-metrics` from {source} on {_now()}.",
            f"Model and serving config copied from {args.base}.",
            f"traffic.widths is the {args.metric} histogram ({hist.count:g} steps; series: {_series_text(hist)}).",
            "Each bucket was spread over widths as follows:",
            *(f"  {a}" for a in spread.assumptions),
            resolution,
        ]
        if load.section is not None:
            header += ["traffic.load comes from vLLM's request metrics over the same interval and series:",
                       *(f"  {fact}" for fact in load.facts)]
        else:
            header.append(f"No traffic.load: {load.missing}.")
        write_workload(spec, _wrap(header), args.out, force=args.force)
        loaded = f"; traffic.load at {load.section['rate_per_s']:g} requests/s" if load.section is not None else ""
        print(f"wrote {args.out}: {hist.count:g} steps over {len(spread.counts)} widths "
              f"(mean {spread.mean_width:.1f} tokens) from {source}{loaded}")
        if spread.unresolved:
            print(f"note: {len(spread.unresolved)} of {spread.candidates} candidate capture sizes fall inside "
                  f"coarse buckets; see traffic.source_note", file=sys.stderr)
        if load.missing is not None:
            print(f"note: no traffic.load written: {load.missing}", file=sys.stderr)
        return 0

    # ----------------------------------------------------------------------- from-trace
    def _from_trace(self, args: argparse.Namespace) -> int:
        trace = Path(args.trace)
        if not trace.is_file():
            raise UsageError(f"{args.trace}: no such file")
        name = _name_for(args, args.out)
        _check_out(args.out, args.force)
        base = load_workload_arg(args.base)
        # The loader resolves `trace:` against the workload file's folder, so store the path relative to --out.
        rel = os.path.relpath(trace.resolve(), args.out.parent.resolve())
        q = base.serving.decode_query_len
        note = (
            f"Per-step trace {trace.name} (made by `cgtune workload from-trace` on {_now()}). Steps without "
            f"is_uniform_decode or num_reqs are taken as uniform decode when num_tokens is a multiple of q={q} "
            f"within max_num_seqs x q = {base.serving.max_num_seqs * q} tokens."
        )
        description = f"{base.description or base.name}; traffic from trace {trace.name}"
        spec = derived_spec(base, {"trace": rel, "source_note": note}, name=name, description=description)
        header = [
            f"Made by `cgtune workload from-trace` from {args.trace} on {_now()}.",
            f"Model and serving config copied from {args.base}; the trace path is relative to this file.",
        ]
        workload = write_workload(spec, header, args.out, force=args.force)
        print(f"wrote {args.out}: {len(workload.traffic.trace)} steps, "
              f"{_decode_share(workload):.0%} uniform decode, from {args.trace}")
        return 0


def _vllm_base(path: str, flag: str) -> Workload:
    """A workload whose engine exports vLLM's step-width histogram: the metrics cgtune reads describe its steps."""
    base = load_workload_arg(path)
    if not base.engine.exports_vllm_metrics:
        raise UsageError(f"{flag}: {path} deploys on {base.engine.label}, whose server exports no "
                         f"vllm:iteration_tokens_total histogram (use `cgtune workload from-trace` with a step trace)")
    return base


def _decode_share(workload: Workload) -> float:
    return sum(1 for _, uniform, _ in workload.traffic.trace if uniform) / len(workload.traffic.trace)


def _wrap(lines: list[str], width: int = 108) -> list[str]:
    """Wrap long comment lines so the header reads in a terminal."""
    out: list[str] = []
    for line in lines:
        indent = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(line.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ") or [""]
    return out
