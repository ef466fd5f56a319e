"""What a benchmark phase cost: CPU by process group, by this process and by the whole machine (from /proc),
the Triton server's cumulative model statistics, and what machine it ran on."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path

from modpipe.services.process import clock_tick, group_cpu_seconds  # noqa: F401 - this module's API too


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = clock_tick()
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (total - idle) / tick, total / tick


class CpuMeter:
    """CPU used during one phase: by each of our process groups, by this process, by the whole machine."""

    def __init__(self, groups: dict[str, int] | None = None):
        self.groups = dict(groups or {})
        self.t0 = time.monotonic()
        self.self0 = _self_cpu()
        self.groups0 = group_cpu_seconds(self.groups)
        self.machine0 = machine_cpu_seconds()
        self.load0 = loadavg_1m()

    def stop(self) -> dict:
        wall = max(time.monotonic() - self.t0, 1e-9)
        ours = {name: v - self.groups0.get(name, 0.0) for name, v in group_cpu_seconds(self.groups).items()}
        ours["bench_client"] = _self_cpu() - self.self0
        out = {"wall_s": round(wall, 2), "cpu_s": {k: round(v, 2) for k, v in ours.items()},
               "loadavg_1m_start": self.load0}
        machine1 = machine_cpu_seconds()
        if self.machine0 and machine1:
            busy = machine1[0] - self.machine0[0]
            out["machine_busy_cores"] = round(busy / wall, 2)
            out["own_cores"] = round(sum(ours.values()) / wall, 2)
            # what other users of the machine took meanwhile (never below 0: the counters differ in timing)
            out["other_cores"] = round(max(0.0, busy - sum(ours.values())) / wall, 2)
        return out

def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system

def loadavg_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None

def machine_info() -> dict:
    import onnxruntime

    from modpipe.serving.repository import gpu_names

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    model_name = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem_gib = round(mem_kib / 2 ** 20, 1)
    return {"cpu_count": os.cpu_count(), "cpus_usable": affinity, "cpu_model": model_name, "memory_gib": mem_gib,
            "gpu": (gpu_names() or [None])[0], "platform": platform.platform(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "loadavg_1m_start": loadavg_1m()}

def triton_quiet(url: str, model: str, quiet_s: float, timeout_s: float, poll_s: float = 0.25) -> float:
    """Wait until `model`'s inference count has not moved for `quiet_s` (or `timeout_s`); returns the wait."""
    started = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - started < timeout_s:
        count = triton_stats(url, model)["inferences"]
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(poll_s)
    return time.monotonic() - started

def triton_stats(url: str, model: str) -> dict:
    """Cumulative statistics of `model` in the server: requests, executions (server batches), compute time."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(model, as_json=True).get("model_stats", [])
    finally:
        client.close()
    out = {"inferences": 0, "executions": 0, "requests": 0, "compute_s": 0.0, "queue_s": 0.0}
    for st in stats:
        inf = st.get("inference_stats", {})
        out["inferences"] += int(st.get("inference_count", 0))
        out["executions"] += int(st.get("execution_count", 0))
        out["requests"] += int(inf.get("success", {}).get("count", 0))
        out["compute_s"] += int(inf.get("compute_infer", {}).get("ns", 0)) / 1e9
        out["queue_s"] += int(inf.get("queue", {}).get("ns", 0)) / 1e9
    return out

def stats_delta(before: dict, after: dict, wall_s: float) -> dict:
    d = {k: after[k] - before[k] for k in before}
    return {"requests": d["requests"], "rows": d["inferences"], "executions": d["executions"],
            "avg_server_batch": round(d["inferences"] / d["executions"], 2) if d["executions"] else None,
            "model_compute_s": round(d["compute_s"], 2), "queue_s": round(d["queue_s"], 2),
            "model_busy_share": round(d["compute_s"] / wall_s, 3) if wall_s > 0 else None}

def triton_server_info(url: str, model: str) -> dict:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        meta = client.get_server_metadata(as_json=True)
        config = client.get_model_config(model, as_json=True)["config"]
    finally:
        client.close()
    params = config.get("parameters", {})
    return {"triton_version": meta.get("version"), "model": model,
            "build_version": params.get("build_version", {}).get("string_value"),
            "trim_padding": params.get("trim_padding", {}).get("string_value"),
            "intra_op_threads": params.get("intra_op_threads", {}).get("string_value"),
            "max_batch_size": config.get("max_batch_size")}
