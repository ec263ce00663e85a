"""P7: kill -9 of the sink under load, several times: how soon streaming resumes after each restart,
then verify and audit that no byte was lost or recorded twice."""

from __future__ import annotations

import json
import os
import time

from ..analysis import worst_resume
from ..config import TARGETS
from ..formatting import cpu_line, fmt, met_le
from ..harness import Bench, BenchError, Pipeline, dir_bytes, now_ns, rmtree, say


def scenario_p7(b: Bench):
    secs, rate, kills = b.p["p7_seconds"], b.p["p7_rate"], b.p["p7_kills"]
    say(f"[P7] kill -9 of the sink under load ({b.p['p1_streams']} streams × {rate:.0f} MiB/s for {secs}s), "
        f"{kills} times; resume = restart → first increase of placed_bytes (status every 50 ms)")
    d = b.fresh("p7")
    src = b.fresh_src("p7")
    os.sync()
    pl = Pipeline(b, d, src)
    kill_log = []
    try:
        pl.start_watcher()
        time.sleep(0.5)
        sim = b.sim(d, "sim", src, "--streams", b.p["p1_streams"], "--rate", rate, "--frame", "1MiB",
                    "--chunk", "64MiB", "--duration", f"{secs}s")
        time.sleep(min(2.0, secs / 4))
        for k in range(kills):
            before = pl.status()
            pl.sink.kill9()
            t_restart = now_ns()
            pl.restart_sink()
            first, t_first, t_resume, resumed_at = None, None, None, None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                st = pl.status()
                t = now_ns()
                if st is not None:
                    if first is None:
                        first, t_first = st["placed_bytes"], t
                    elif st["placed_bytes"] > first:
                        t_resume, resumed_at = t, st["placed_bytes"]
                        break
                if not pl.sink.alive():
                    raise BenchError(f"restarted sink exited: {pl.sink.log_tail()}")
                time.sleep(0.05)
            pl.cl.poll()
            later = [r[3] for r in pl.cl.records if r[3] > t_restart]
            t_commit = min(later) if later else None
            entry = {"kill": k + 1, "before_kill_placed": before and before["placed_bytes"],
                     "first_answer_s": t_first and (t_first - t_restart) / 1e9,
                     "resume_s": t_resume and (t_resume - t_restart) / 1e9,
                     "first_commit_after_restart_s": t_commit and (t_commit - t_restart) / 1e9}
            kill_log.append(entry)
            say(f"  kill {k + 1}: sink answers after {fmt(entry['first_answer_s'], '.2f')}s, placed_bytes "
                f"grows after {fmt(entry['resume_s'], '.2f')}s (first commit in the commit log after "
                f"{fmt(entry['first_commit_after_restart_s'], '.3f')}s)")
            time.sleep(1.5)
        if sim.wait(secs + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        total, nfiles = dir_bytes(src)
        deadline = time.monotonic() + 300
        st = None
        while time.monotonic() < deadline:
            st = pl.status()
            if st and st["placed_bytes"] >= total:
                break
            time.sleep(0.2)
        m = pl.finish(total)
    finally:
        pl.kill_all()
    ok, text = b.verify(src, pl.dest)
    audit_cp = b.tf("audit", "--state", pl.sink_state, check=False)
    try:
        audit = json.loads(audit_cp.stdout[audit_cp.stdout.find("{"):])
    except (json.JSONDecodeError, ValueError):
        audit = {"error": audit_cp.stdout + audit_cp.stderr}
    worst = worst_resume(kill_log)
    placed = (m.get("status") or {}).get("placed_bytes")
    clean = ok and audit.get("overlapping_placements") == 0 and audit.get("record_mismatches") == 0
    m.update({"kills": kill_log, "verified": ok, "verify_report": None if ok else text, "audit": audit,
              "total_bytes": total, "files": nfiles, "worst_resume_s": worst, "placed_bytes": placed})
    b.results["scenarios"]["P7"] = m
    say(f"[P7] worst resume {fmt(worst, '.2f')}s (target ≤{TARGETS['P7_resume_s']}); verify "
        f"{'identical' if ok else 'DIFFERENT'}; audit overlapping_placements "
        f"{audit.get('overlapping_placements')}, record_mismatches {audit.get('record_mismatches')}, "
        f"duplicate_bytes {audit.get('duplicate_bytes')}, rewritten_bytes {audit.get('rewritten_bytes')}; "
        + cpu_line(m))
    b.row(id="P7", scenario=f"sink kill -9 under load → streaming resumes (worst of {kills})",
          figure=f"{fmt(worst, '.2f')} s", peer="—", ratio=None, target=f"≤{TARGETS['P7_resume_s']} s",
          met=met_le(worst, TARGETS["P7_resume_s"]))
    b.row(id="P7", scenario="… bytes lost / recorded twice (verify + audit)",
          figure="0 / 0" if clean else f"verify {'ok' if ok else 'FAILED'}, overlaps "
          f"{audit.get('overlapping_placements')}, mismatches {audit.get('record_mismatches')}",
          peer="—", ratio=None, target="0 / 0", met="yes" if clean else "no")
    rmtree(src)
    rmtree(pl.dest_root)
