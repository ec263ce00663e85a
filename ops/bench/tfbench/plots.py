"""The plots of the results: P1/P2 throughput over time, the P3 latency CDF, P4 throughput against
RTT. matplotlib is imported only when plotting, and a run without it still writes its tables."""

from __future__ import annotations

from pathlib import Path

from .config import NO_JOURNAL_LABEL
from .harness import Bench


def make_plots(b: Bench, out: Path, stem: str) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        b.notes.append("matplotlib missing: no plots.")
        return []
    sc = b.results["scenarios"]
    names = []
    try:
        if "P1" in sc:
            fig, ax = plt.subplots(figsize=(8, 4.5))
            for key, style in (("P1", "-"), ("P2", "--")):
                for r in sc.get(key, {}).get("runs", []):
                    s = r.get("series") or []
                    ax.plot([x for x, _ in s], [y for _, y in s], style, label=f"{key} {r['name']}")
            c = sc.get("ceilings", {})
            if c.get("disk"):
                ax.axhline(c["disk"] / 1e6, color="grey", linestyle=":", label="disk ceiling (fio)")
            if c.get("tcp4") and (not c.get("disk") or c["tcp4"] < 3 * c["disk"]):
                ax.axhline(c["tcp4"] / 1e6, color="black", linestyle=":", label="TCP ceiling (iperf3)")
            ax.set_xlabel("seconds since the simulator started")
            ax.set_ylabel("MB/s recorded by the sink (0.25 s bins)")
            ax.set_title("P1/P2 throughput over time")
            ax.legend(fontsize=7)
            name = f"{stem}-p1-throughput.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            names.append(name)
        if "P3" in sc:
            fig, ax = plt.subplots(figsize=(8, 4.5))
            for i, r in enumerate(sc["P3"]["tailflight"]):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], label=f"tailflight run {i + 1}")
            for r in sc["P3"].get("linger0", []):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], ":", label="tailflight --linger 0ms")
            for r in sc["P3"].get("journal", []):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], "-.", label=NO_JOURNAL_LABEL)
            for r in sc["P3"].get("two_writers", []) + sc["P3"].get("rotating", []):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], "--", label=r.get("label"))
            for label, runs in sc["P3"]["peers"].items():
                color = None
                for r in runs:
                    pts = r.get("cdf") or []
                    line, = ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], "--", color=color,
                                    label=label if color is None else None)
                    color = line.get_color()
            ax.set_xscale("log")
            ax.set_xlabel("append → durable (tailflight) / visible at destination (peers), ms")
            ax.set_ylabel("fraction of writes")
            ax.set_title("P3 latency CDF")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            name = f"{stem}-p3-latency-cdf.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            names.append(name)
        if "P4" in sc and sc["P4"].get("medians"):
            p4 = sc["P4"]
            fig, ax = plt.subplots(figsize=(8, 4.5))
            rtts = p4["rtts"]
            for key, label in (("tf4", "tailflight, 4 connections"), ("tf1", "tailflight, 1 connection"),
                               ("rsync", "rsync daemon")):
                ax.plot(rtts, [(p4["medians"][key][r] or 0) / 1e6 for r in rtts], "o-", label=label)
            if p4.get("link_bytes_per_s"):
                ax.axhline(p4["link_bytes_per_s"] / 1e6, color="grey", linestyle=":", label="link (iperf3, 0 ms)")
            ax.set_xlabel("emulated RTT, ms")
            ax.set_ylabel("MB/s")
            ax.set_ylim(bottom=0)
            ax.set_title("P4 throughput vs emulated RTT" + (f" ({b.p['p4_rate']} tbf veth)" if p4.get("link_bytes_per_s") else
                                                              " (loopback, no rate limit)"))
            ax.legend(fontsize=8)
            name = f"{stem}-p4-rtt.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            names.append(name)
    except Exception as e:  # plots are a nicety; the tables must still be written
        b.notes.append(f"plotting failed: {e}")
    return names
