"""free_port never hands out the same port twice in one process, even when the kernel offers it again."""

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


def test_a_port_offered_again_is_skipped(monkeypatch):
    monkeypatch.setattr(process.socket, "socket", FakeSocket)
    monkeypatch.setattr(process, "_handed_out", set())
    assert [process.free_port(), process.free_port()] == [40001, 40002]


def test_real_ports_are_distinct():
    ports = [process.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
