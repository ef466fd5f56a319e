"""Worker ports of the local stack: base + index, or a free port when that one is held."""

import socket

from modpipe.streams.local.stack import worker_port

from modpipe.services.process import free_port, port_free


def test_worker_port_is_base_plus_index_when_free():
    base = free_port()
    assert worker_port(base, 0) == base
    if port_free(base + 2):
        assert worker_port(base, 2) == base + 2


def test_worker_port_moves_when_the_next_port_is_held():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert not port_free(taken)
        chosen = worker_port(taken - 1, 1)
        assert chosen != taken and port_free(chosen)
        assert worker_port(taken, 0) == taken  # worker 0 keeps the configured port: a clash there is the user's


def test_a_benchmark_endpoint_gives_its_workers_a_free_metrics_port(tmp_path):
    """A benchmark beside a running stack (or another benchmark) started a worker that died on the configured
    MODPIPE_METRICS_PORT's "address already in use"."""
    from modpipe.services.broker import scratch_endpoint
    from modpipe.settings import Settings

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        settings = Settings.from_env(state_dir=tmp_path, bootstrap_servers="127.0.0.1:1", metrics_port=taken)
        with scratch_endpoint(settings, "bench") as (scratch, own):
            assert own is None and scratch.bootstrap_servers == "127.0.0.1:1"
            assert scratch.metrics_port != taken and port_free(scratch.metrics_port)
