"""Commands: `modpipe triton [export|trt-script]`, `modpipe classify`, `modpipe bench model`."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

from modpipe import exits, log
from modpipe.settings import Settings

_log = log.get(__name__)


def _settings_with_ports(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in (("triton_http_port", getattr(args, "http_port", None)),
                                   ("triton_grpc_port", getattr(args, "grpc_port", None)),
                                   ("triton_metrics_port", getattr(args, "metrics_port", None))) if v}
    return Settings.from_env(**overrides)


# -- modpipe triton
def _triton(args: argparse.Namespace) -> int:
    from modpipe.serving.server import TritonServer

    settings = _settings_with_ports(args)
    if settings.triton_url:
        print(f"TRITON_URL={settings.triton_url} is set: modpipe uses that server; nothing to start",
              file=sys.stderr)
        return 2
    stop = threading.Event()
    stopped_by = exits.StopOnSignal(stop).install()
    server = TritonServer(settings, variant=args.variant, instance_kind=args.instance_kind)
    try:
        server.start(timeout=args.timeout)
        info = server.info()
        print(f"triton ready in {info['startup_s']} s: model {info['model']} ({info['variant']}) "
              f"build {info['build_version']}\n"
              f"  grpc     {info['grpc']}   (TRITON_URL={info['grpc']})\n"
              f"  http     {info['http']}\n"
              f"  metrics  {info['metrics']}\n"
              f"  log      {info['log']}\n"
              f"  models   {info['repository']}\n"
              "Ctrl-C stops it.", flush=True)
        while not stop.wait(1.0):
            if server.process is None or not server.process.alive():
                print(f"triton exited; see {server.log_path}", file=sys.stderr)
                return 1
    finally:
        server.stop()
    return stopped_by.status()


def _export(args: argparse.Namespace) -> int:
    from modpipe.serving import repository, tensorrt
    from modpipe.textmodel.artifacts import resolve_model

    settings = Settings.from_env()
    build = resolve_model(settings)
    decision = None
    if args.variant == "tensorrt":  # the FIL backend serves the decision model trained for this text model
        from modpipe.decision.store import resolve_decision_model

        candidate = resolve_decision_model(settings, build.version)
        decision = candidate if (candidate / "model.txt").exists() else None
    out = repository.assemble(Path(args.out), build, variant=args.variant, model_name=settings.triton_model,
                              link=False, plan=Path(args.plan) if args.plan else None, decision_model=decision,
                              instance_kind=args.instance_kind)
    if args.variant == "tensorrt":
        script = out.parent / f"{out.name}-build_engine.sh"
        script.write_text(tensorrt.build_script(max_seq=build.max_seq_len))
        script.chmod(0o755)
        print(f"repository {out} (build {build.version}); build the engine on the serving GPU: {script} {out}")
    else:
        print(f"repository {out} (build {build.version})")
    return 0


def _trt_script(args: argparse.Namespace) -> int:
    from modpipe.serving import tensorrt

    sys.stdout.write(tensorrt.build_script(max_batch=args.max_batch, max_seq=args.max_seq,
                                           opt_batch=args.opt_batch, opt_seq=args.opt_seq, fp16=not args.fp32))
    return 0


# -- modpipe classify
def _classify(args: argparse.Namespace) -> int:
    from modpipe.serving.client import SyncTextModelClient
    from modpipe.serving.server import triton_endpoint
    from modpipe.textmodel.artifacts import LABELS, SPAM_INDEX
    from modpipe.textmodel.tokenize import BatchTokenizer

    settings = Settings.from_env()
    texts = list(args.texts)
    if texts == ["-"]:
        texts = [line.rstrip("\n") for line in sys.stdin]
    tok = stack = None
    if not args.ensemble:
        from modpipe.textmodel.artifacts import resolve_model
        build = resolve_model(settings)
        # the served model's own limit: the same truncation as the server-side tokenizer (ensemble)
        tok = BatchTokenizer.for_build(build)
        stack = build.stack()  # what the worker does: the transformer's probability through the lexical stack
    with triton_endpoint(settings) as url, \
            SyncTextModelClient(url, settings.triton_model, settings.triton_timeout_s) as client:
        probs = []
        for start in range(0, len(texts), settings.max_batch):
            part = texts[start:start + settings.max_batch]
            if tok is None:  # the ensemble applies the build's lexical stack itself
                probs.extend(client.spam_probabilities_text(part))
            else:
                model = client.spam_probabilities(*tok(part))
                probs.extend(model if stack is None else stack.spam_proba(part, model))
    for text, p in zip(texts, probs, strict=True):
        label = LABELS[SPAM_INDEX] if p >= 0.5 else LABELS[1 - SPAM_INDEX]
        if args.json:
            print(json.dumps({"text": text, "spam_probability": round(float(p), 6), "label": label},
                             ensure_ascii=False))
        else:
            short = text if len(text) <= 70 else text[:67] + "..."
            print(f"{label:<4} {p:8.4f}  {short}")
    return 0


# -- modpipe bench model
def _bench_model(args: argparse.Namespace) -> int:
    from modpipe.serving import bench
    from modpipe.serving.server import triton_endpoint
    from modpipe.textmodel.artifacts import resolve_model

    overrides = {"triton_url": args.url} if args.url else {}
    if args.variant:
        overrides["triton_variant"] = args.variant
    settings = Settings.from_env(**overrides)
    build = resolve_model(settings)

    def ints(text: str | None, default) -> list[int]:
        return [int(b) for b in text.split(",") if b.strip()] if text else list(default)

    batch_sizes = ints(args.batch_sizes, bench.GPU_BATCH_SIZES if args.gpu else bench.DEFAULT_BATCH_SIZES)
    inflight = ints(args.inflight, bench.GPU_INFLIGHT if args.gpu else [settings.max_inflight])
    ceiling = "none" if args.no_ort else (args.ceiling or ("torch" if args.gpu else "ort"))
    with triton_endpoint(settings) as url:
        report = bench.run(url, build, settings.triton_model, n_texts=args.texts or (4096 if args.gpu else 256),
                           batch_sizes=batch_sizes, inflight=inflight, ort_threads=args.ort_threads,
                           progress=not args.no_progress, ceiling=ceiling, torch_device=args.torch_device)
    print(json.dumps(report) if args.json else bench.format_table(report))
    return 0


def _bench_subparsers(subparsers) -> argparse._SubParsersAction:
    """`bench` may be shared with other areas (`bench pipeline`): reuse it when already registered."""
    existing = subparsers.choices.get("bench")
    if existing is None:
        existing = subparsers.add_parser(
            "bench", help="benchmarks: with no target, pipeline vs seed vs ONNX Runtime ceiling end to end "
                          "(`bench --help`); targets: model, features, transport")
        existing.set_defaults(func=lambda a: (existing.print_help(), 2)[1])
    sub = getattr(existing, "_modpipe_subparsers", None)
    if sub is None:
        sub = existing.add_subparsers(dest="bench_target", metavar="TARGET")
        existing._modpipe_subparsers = sub
    return sub


def repository_variants(embedded: bool = False) -> tuple[str, ...]:
    from modpipe.serving import repository

    return repository.EMBEDDED_VARIANTS if embedded else tuple(repository.VARIANTS)


def register(subparsers) -> None:
    tr = subparsers.add_parser("triton", help="run the embedded Triton server (until Ctrl-C)",
                               description="Start tritonserver (nvidia-pytriton's binary) on 127.0.0.1 with the "
                                           "spam_text model build, print its endpoints, run until Ctrl-C.")
    tr.add_argument("--http-port", type=int, help="default TRITON_HTTP_PORT")
    tr.add_argument("--grpc-port", type=int, help="default TRITON_GRPC_PORT")
    tr.add_argument("--metrics-port", type=int, help="default TRITON_METRICS_PORT")
    tr.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    tr.add_argument("--variant", choices=repository_variants(embedded=True), default=None,
                    help="cpu: ONNX Runtime; cuda: PyTorch, fp16 on a GPU (default $MODPIPE_TRITON_VARIANT, else "
                         "cpu); tensorrt runs only in NVIDIA's container: see `triton export`")
    tr.add_argument("--instance-kind", choices=("auto", "gpu", "cpu"), default="auto",
                    help="cuda variant: where its instances run; auto = the GPU if nvidia-smi lists one, else "
                         "the CPU (default auto)")
    tr.set_defaults(func=_triton)
    trsub = tr.add_subparsers(dest="triton_command", metavar="ACTION")
    ex = trsub.add_parser("export", help="write a deployable model repository (weights copied in)")
    ex.add_argument("--out", required=True, help="directory to create (replaced if it exists)")
    ex.add_argument("--variant", choices=repository_variants(), default="cpu",
                    help="cpu: ONNX Runtime in the python backend (any CPU); cuda: PyTorch fp16 in the python "
                         "backend (a GPU, no TensorRT needed); tensorrt: a TensorRT plan built on the serving GPU "
                         "(fastest, NVIDIA's container). Default cpu")
    ex.add_argument("--instance-kind", choices=("auto", "gpu", "cpu"), default="gpu",
                    help="cuda variant: gpu (default, for the serving machine), cpu, or auto (this machine's)")
    ex.add_argument("--plan", help="tensorrt: an already built model.plan to copy in")
    ex.set_defaults(func=_export)
    ts = trsub.add_parser("trt-script", help="print the script that builds the TensorRT engine (tensorrt variant)")
    ts.add_argument("--max-batch", type=int, default=128)
    ts.add_argument("--max-seq", type=int, default=128)
    ts.add_argument("--opt-batch", type=int, default=64)
    ts.add_argument("--opt-seq", type=int, default=64)
    ts.add_argument("--fp32", action="store_true", help="no --fp16")
    ts.set_defaults(func=_trt_script)

    cl = subparsers.add_parser("classify", help="spam probability of texts through Triton",
                               description="Classify texts with the served model (Triton started for the call "
                                           "when TRITON_URL is empty and none runs on the configured ports).")
    cl.add_argument("texts", nargs="+", metavar="TEXT", help="texts; `-` reads one per line from stdin")
    cl.add_argument("--json", action="store_true", help='one JSON line per text: {"text","spam_probability","label"}')
    cl.add_argument("--ensemble", action="store_true", help="tokenize on the server (spam_text_ensemble)")
    cl.set_defaults(func=_classify)

    bsub = _bench_subparsers(subparsers)
    bm = bsub.add_parser("model", help="texts/s and latency through Triton vs an in-process ceiling",
                         description="Texts/s and p50/p99 through Triton per request size and requests in flight "
                                     "(request size 1 with fixed padding = the seed's one-text requests), beside "
                                     "the in-process ceiling (ONNX Runtime, or PyTorch on a GPU).")
    bm.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    bm.add_argument("--url", help="gRPC host:port of any Triton serving spam_text (default TRITON_URL, else a "
                                  "running or started embedded one)")
    bm.add_argument("--variant", choices=("cpu", "cuda"), help="variant of the embedded Triton started for the "
                                                               "run (default MODPIPE_TRITON_VARIANT)")
    bm.add_argument("--gpu", action="store_true",
                    help="the GPU section's preset: request sizes 1,64,256, in flight 1,2,8,32, 4096 texts, "
                         "PyTorch ceiling (fp16 on CUDA)")
    bm.add_argument("--texts", type=int, default=0, help="held-out texts per configuration (default 256; --gpu 4096)")
    bm.add_argument("--batch-sizes", default=None, help="request sizes, comma-separated (default 1,8,32,64)")
    bm.add_argument("--inflight", default=None,
                    help="Triton requests in flight, comma-separated levels (default MODPIPE_MAX_INFLIGHT)")
    bm.add_argument("--ceiling", choices=("ort", "torch", "none"), default=None,
                    help="in-process ceiling: ort (ONNX Runtime, CPU; default), torch (the build's torch/ weights)")
    bm.add_argument("--torch-device", default="auto", help="device of the torch ceiling (auto: cuda if any)")
    bm.add_argument("--ort-threads", type=int, default=2, help="threads of the in-process ceiling")
    bm.add_argument("--no-ort", action="store_true", help="no in-process ceiling (same as --ceiling none)")
    bm.add_argument("--no-progress", action="store_true")
    bm.set_defaults(func=_bench_model)
