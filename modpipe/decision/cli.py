"""`modpipe decision train [--labels]`, `decision eval` and `decision promote`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from modpipe.decision.store import load_engine
from modpipe.settings import Settings


def register(subparsers) -> None:
    p = subparsers.add_parser("decision", help="train or evaluate the LightGBM decision model",
                              description="The decision engine: bans short-circuit, then one LightGBM model over "
                                          "the text probability and every feature decides.")
    sub = p.add_subparsers(dest="decision_command", metavar="ACTION", required=True)

    t = sub.add_parser("train", help="replay labelled load-generator traffic through the feature code and train",
                       description="Simulate labelled traffic from the training half of the held-out texts, "
                                   "replay it through the agents' feature code, train LightGBM with a time-based "
                                   "split. Cached in $MODPIPE_CACHE_DIR/decision/<key>/ (decision/current).")
    t.add_argument("--profile", choices=("full", "demo"), default=None,
                   help="full: 7 scenarios x 3 rates; demo: 7 scenarios x 1 rate (default: $MODPIPE_MODEL_PROFILE)")
    t.add_argument("--seed", type=int, default=0, help="seed of the simulations and of LightGBM (default 0)")
    t.add_argument("--force", action="store_true", help="retrain even if a model with the same key exists")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    t.add_argument("--labels", action="store_true",
                   help="learn from moderators' labels (the labels and decisions topics on KAFKA_BOOTSTRAP_SERVERS) "
                        "with the simulation as a prior; judged against the serving model on the newest labels and "
                        "written only if not worse (exit 1 otherwise); see modpipe/decision/labels.py")
    t.add_argument("--label-weight", type=float, default=10.0,
                   help="with --labels: how many simulated posts one label weighs (default 10)")
    t.add_argument("--eval-fraction", type=float, default=0.25,
                   help="with --labels: the newest share of labels held out to judge the candidate (default 0.25)")
    t.add_argument("--json", action="store_true", help="print one JSON object: with --labels the report, else {\"model_dir\"}")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="spam F1 of text-only vs the full engine on held-out traffic, per scenario",
                       description="Replay held-out load-generator traffic (texts and seeds the model never saw) "
                                   "through the feature code with the text-only decider and with the engine.")
    e.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    e.add_argument("--posts", type=int, default=1500, help="posts per scenario (default 1500)")
    e.add_argument("--rate", type=float, default=50.0, help="simulated posts per second (default 50)")
    e.add_argument("--seed", type=int, default=0, help="offset of the evaluation seeds (default 0)")
    e.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="evaluate on N seeds (--seed .. --seed+N-1) and report each decider's F1 per scenario per "
                        "seed and their mean (one seed's traffic moves overall engine F1 by up to ~0.003); default 1: "
                        "the full single-seed report")
    e.add_argument("--datasets", metavar="NAME[,NAME...]", default=None,
                   help="draw the traffic from these data sets' held-out texts only (default: all the text build "
                        "tests on); two text builds compare on the same posts when named the data sets both test")
    e.add_argument("--model", type=Path, default=None,
                   help="decision model directory (default: $MODPIPE_DECISION_MODEL, else the cached one)")
    e.add_argument("--before", type=Path, default=None, metavar="DIR",
                   help="an earlier decision model directory scored on the same traffic in the same run, its "
                        "figures beside the engine's (before / after)")
    e.add_argument("--no-progress", action="store_true", help="no progress bars")
    e.add_argument("--ablation", metavar="FEATURE[,FEATURE...]", default=None,
                   help="instead of judging the served model: train the decision model twice in memory on the same "
                        "simulation and seed, with every feature and without these, and report both side by side "
                        "(nothing is cached or served)")
    e.add_argument("--profile", choices=("full", "demo"), default=None,
                   help="with --ablation: training profile (default: $MODPIPE_MODEL_PROFILE)")
    e.add_argument("--train-seed", type=int, default=0, help="with --ablation: training seed (default 0)")
    e.set_defaults(func=_eval)

    pr = sub.add_parser("promote", help="make a decision model the served one: running workers load it within "
                                        "MODPIPE_DECISION_MODEL_WATCH_S, no restart",
                        description="Checks that DIR loads (model.txt + model.json with this code's feature list), "
                                    "copies it into $MODPIPE_CACHE_DIR/decision/<version>/ when it is elsewhere, and "
                                    "points decision/current and decision/for-<text model> at it atomically. "
                                    "Workers with MODPIPE_DECISION_MODEL set follow that path instead.")
    pr.add_argument("model_dir", type=Path, help="decision model directory to serve")
    pr.set_defaults(func=_promote)

    ex = sub.add_parser("export-labels", help="moderators' labels joined with the posts' texts, as JSONL "
                                              "(text, label, post_id, moderator_id, labelled_at)",
                        description="Reads `labels` and `posts` on KAFKA_BOOTSTRAP_SERVERS (else the embedded "
                                    "broker's port); each labelled post whose text the broker still holds becomes "
                                    "one line, its newest label standing.")
    ex.add_argument("file", type=Path, help="JSONL file to write")
    ex.set_defaults(func=_export_labels)


def promote(settings: Settings, model_dir: Path, text_model_version: str) -> Path:
    """Serve `model_dir` (see `decision promote --help`); returns the directory the pointers lead to."""
    import shutil

    from modpipe.decision.model import DecisionModel
    from modpipe.decision.store import decision_root
    from modpipe.decision.train import _point_current

    model = DecisionModel.load(model_dir)  # refuses another feature list before anything moves
    root = decision_root(settings)
    target = Path(model_dir).resolve()
    if target.parent != root.resolve():
        target = root / model.version
        if not target.exists():
            tmp = root / f".{model.version}-incoming"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(model_dir, tmp)
            tmp.replace(target)
    _point_current(root, target, text_model_version)
    return target


def _export_labels(args: argparse.Namespace) -> int:
    from modpipe.decision.labels import export_labelled_texts

    settings = Settings.from_env()
    n = export_labelled_texts(settings, settings.bootstrap(), args.file)
    print(f"{n} labelled texts written to {args.file}", file=sys.stderr)
    return 0


def _promote(args: argparse.Namespace) -> int:
    from modpipe.textmodel.artifacts import resolve_model

    settings = Settings.from_env()
    target = promote(settings, args.model_dir, resolve_model(settings).version)
    print(target)
    return 0


def _train(args: argparse.Namespace) -> int:
    from modpipe.decision.train import train
    from modpipe.textmodel.artifacts import resolve_model

    settings = Settings.from_env()
    if args.labels:
        return _train_labels(args, settings)
    path = train(settings, resolve_model(settings), profile=args.profile or settings.model_profile, seed=args.seed,
                 force=args.force, progress=not (args.no_progress or args.json))
    if args.json:
        print(json.dumps({"model_dir": str(path)}))
    else:
        print(path)
    return 0


def _train_labels(args: argparse.Namespace, settings: Settings) -> int:
    from modpipe.decision.labels import NotEnoughLabels, train_on_labels
    from modpipe.textmodel.artifacts import resolve_model

    if not 0 < args.eval_fraction < 1 or args.label_weight <= 0:
        print("modpipe decision train: --eval-fraction must be in (0, 1) and --label-weight > 0", file=sys.stderr)
        return 2
    try:
        report = train_on_labels(settings, resolve_model(settings), bootstrap=settings.bootstrap(),
                                 profile=args.profile or settings.model_profile, seed=args.seed,
                                 label_weight=args.label_weight, eval_fraction=args.eval_fraction, force=args.force,
                                 progress=not (args.no_progress or args.json))
    except NotEnoughLabels as exc:
        print(f"modpipe decision train: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        s, c = report["serving"], report["candidate"]
        print(f"held-out labels: {report['held_out_labels']} ({report['held_out_spam']} spam); trained on "
              f"{report['train_labels']} labels x {report['label_weight']:g} + {report['simulated_rows']} simulated posts")
        print(f"serving   {s['version']}: F1 {s['f1']:.4f}  accuracy {s['accuracy']:.4f}  log loss {s['logloss']:.5f}")
        print(f"candidate {c['version']}: F1 {c['f1']:.4f}  accuracy {c['accuracy']:.4f}  log loss {c['logloss']:.5f}")
        print(f"F1 change {report['f1_change']:+.4f}: " + (f"written to {report['written']} (serve it with `modpipe "
                                                               f"decision promote`)" if report["written"] else
                                                               "worse than the serving model, not written"))
    return 0 if report["written"] else 1


def _eval(args: argparse.Namespace) -> int:
    from modpipe.decision.evaluate import evaluate, format_report
    from modpipe.textmodel.artifacts import resolve_model

    if args.ablation and (args.seeds != 1 or args.datasets or args.before):
        print("modpipe decision eval: --ablation trains its own two models on one seed's traffic; it takes no "
              "--seeds, --datasets or --before", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    build = resolve_model(settings)
    if args.ablation:
        from modpipe.decision.evaluate import ablation, format_ablation

        drop = [name.strip() for name in args.ablation.split(",") if name.strip()]
        try:
            report = ablation(settings, build, drop, profile=args.profile or settings.model_profile,
                              train_seed=args.train_seed, n_posts=args.posts, rate=args.rate, seed=args.seed,
                              progress=not args.no_progress)
        except ValueError as exc:
            print(f"modpipe decision eval: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(report, indent=2) if args.json else format_ablation(report))
        return 0
    if args.seeds < 1:
        print("modpipe decision eval: --seeds must be at least 1", file=sys.stderr)
        return 2
    engine = load_engine(settings, build.version, args.model)
    before = load_engine(settings, build.version, args.before) if args.before else None
    datasets = [name.strip() for name in args.datasets.split(",") if name.strip()] if args.datasets else None
    common = {"n_posts": args.posts, "rate": args.rate, "progress": not args.no_progress, "before": before,
              "datasets": datasets}
    try:
        if args.seeds > 1:
            from modpipe.decision.evaluate import evaluate_seeds, format_seeds

            report = evaluate_seeds(settings, build, engine, seeds=range(args.seed, args.seed + args.seeds), **common)
            print(json.dumps(report, indent=2) if args.json else format_seeds(report))
            return 0
        report = evaluate(settings, build, engine, seed=args.seed, **common)
    except ValueError as exc:
        print(f"modpipe decision eval: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
