"""modpipe.serving.server helpers that need no running Triton."""

import subprocess
import sys

from modpipe.serving import server


def test_pytriton_root_is_the_bundled_tree():
    root = server.pytriton_root()
    assert (root / "bin" / "tritonserver").is_file()
    assert (root / "backends" / "python").is_dir()


def test_pytriton_root_does_not_import_pytriton():
    # `import pytriton` pulls in its client (gevent, zmq): a serving host that carries only the server
    # binary must still find it. Run in a fresh interpreter so no earlier test has imported either.
    code = ("import sys; from modpipe.serving.server import pytriton_root; pytriton_root(); "
            "print(sorted(m for m in ('pytriton', 'gevent', 'zmq') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
