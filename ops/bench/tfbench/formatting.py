"""How figures are written: numbers with units, "met?" cells, the one-line CPU summary of a run.

Pure functions, shared by the console lines, the results table and the report."""

from __future__ import annotations

import re

from .config import MiB


def fmt(v, spec):
    return "?" if v is None else format(v, spec)


def fmt_mb(v):
    return "?" if v is None else f"{v / 1e6:.0f} MB/s"


def fmt_ms(v):
    if v is None:
        return "?"
    if v >= 10000:
        return f"{v / 1000:.1f} s"
    return f"{v:.2f} ms" if v < 100 else f"{v:.0f} ms"


def met(r, target):
    return "?" if r is None else ("yes" if r >= target else "no")


def met_le(v, target):
    return "?" if v is None else ("yes" if v <= target else "no")


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def cpu_line(m: dict) -> str:
    def f(v, fmt):
        return "?" if v is None else format(v, fmt)
    text = (f"watcher {f(m.get('watcher_cpu_s_per_gb'), '.2f')} CPU s/GB, "
            f"RSS {f(m.get('watcher_rss_mib'), '.0f')} MiB; sink {f(m.get('sink_cpu_s_per_gb'), '.2f')} "
            f"CPU s/GB, RSS {f(m.get('sink_rss_mib'), '.0f')} MiB")
    dup = (m.get("status") or {}).get("duplicate_bytes")
    if dup:
        text += f"; sink saw {dup / MiB:.0f} MiB duplicate (re-sent) bytes"
    events = [f"{who}: {k.replace('_', ' ')} ×{n}" for who, ev in (m.get("log_events") or {}).items()
              for k, n in ev.items() if n]
    if events:
        text += "; log: " + ", ".join(events)
    return text
