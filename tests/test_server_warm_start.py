"""The API server imports anyio's asyncio backend before it accepts a connection: imported
inside the first stream instead (~30 ms), it held the engine's first tokens back and sent
them to the client in one burst."""

import subprocess
import sys
import textwrap

BACKEND = "anyio._backends._asyncio"


def test_anyio_backend_is_imported_before_the_first_request():
    code = textwrap.dedent(
        f"""
        import sys
        from starlette.applications import Starlette
        from cbbench.reference_engine.server.runner import ThreadedServer
        assert {BACKEND!r} not in sys.modules, "imported before the server started"
        with ThreadedServer(Starlette()) as url:
            print({BACKEND!r} in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "True", out.stderr
