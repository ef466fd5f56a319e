"""Every reader of the pipeline's outputs reads `read_committed`: the workers write their outputs in Kafka
transactions, and a `read_uncommitted` consumer (librdkafka's default) would also be given the records of
aborted transactions (a crashed or fenced worker's), which are processed and published again afterwards.

A source scan: each `Consumer(...)` (confluent-kafka) built in the repository must get its configuration from
`Settings.kafka_consumer_config()` or say `read_committed` itself, in the call or in the assignment of the
variable it is given. The runtime's own consumers and the tools that choose their isolation on purpose are
left out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# own consumers: the group consumer (streams/kafka/), the table restore and ban log readers (read_committed by
# their own configuration), and tools that compare isolation levels or measure transports on purpose (group_lag
# reads the end offsets of uncommitted data: records still in flight count as lag; the commit-stall test reads
# the end offset past the last marker)
EXEMPT = ("streams/kafka/", "streams/state/tables.py", "streams/moderation/bans.py", "loadgen/chaos.py", "loadgen/bench/transport.py",
          "modpipe/services/group_lag.py", "tests/integration/test_commit_stall.py")
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist"}
READS_COMMITTED = ("kafka_consumer_config", "read_committed")


def python_files():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if any(part.startswith(".") or part in SKIP_DIRS for part in rel.parts[:-1]):
            continue
        yield rel.as_posix(), path


def is_consumer_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "Consumer") or \
        (isinstance(func, ast.Attribute) and func.attr == "Consumer")


def consumer_configs(source: str):
    """(line, source of the call and of the assignments of a variable it is given) per Consumer(...) call; the
    assignments are looked for in the innermost function around the call (the module outside functions)."""
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not is_consumer_call(node):
            continue
        scope = parent.get(node)
        while scope is not None and not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            scope = parent.get(scope)
        text = ast.get_source_segment(source, node) or ""
        names = {arg.id for arg in node.args if isinstance(arg, ast.Name)}
        names |= {kw.value.id for kw in node.keywords if isinstance(kw.value, ast.Name)}
        for assign in ast.walk(scope or tree):
            if isinstance(assign, ast.Assign) and any(isinstance(target, ast.Name) and target.id in names
                                                      for target in assign.targets):
                text += "\n" + (ast.get_source_segment(source, assign) or "")
        yield node.lineno, text


def test_the_scan_sees_what_it_must():
    unsafe = 'def f(bootstrap):\n    conf = {"bootstrap.servers": bootstrap}\n    return Consumer(conf)\n'
    via_variable = 'def f(s):\n    conf = {**s.kafka_consumer_config(), "group.id": "g"}\n    return Consumer(conf)\n'
    explicit = 'def f():\n    return confluent_kafka.Consumer({"isolation.level": "read_committed"})\n'
    nested = ('def f(s):\n    conf = {**s.kafka_consumer_config()}\n    def g():\n        conf = {}\n'
              '        return Consumer(conf)\n    return g\n')
    assert [any(w in text for w in READS_COMMITTED) for source in (unsafe, via_variable, explicit, nested)
            for _, text in consumer_configs(source)] == [False, True, True, False]
    assert list(consumer_configs("x = GroupConsumer(conf)\ny = AIOKafkaConsumer('t')\n")) == []


def test_every_reader_of_pipeline_outputs_reads_committed_records_only():
    found, unsafe = 0, []
    for rel, path in python_files():
        if rel.startswith(EXEMPT):
            continue
        source = path.read_text(encoding="utf-8")
        if "Consumer(" not in source:
            continue
        for line, text in consumer_configs(source):
            found += 1
            if not any(word in text for word in READS_COMMITTED):
                unsafe.append(f"{rel}:{line}")
    assert found >= 8, "the scan found too few consumers: is it still looking at the repository?"
    assert not unsafe, ("consumers built without Settings.kafka_consumer_config() (or an explicit "
                        f"isolation.level read_committed): {unsafe}")
