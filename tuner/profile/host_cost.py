"""Whether a profile's eager step is host-bound: per width, the host time to issue the step (Python, dispatch and
kernel launches) beside the step's time on the device, as `cgtune profile` records them on a GPU."""

from __future__ import annotations

from typing import Any

__all__ = ["HOST_BOUND_SHARE", "host_bound_widths", "host_line", "host_times"]

HOST_BOUND_SHARE = 0.9
"""The eager step counts as host-bound at a width where issuing it takes at least this share of its measured time:
the GPU then waits for launches, so removing them (a graph) saves about the host time, not only launch gaps."""


def host_times(metadata: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """width -> (host ms to issue one eager step, the eager step's measured ms), medians, where both were measured
    (GPU profiles since the host time was recorded; none on a CPU, where the host does the work itself)."""
    out = {}
    for w, detail in (metadata.get("measurements") or {}).items():
        if not isinstance(detail, dict):
            continue
        host, eager = detail.get("eager_host"), detail.get("eager")
        if isinstance(host, dict) and isinstance(eager, dict) and host.get("median_ms") and eager.get("median_ms"):
            out[int(w)] = (float(host["median_ms"]), float(eager["median_ms"]))
    return dict(sorted(out.items()))


def host_bound_widths(metadata: dict[str, Any]) -> list[int]:
    """Widths whose eager step is host-bound (host time >= HOST_BOUND_SHARE of the step's time)."""
    return [w for w, (host, step) in host_times(metadata).items() if host >= HOST_BOUND_SHARE * step]


def host_line(metadata: dict[str, Any]) -> str | None:
    """One line for a report: at how many widths the eager step is host-bound, up to which width, and the host's
    share at the smallest and largest width measured; None when the profile has no host times."""
    times = host_times(metadata)
    if not times:
        return None
    bound = host_bound_widths(metadata)
    (w_lo, (h_lo, s_lo)), (w_hi, (h_hi, s_hi)) = next(iter(times.items())), list(times.items())[-1]
    shares = (f"host {h_lo:.2f} of {s_lo:.2f} ms at {w_lo} tokens, {h_hi:.2f} of {s_hi:.2f} ms at {w_hi}")
    if not bound:
        return f"eager step host-bound at none of the {len(times)} widths with a host time ({shares})"
    return (f"eager step HOST-BOUND at {len(bound)} of {len(times)} widths (issuing it takes >= "
            f"{HOST_BOUND_SHARE:.0%} of its time; up to {max(bound)} tokens): there the eager/graph ratio measures "
            f"this stand-in's host work as much as the GPU's ({shares})")
