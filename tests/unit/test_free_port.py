"""free_port hands out listening ports that no client connection can take, and never the same one twice."""

import socket

from modpipe.services import process


class FakeSocket:
    offers = [40001, 40001, 40001, 40002]  # the kernel recycles a closed port

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def bind(self, addr):
        self.port = FakeSocket.offers.pop(0)

    def getsockname(self):
        return ("127.0.0.1", self.port)


def test_without_a_range_below_the_ephemeral_one_a_port_offered_again_is_skipped(monkeypatch):
    monkeypatch.setattr(process, "_listen_range", lambda: (0, 0))
    monkeypatch.setattr(process.socket, "socket", FakeSocket)
    monkeypatch.setattr(process, "_handed_out", set())
    assert [process.free_port(), process.free_port()] == [40001, 40002]


def test_real_ports_are_distinct_spaced_and_below_the_ephemeral_range():
    low, _ = (int(x) for x in process._EPHEMERAL_RANGE.read_text().split())
    ports = sorted(process.free_port() for _ in range(50))
    assert all(10000 <= p < low - process._SPACING for p in ports)
    assert all(b - a >= process._SPACING for a, b in zip(ports, ports[1:], strict=False))
    assert all(process.port_free(p) for p in ports)


def test_a_port_someone_listens_on_is_skipped(monkeypatch):
    free = process.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        offers = iter([taken, free])
        monkeypatch.setattr(process.random, "randrange", lambda lo, hi: next(offers))
        monkeypatch.setattr(process, "_listen_range", lambda: (10000, 65000))
        monkeypatch.setattr(process, "_handed_out", set())
        assert process.free_port() == free

