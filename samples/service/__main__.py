"""Serve the sample training service with uvicorn.

    python -m samples.service [--data-dir runs/service] [--host 127.0.0.1] [--port 8000]

It listens on 127.0.0.1 unless told otherwise. On any other address it needs a bearer
token, read from the environment variable PROGRAMLOGIC_SERVICE_TOKEN (at least 16
printable ASCII characters, no whitespace); on loopback the token is optional and
enforced when set. SIGTERM or Ctrl-C stops it: running runs keep their checkpoints and
resume at the next start. One service at a time per data directory: a second one on
the same directory refuses to start.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import logging
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TOKEN_VARIABLE = "PROGRAMLOGIC_SERVICE_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prepare_process() -> None:
    """Load what training needs and tune the garbage collector, before serving.

    A full garbage collection holds the GIL, so it stalls the event loop whichever
    thread starts it: 0.4-1 s each were measured while runs started on a loaded
    machine, walking the ~400,000 objects of TensorFlow and Keras. Loaded first and
    frozen, those are out of its sight; and full collections come at most every 100
    (not 10) collections of the middle generation, while tracing makes many
    long-lived objects.
    """
    from samples.service.runs import load_training

    load_training()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m samples.service", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("runs/service"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    arguments = parser.parse_args(argv)
    token = os.environ.get(TOKEN_VARIABLE) or None
    if token is None and not is_loopback(arguments.host):
        parser.error(f"listening on {arguments.host} needs a token in ${TOKEN_VARIABLE}")
    from samples.service.config import check_token
    from samples.service.lock import DataDirectoryLockedError, check_unlocked

    if token is not None:
        try:
            check_token(token)
        except ValueError as error:
            parser.error(f"${TOKEN_VARIABLE}: {error}")
    try:
        check_unlocked(arguments.data_dir)
    except DataDirectoryLockedError as error:
        parser.exit(2, f"{parser.prog}: {error}\n")

    import uvicorn

    from samples.service.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    prepare_process()
    app = create_app(arguments.data_dir, token=token)
    uvicorn.run(
        app,
        host=arguments.host,
        port=arguments.port,
        log_level="info",
        timeout_graceful_shutdown=5,  # open event streams must not hold a shutdown up
    )


if __name__ == "__main__":
    main()
