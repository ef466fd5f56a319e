"""The pure parts of `modpipe bench transport`: percentiles, ratios, checks, profile summaries, the table."""

from __future__ import annotations

import collections
from pathlib import Path

BASELINE = "confluent_idempotent"


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    s, pos = sorted(values), (len(values) - 1) * q / 100.0
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def add_ratios(passes: list[dict], baseline: str = BASELINE) -> list[dict]:
    """Each pass's records/s and CPU per record over the baseline option's (its first pass)."""
    base = next((p for p in passes if p["option"] == baseline), None)
    for p in passes:
        ok = base is not None and base["records_per_s"] and base["cpu_us_per_record"]
        p["throughput_ratio"] = round(p["records_per_s"] / base["records_per_s"], 3) if ok else None
        p["cpu_ratio"] = round(p["cpu_us_per_record"] / base["cpu_us_per_record"], 3) if ok else None
    return passes


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def checks_ok(p: dict) -> bool:
    """Both isolation levels read exactly what was produced and the group committed every input."""
    return (p["read_committed"] == p["read_uncommitted"] == p["records"]
            and p["offsets_committed"] == p["inputs"])


def format_text(report: dict) -> str:
    head = ("| option | checkpoint | records/s | CPU us/record (main thread) | broker CPU us/record | records/s ratio "
            "| CPU ratio | paced: CPU us/record (main thread) | paced: CPU ratio | paced: commit ms p50 / p99 (commits) "
            "| read_committed / uncommitted, offsets |")
    w = report["workload"]
    lines = [f"saturation: {report['records']:,} records ({report['inputs']:,} inputs x {w['records_per_input']}); "
             f"paced: {report['paced_inputs_per_s']:g} inputs/s, {report['paced_records']:,} records; "
             f"{w['value_bytes']} bytes, {w['partitions']} partitions x {w['topics']} topics, linger {w['linger_ms']} ms, "
             f"acks all; ratios over {w['baseline']}", "", head, "|" + "---|" * (head.count("|") - 1)]
    for s, p in zip(report["saturation"], report["paced"], strict=True):
        lines.append(
            f"| {s['option']} | {s['interval_ms']} ms | {s['records_per_s']:,.0f} | {s['cpu_us_per_record']:.2f} "
            f"({s['main_thread_us_per_record']:.2f}) | {_f(s['broker_cpu_us_per_record'], '.2f')} | "
            f"{_f(s['throughput_ratio'], '.2f')} | {_f(s['cpu_ratio'], '.2f')} | {p['cpu_us_per_record']:.2f} "
            f"({p['main_thread_us_per_record']:.2f}) | {_f(p['cpu_ratio'], '.2f')} | {_f(p['commit_ms_p50'], '.1f')} / "
            f"{_f(p['commit_ms_p99'], '.1f')} ({p['commits']}) | "
            f"{s['read_committed']:,} / {s['read_uncommitted']:,}, {s['offsets_committed']:,} |")
    m = report.get("machine") or {}
    if "other_cores" in m:
        lines.append(f"\nother processes took {m['other_cores']:.2f} cores on average while it ran "
                     f"({m['wall_s']:.0f} s, {report.get('cpus')} cores)")
    for client, idle in report.get("idle_consumers", {}).items():
        lines.append(f"a consumer at the end of its log, {client} (the passes pause theirs): "
                     f"{idle['client_cores']:.2f} cores, the broker meanwhile {_f(idle['broker_cores'], '.2f')}")
    lines.append(f"\nevery pass: both isolation levels read what was produced and every input's offset was committed: "
                 f"{'yes' if report['all_checks_ok'] else 'NO'}")
    for name, prof in report.get("profiles", {}).items():
        for by, top in prof.items():
            lines += ["", f"{name}, paced, main-thread CPU by {by} (cProfile, own time):"]
            lines += [f"  {t['share']:5.1%}  {t['us_per_record']:7.2f} us/record  {t[by]}" for t in top]
    return "\n".join(lines)


def top_own_time(stats: dict, records: int, by: str = "function", top: int = 5) -> list[dict]:
    """pstats' {(file, line, name): (cc, nc, own, cumulative, callers)} -> the `top` by own time, per
    function or per source file (`package/file.py`; C functions and methods count as "builtins")."""
    own: collections.Counter = collections.Counter()
    for (file, line, name), v in stats.items():
        if by == "function":
            own[name if file == "~" else f"{Path(file).name}:{line}({name})"] += v[2]
        else:
            own["builtins" if file == "~" else f"{Path(file).parent.name}/{Path(file).name}"] += v[2]
    total = sum(own.values()) or 1e-9
    return [{by: k, "share": round(v / total, 3), "us_per_record": round(1e6 * v / records, 2)}
            for k, v in own.most_common(top)]


