"""The load model: what vLLM's scheduler makes of a deployment's arrivals under a capture list. The load as data
(arrivals by rate or given times, prompt and output lengths, speculative acceptance) is the workload's
(`tuner.workload.load`, re-exported here); this package owns the requests drawn from it (`arrivals`), the accepted
tokens per decode step (`acceptance`), the V1 scheduler stepped with the cost model's step latency (`scheduler`), the
steady state after an honest warm-up cut (`steady_state`), and the cliff: the two operating points of an empty and a
saturated start, and the highest rate a list holds (`cliff`); and what checks it against a real server: a bounded
load generator for an OpenAI-compatible endpoint (`drive`) and the comparison with vLLM's own step histogram and
TPOT (`agreement`). Imports profile, engines, workload and model; never the search, the decision or the report,
which may import it."""

from __future__ import annotations

from tuner.face import lazy_face

_FACE = {
    "Lengths": "tuner.workload.load", "Load": "tuner.workload.load", "LoadError": "tuner.workload.load",
    "Requests": "arrivals",
    "AcceptanceDraws": "acceptance", "accepted_probabilities": "acceptance",
    "DEFAULT_DURATION_S": "scheduler", "Schedule": "scheduler", "schedule": "scheduler", "simulate": "scheduler",
    "DEFAULT_WARMUP_SHARE": "steady_state", "LoadResult": "steady_state",
    "CLIFF_TOLERANCE": "cliff", "OperatingPoints": "cliff", "RateProbe": "cliff", "StableRate": "cliff",
    "compare_starts": "cliff", "max_stable_rate": "cliff", "operating_points": "cliff", "rate_ceiling": "cliff",
    "Drive": "drive", "DriveResult": "drive", "RequestRecord": "drive", "drive_load": "drive",
    "Agreement": "agreement", "compare_to_server": "agreement", "observed_widths": "agreement",
    "total_variation": "agreement", "with_host_overhead": "agreement",
}
"""Each public name -> the submodule that defines it (imported when the name is first used)."""

__all__ = sorted(_FACE)
__getattr__ = lazy_face(__name__, _FACE)
