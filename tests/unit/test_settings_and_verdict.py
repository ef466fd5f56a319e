"""Settings from the environment, verdict thresholds, and the status line's histogram quantiles."""

import pytest
from modpipe.streams.local.stack import histogram_quantile

from modpipe.decision.verdict import ThresholdDecider, verdict_for
from modpipe.settings import RECEIVE_MESSAGE_MAX_BYTES, Settings, SettingsError


def test_defaults_and_overrides():
    s = Settings.from_env({})
    assert s.partitions == 4 and s.max_batch == 64 and s.triton_url == ""
    s = Settings.from_env({"MODPIPE_PARTITIONS": "8", "MODPIPE_TOPIC_PREFIX": "prod."})
    assert s.partitions == 8 and s.topic("posts") == "prod.posts"


@pytest.mark.parametrize("env", [
    {"MODPIPE_PARTITIONS": "four"},
    {"MODPIPE_REVIEW_THRESHOLD": "0.95", "MODPIPE_BLOCK_THRESHOLD": "0.9"},
    {"MODPIPE_COMMIT_INTERVAL_MS": "0"},
    {"MODPIPE_FETCH_PAUSE_MS": "-1"},
    {"MODPIPE_FETCH_IDLE_PAUSE_MS": "-5"},
    {"MODPIPE_LOCAL_HOPS": "sometimes"},
    {"MODPIPE_MAX_BATCH": "0"},
])
def test_bad_settings_are_refused(env):
    with pytest.raises(SettingsError):
        Settings.from_env(env)


def test_kafka_client_config_passes_security_through():
    conf = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "b1:9093,b2:9093", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                              "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_SASL_USERNAME": "u",
                              "KAFKA_SASL_PASSWORD": "p", "KAFKA_SSL_CAFILE": "/ca.pem"}).kafka_client_config()
    assert conf.pop("logger").name == "librdkafka"
    assert conf == {"bootstrap.servers": "b1:9093,b2:9093", "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "p",
                    "ssl.ca.location": "/ca.pem", "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES}


def test_every_client_accepts_fetch_responses_past_100_mb():
    # librdkafka's default (100 MB) rejects the embedded broker's oversized fetch responses, and the client
    # then retries the same fetch for ever; librdkafka itself must accept the limit with its fetch defaults.
    from confluent_kafka import Consumer, Producer

    settings = Settings.from_env({})
    conf = settings.kafka_client_config()
    assert conf["receive.message.max.bytes"] >= 1_000_000_000
    Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": "127.0.0.1:1", "group.id": "g"}).close()
    Producer({**conf, "bootstrap.servers": "127.0.0.1:1"}).flush(0)


def test_kafka_consumer_config_reads_committed_records_only():
    settings = Settings.from_env({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": "/ca.pem"})
    client, consumer = settings.kafka_client_config(), settings.kafka_consumer_config()
    assert consumer.pop("isolation.level") == "read_committed"
    assert consumer.pop("logger").name == client.pop("logger").name == "librdkafka"
    assert consumer == client  # the same brokers and security settings


def test_round_trip_through_child_environment():
    s = Settings.from_env({"MODPIPE_MAX_WAIT_MS": "7.5", "MODPIPE_WORKERS": "3"})
    assert Settings.from_env(s.to_env()) == s


@pytest.mark.parametrize("p,expected", [(0.0, "allow"), (0.49, "allow"), (0.5, "review"), (0.89, "review"),
                                        (0.9, "block"), (1.0, "block")])
def test_thresholds(p, expected):
    assert verdict_for(p, 0.5, 0.9) == expected
    v = ThresholdDecider(0.5, 0.9).decide_many([{"text_probability": p}])[0]
    assert v.verdict == expected and v.spam_probability == p and v.reasons[0]["feature"] == "text_probability"


def test_histogram_quantile_interpolates_like_promql():
    name = "lat"
    samples = {f"{name}_bucket{{le=0.1}}": 50, f"{name}_bucket{{le=0.2}}": 100, f"{name}_bucket{{le=+Inf}}": 100}
    assert histogram_quantile(samples, name, 0.5) == pytest.approx(0.1)
    assert histogram_quantile(samples, name, 0.75) == pytest.approx(0.15)
    assert histogram_quantile({}, name, 0.5) is None


def _subcommand_paths(parser, prefix=()):
    """Every command path of the CLI: (), ("model",), ("model", "build"), ..."""
    import argparse

    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommand_paths(sub, (*prefix, name))


def test_every_command_has_working_help(capsys):
    from modpipe.cli import build_parser

    paths = list(_subcommand_paths(build_parser()))
    assert ("loadgen",) in paths and ("bench", "features") in paths and ("decision", "eval") in paths
    for path in paths:
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args([*path, "--help"])
        assert exc.value.code == 0, path
        assert "usage: modpipe" in capsys.readouterr().out, path
