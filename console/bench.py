"""Benchmark of the console's queue page: `python -m modpipe.console.bench [--posts 50000] [--requests 3000]`.

Fills a real index with `--posts` posts (by default every one waiting in the review queue, the worst case for
the queue read, texts of `--text-chars`), serves it with the console's own server on 127.0.0.1, signs a
moderator in, and has `--clients` processes (apart from the server's, so they do not share its interpreter
lock) each ask GET /api/queue?limit=100, the page's own request, over one keep-alive connection, while this
process keeps applying `--decisions-per-s` decisions to the index as a follower would. Prints one JSON
line: latency quantiles in milliseconds as the clients saw them, requests per second, the index's size.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import random
import tempfile
import threading
import time
from pathlib import Path

PASSWORD = "benchmark passphrase"


def _client(port: int, cookie: str, requests: int, out) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        connection.request("GET", "/api/queue?limit=100", headers={"Cookie": cookie})
        response = connection.getresponse()
        body = response.read()
        latencies.append(time.perf_counter() - started)
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {body[:200]!r}")
    connection.close()
    out.put(latencies)


def _fill(index, posts: int, text_chars: int, review_share: float, rng: random.Random) -> None:
    from modpipe import schema

    now_ms = schema.now_ms()
    for i in range(posts):
        post_id, user_id = f"bench-{i}", f"user-{rng.randrange(posts // 10 or 1)}"
        index.add_post({"post_id": post_id, "user_id": user_id, "text": "x" * text_chars,
                        "url": f"https://example.test/{i}", "created_at": schema.rfc3339(now_ms - posts + i)})
        verdict = "review" if rng.random() < review_share else rng.choice(["allow", "block"])
        index.add_decision({"post_id": post_id, "user_id": user_id, "verdict": verdict, "revision": 1,
                            "spam_probability": rng.random(), "text_probability": rng.random(),
                            "reasons": [{"text": "a reason"}] * 3, "features": {"user_posts": i % 50},
                            "decided_at": schema.rfc3339(now_ms - 1000 * (posts - i)), "latency_ms": 20})


def main(argv: list[str] | None = None) -> int:
    from argon2 import PasswordHasher
    from modpipe.console.audit import AuditLog
    from modpipe.console.auth import Accounts
    from modpipe.console.index import DecisionIndex
    from modpipe.console.server import ConsoleConfig, serve

    from modpipe import schema

    p = argparse.ArgumentParser(prog="python -m modpipe.console.bench", description=__doc__.split("\n\n")[1])
    p.add_argument("--posts", type=int, default=50_000)
    p.add_argument("--text-chars", type=int, default=500)
    p.add_argument("--review-share", type=float, default=1.0, help="share of posts waiting for review")
    p.add_argument("--requests", type=int, default=3000, help="queue requests in all")
    p.add_argument("--clients", type=int, default=2, help="client processes, each one keep-alive connection")
    p.add_argument("--decisions-per-s", type=float, default=200, help="records applied meanwhile (0: none)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    rng = random.Random(args.seed)
    index = DecisionIndex(max_posts=max(args.posts, 1))
    started = time.perf_counter()
    _fill(index, args.posts, args.text_chars, args.review_share, rng)
    fill_s = time.perf_counter() - started
    state = Path(tempfile.mkdtemp(prefix="console-bench-"))
    accounts = Accounts(state / "accounts.json", PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))
    accounts.add("bench", PASSWORD)
    server = serve(index, lambda label: label, config=ConsoleConfig(), accounts=accounts,
                   audit=AuditLog(state / "audit.jsonl"))
    port = server.server_address[1]
    stop = threading.Event()

    def follow() -> None:  # the follower's writes contend for the index lock as in production
        i = 0
        while not stop.wait(1 / args.decisions_per_s):
            index.add_decision({"post_id": f"bench-{rng.randrange(args.posts)}", "verdict": "review",
                                "revision": 2 + i, "decided_at": schema.rfc3339(schema.now_ms()), "latency_ms": 20})
            i += 1

    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("POST", "/api/login", body=json.dumps({"name": "bench", "password": PASSWORD}),
                           headers={"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"})
        response = connection.getresponse()
        response.read()
        cookie = response.getheader("Set-Cookie").split(";")[0]
        connection.close()
        if args.decisions_per_s > 0:
            threading.Thread(target=follow, daemon=True).start()
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        per_client = max(1, args.requests // args.clients)
        workers = [context.Process(target=_client, args=(port, cookie, per_client, out)) for _ in range(args.clients)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        latencies = sorted(x for _ in workers for x in out.get(timeout=600))
        wall_s = time.perf_counter() - started
        for w in workers:
            w.join()
    finally:
        stop.set()
        server.shutdown()

    def q(f: float) -> float:
        return round(1000 * latencies[min(len(latencies) - 1, int(len(latencies) * f))], 2)

    stats = index.stats(window_s=1)
    print(json.dumps({"posts": stats["posts_known"], "queue_size": stats["queue_size"],
                      "index_mib": round(stats["bytes_known"] / 2**20, 1), "fill_s": round(fill_s, 1),
                      "requests": len(latencies), "clients": args.clients, "decisions_per_s": args.decisions_per_s,
                      "p50_ms": q(0.50), "p90_ms": q(0.90), "p99_ms": q(0.99), "max_ms": round(1000 * latencies[-1], 2),
                      "requests_per_s": round(len(latencies) / wall_s, 1), "python": platform.python_version(),
                      "cpus": os.cpu_count(), "machine": platform.machine()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
