"""The report's ratios, targets and capacity line."""

from __future__ import annotations

from modpipe.loadgen.bench import report
from modpipe.loadgen.bench.report import TARGETS, capacity, load_offered, ratio, targets


def test_ratios_and_targets():
    assert ratio(30.0, 12.0) == 2.5 and ratio(None, 2.0) is None and ratio(1.0, 0.0) is None
    t = targets({"worker_cpu_ms_per_post": 1.0, "broker_cpu_ms_per_post": 1.6, "pipeline_over_sorted_ceiling": 0.95,
                 "low_rate_p50_ms": 59.0, "low_rate_p99_ms": 201.0})
    assert set(t) == set(TARGETS)
    assert t["worker_cpu_ms_per_post"] == {"target": 1.0, "direction": "max", "value": 1.0, "met": True}
    assert t["broker_cpu_ms_per_post"]["met"] is False  # a "max" target exceeded
    assert t["pipeline_over_sorted_ceiling"]["met"] is True and t["low_rate_p50_ms"]["met"] is True
    assert t["low_rate_p99_ms"]["met"] is False
    assert t["load_p99_ms"] == {"target": 300.0, "direction": "max", "value": None, "met": False,  # not measured
                                "load_share": None}


def test_the_load_target_counts_only_at_half_of_saturation_or_more():
    measured = {"load_p99_ms": 250.0}
    assert targets({**measured, "load_share": 0.5})["load_p99_ms"]["met"] is True
    assert targets({**measured, "load_share": 0.497})["load_p99_ms"]["met"] is True  # a rounded rate
    assert targets({**measured, "load_share": 0.8})["load_p99_ms"]["met"] is True
    assert targets({**measured, "load_share": 0.3})["load_p99_ms"]["met"] is False  # fast at 30% says nothing
    assert targets(measured)["load_p99_ms"]["met"] is False  # share unknown
    assert targets({"load_p99_ms": 301.0, "load_share": 0.5})["load_p99_ms"]["met"] is False


def test_the_load_pass_offers_a_share_of_saturation_or_a_fixed_rate():
    assert load_offered(37.0, 0.5) == (18.5, 0.5)
    assert load_offered(46.3, 0.5) == (23.15, 0.5)
    # a fixed rate is the same whatever the saturation pass read; its share says how hard it pushed
    assert load_offered(46.3, 0.5, load_rate=19.0) == (19.0, 0.41)
    assert load_offered(37.0, 0.5, load_rate=19.0) == (19.0, 0.514)
    assert load_offered(0.0, 0.5, load_rate=19.0) == (19.0, 0.0)  # nothing decided at saturation: no share

def test_capacity_per_worker_core_beside_one_gpu():
    c = capacity(0.5, gpu_texts_per_s=18_000)
    assert c == {"posts_per_worker_core_s": 2000.0, "gpu_texts_per_s_reference": 18_000, "worker_cores_per_gpu": 9.0}
    assert capacity(None)["worker_cores_per_gpu"] is None

def test_a_latency_pass_says_where_its_time_went():
    from modpipe.loadgen.bench.pipeline import _worker_metrics
    from modpipe.loadgen.bench.report import _latency_parts

    before = {"modpipe_checkpoint_duration_seconds_count": 10.0, "modpipe_checkpoint_duration_seconds_sum": 0.1,
              "modpipe_batch_size_posts_count": 4.0, "modpipe_batch_size_posts_sum": 4.0,
              "modpipe_state_written_bytes_total{table=user}": 100_000.0}
    after = {"modpipe_checkpoint_duration_seconds_count": 70.0, "modpipe_checkpoint_duration_seconds_sum": 0.58,
             "modpipe_batch_size_posts_count": 54.0, "modpipe_batch_size_posts_sum": 79.0,
             "modpipe_triton_request_duration_seconds_count": 50.0, "modpipe_triton_request_duration_seconds_sum": 1.8,
             "modpipe_state_written_bytes_total{table=user}": 400_000.0,
             "modpipe_state_written_bytes_total{table=post}": 150_000.0}
    w = _worker_metrics(before, after)
    assert (w["checkpoints"], w["checkpoint_mean_ms"], w["avg_batch"], w["triton_request_mean_ms"]) == (60, 8.0, 1.5, 36.0)
    assert w["state_written_bytes"] == {"post": 150_000, "user": 300_000}
    assert _worker_metrics(after, after)["checkpoint_mean_ms"] is None  # none in the pass: no mean to divide by
    pass_ = {"offered_posts_per_s": 5.0, "posts": 150, "published": {"p50_ms": 52.2, "p99_ms": 267.4}, "p50_ms": 70.7,
             "p99_ms": 307.2, "workers": w, "cpu": {"wall_s": 30.0},
             "triton": {"requests": 50, "executions": 48, "queue_s": 0.6, "model_compute_s": 1.2,
                        "model_busy_share": 0.04}}
    assert _latency_parts(pass_) == (
        "at 5.0 posts/s: published p50 / p99 52 / 267 ms, visible 71 / 307 ms; Triton batches of 1.5 posts, 36.0 ms "
        "a request (in Triton: 12.0 ms queued, 25.0 ms computing; model busy 4% of the pass); 60 checkpoints (2.0/s) "
        "of 8.0 ms on average; 3.0 KB of feature-table states written a post")
    tailed = {**pass_, "tail": {"slowest_posts": 2, "produced_at_s": [12.0, 12.4], "episodes": 1,
                                "busiest_second_posts": 11, "mean_posts_per_s": 5.0}}
    assert _latency_parts(tailed).endswith("; its slowest 2 posts were produced in 1 episode(s) at 12, 12.4 s (the "
                                           "busiest second brought 11 posts, the mean 5.0)")
    tailed["tail"]["slowest_waited"] = {"to_decided_ms": 262.0, "to_published_ms": 1.0, "to_visible_ms": 30.0}
    tailed["tail"]["all_waited"] = {"to_decided_ms": 40.0, "to_published_ms": 1.0, "to_visible_ms": 12.0}
    assert _latency_parts(tailed).endswith("; waited (ms to the verdict / to publish / to be seen, medians): "
                                           "those 262 / 1 / 30, all 40 / 1 / 12")
    # both latency measures: from the schedule (the headline) and from the produce() call
    both = {**pass_, "from_produce": {"p50_ms": 70.1, "p95_ms": 200.0, "p99_ms": 290.4, "max_ms": 301.0,
                                      "mean_ms": 90.0}, "producer_behind_max_s": 0.012}
    assert "visible 71 / 307 ms (from produce(): 70 / 290 ms, the producer up to 0.012 s behind its schedule); " \
        "Triton batches of 1.5 posts" in _latency_parts(both)
    assert report.from_produce(both) == "from produce(): 70 / 290 ms" and report.from_produce(pass_) == ""
    # a report written before Triton's statistics and the byte counter were read still renders
    old = {**pass_, "workers": {k: v for k, v in w.items() if k != "state_written_bytes"}}
    del old["triton"], old["posts"]
    assert _latency_parts(old) == ("at 5.0 posts/s: published p50 / p99 52 / 267 ms, visible 71 / 307 ms; Triton "
                                   "batches of 1.5 posts, 36.0 ms a request; 60 checkpoints (2.0/s) of 8.0 ms on average")


def test_the_machine_line_names_the_gpu_and_where_the_text_model_ran():
    assert report._gpu({"gpu": None}, {}) == "no GPU (Triton's cpu variant on the CPU)"
    assert report._gpu({"gpu": "NVIDIA H200"}, {"triton_variant": "cuda"}) == \
        "GPU NVIDIA H200 (Triton's cuda variant on it)"
    assert report._gpu({"gpu": "NVIDIA H200"}, {"triton_variant": "cpu"}) == \
        "GPU NVIDIA H200 (Triton's cpu variant on the CPU beside it)"


def test_the_table_gives_latency_from_the_schedule_and_from_produce():
    def latency_pass(p50, p99, produced):
        return {"offered_posts_per_s": 5.0, "arrivals": "poisson", "posts": 150, "decided_posts_per_s": 5.0,
                "p50_ms": p50, "p99_ms": p99, "load": 0.5, "workers": {},
                **({"from_produce": {"p50_ms": produced[0], "p99_ms": produced[1]}} if produced else {})}

    sat = {"workers": {"avg_batch": 2.0, "text_cache_hit_ratio": None}, "cpu_ms_per_post": {"workers": 1.0}}
    rep = {"config": {"workers": 1, "posts": 40, "scenario": "mixed"}, "machine": {"cpus_usable": 2, "cpu_model": "x"},
           "pipeline": {"posts_per_s": 40.0, "saturation": sat, "saturation_text_cache": {**sat, "posts_per_s": 50.0},
                        "low_rate": latency_pass(60.0, 150.0, (58.0, 120.0)),
                        "latency": latency_pass(900.0, 3000.0, (80.0, 300.0))},
           "seed": {"width": 128, "posts_per_s": 30.0, "p50_ms": 30.0, "p99_ms": 40.0},
           "ceiling": {"threads": 2, "best_batch": 8, "by_batch": [{"batch": 8}], "posts_per_s": 50.0},
           "ceiling_sorted": {"best_batch": 8, "posts_per_s": 60.0}, "targets": {},
           "ratios": dict.fromkeys(("pipeline_over_seed", "pipeline_over_ceiling",
                                    "pipeline_text_cache_over_sorted_ceiling"), 1.0),
           "capacity": capacity(1.0), "texts": {"posts": 40, "tokens_mean": 70}}
    table = report.format_markdown(rep)
    assert "scheduled send -> decision visible (read_committed); from produce(): 58 / 120 ms | 5.0 | **60** | " \
        "**150** |" in table
    assert "poisson arrivals at 5.0/s; from produce(): 80 / 300 ms | 5.0 | 900 | **3,000** |" in table
    del rep["pipeline"]["latency"]["from_produce"]  # a report from before both were measured still renders
    assert "poisson arrivals at 5.0/s | 5.0 | 900 | **3,000** |" in report.format_markdown(rep)


def test_capacity_per_core_of_each_process_and_what_a_gpu_machine_of_n_cores_runs():
    from modpipe.loadgen.bench.report import capacity_line

    c = capacity(0.5, gpu_texts_per_s=18_000, cpu_ms_per_post={"workers": 0.5, "triton": 0.3, "broker": 0.4},
                 machine_cores=16)
    assert c["posts_per_core_s"] == {"workers": 2000.0, "triton": 3333.3, "broker": 2500.0}
    # 16 cores / 0.8 ms a post = 20,000 posts/s, more than the GPU's 18,000: the GPU is the limit
    assert c["machine"] == {"cores": 16, "posts_per_s": 18_000, "limit": "gpu", "workers": 9, "triton_cores": 6}
    small = capacity(0.5, gpu_texts_per_s=18_000, cpu_ms_per_post={"workers": 0.5, "triton": 0.3}, machine_cores=8)
    assert small["machine"] == {"cores": 8, "posts_per_s": 10_000, "limit": "cores", "workers": 5, "triton_cores": 3}
    line = capacity_line(c)
    assert "A GPU machine of 16 cores (broker elsewhere) decides 18,000 posts/s (its GPU the limit) with 9 workers" \
        in line and "broker 2,500" in line
    assert "machine" not in capacity(0.5)  # no split by process: the worker's line alone
