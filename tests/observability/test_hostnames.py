"""Host names reach ``socket``/``ssl`` as ASCII bytes, so a long-running process never
loads the IDNA codec (stringprep, unicodedata: about 0.4 MiB) for them."""

from __future__ import annotations

import subprocess
import sys

from gpu_share.observability.hostnames import ascii_host


def test_ascii_names_go_as_bytes_others_stay_text() -> None:
    assert ascii_host("localhost") == b"localhost"
    assert ascii_host("127.0.0.1") == b"127.0.0.1"
    assert ascii_host("bücher.example") == "bücher.example"


def test_a_listener_on_a_host_name_loads_no_idna_codec() -> None:
    code = (
        "import sys\n"
        "from gpu_share.observability.http_server import _listen\n"
        "s = _listen('localhost', 0); print(s.getsockname()[0], 'encodings.idna' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[1] == "False" and out[0] in ("127.0.0.1", "::1")
