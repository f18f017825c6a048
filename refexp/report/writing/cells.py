"""An estimate as the string every output prints: its mean with as many decimals as its interval needs."""

from __future__ import annotations

import math
from typing import Optional

from refexp.report.statistics.stats import Estimate


def _decimals(mean: float, half: Optional[float], kind: str) -> int:
    """Decimals that show the interval to two significant digits (0.0812 ± 0.0031) and never fewer
    than the kind asks for (int: 0, pct: 1, num: by the mean's magnitude, 0.612 / 12.3 / 1423); at most 6."""
    if kind == "int":
        d = 0
    elif kind == "pct":
        d = 1
    else:
        scale = abs(mean) if math.isfinite(mean) else 1.0
        d = 0 if scale >= 100 else 1 if scale >= 10 else 2 if scale >= 1 else 3
    if half is not None and math.isfinite(half) and half > 0:
        d = max(d, 1 - math.floor(math.log10(half)))
    return min(d, 6)


def cell_text(est: Optional[Estimate], kind: str = "num") -> str:
    """"0.612 ± 0.034", "0.612 (n=1)", "0.612 ± 0.310 (2 SFT starts)" (an interval over the starts' means), or "—"
    when no completed run logged the metric."""
    if est is None:
        return "—"
    m, h = est.mean, est.half_width
    unit = ""
    if kind == "pct":
        m, h, unit = 100 * m, (100 * h if h is not None else None), "%"
    if kind == "num" and math.isfinite(m) and 0 < max(abs(m), h or 0.0) < 1e-3:
        fmt = "{:.2e}"  # a KL of 3e-05 is not "0.000"
    else:
        fmt = "{:.%df}" % _decimals(m, h, kind)
    text = fmt.format(m) + unit
    if h is None:
        return text + " (n=1)"
    over = f" ({est.n} {est.unit}s)" if est.unit != "seed" else ""
    return text + " ± " + fmt.format(h) + unit + (" (n=1)" if est.n == 1 else over)
