"""`modpipe` command line. Each area registers its own subcommands; this file only assembles them."""

from __future__ import annotations

import argparse
import importlib
import sys

from modpipe import __version__, exits, log, output
from modpipe.settings import SETTINGS_SPEC, Settings, SettingsError

# Modules exposing `register(subparsers)`; each owns its commands' arguments and handlers.
COMMAND_MODULES = [
    "modpipe.textmodel.cli",     # model build | model eval
    "modpipe.serving.cli",       # triton | classify | bench model
    "modpipe.evaluation.cli",    # registers
    "modpipe.decision.cli",      # decision train | decision eval
    "modpipe.streams.cli",               # broker | topics | worker | up
    "modpipe.loadgen.cli",               # loadgen | smoke | demo | bench [features] | chaos | fuzz
    "modpipe.console.cli",               # console
]

# Commands that register only their own module: `modpipe worker` is what production runs, and its process
# must not load the load generator, the simulation or training code just to parse its command line.
LEAN_COMMANDS = {"worker": "modpipe.streams.cli"}


def effective_settings() -> dict[str, object]:
    """Every setting by its environment variable, secrets masked."""
    settings = Settings.from_env()
    out = {}
    for name, spec in SETTINGS_SPEC.items():
        value = getattr(settings, name)
        if ("PASSWORD" in spec.env or "TOKEN" in spec.env) and value:
            value = "***"
        out[spec.env] = value
    return out


def _config(args: argparse.Namespace) -> int:
    # without --json: the lines an env file or `export` takes
    output.emit(effective_settings(), args.json, lambda d: "\n".join(f"{k}={v}" for k, v in d.items()))
    return 0


JSON_HELP = "print one JSON object on stdout (machine output)"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command's parser; when `argv` names a command of LEAN_COMMANDS, only its module's."""
    command = next((a for a in argv or () if not a.startswith("-")), None)
    modules = [LEAN_COMMANDS[command]] if command in LEAN_COMMANDS else COMMAND_MODULES
    parser = argparse.ArgumentParser(
        prog="modpipe",
        description="Real-time spam moderation: Kafka posts -> features -> Triton text model -> decisions. "
                    "Every setting is an environment variable; `modpipe config` prints them.")
    parser.add_argument("--version", action="version", version=f"modpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cfg = sub.add_parser("config", help="print the effective settings (environment variables)")
    cfg.add_argument("--json", action="store_true", help=JSON_HELP)
    cfg.set_defaults(func=_config)
    for module in modules:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # area not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"modpipe: configuration error: {exc}", file=sys.stderr)
        return 2
    log.configure(settings.log_level, settings.log_format)
    from modpipe.decision.model import DecisionModelMissing, FeatureListMismatch
    from modpipe.textmodel.artifacts import ModelNotBuilt

    exits.raise_on_signals()  # commands that stop gracefully install their own handlers
    try:
        return int(args.func(args) or 0)
    except (FeatureListMismatch, DecisionModelMissing, ModelNotBuilt) as exc:  # a missing or unusable build
        print(f"modpipe: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, exits.Terminated) as exc:
        return exits.status_of(exc)


if __name__ == "__main__":
    sys.exit(main())
