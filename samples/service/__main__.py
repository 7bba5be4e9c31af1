"""Serve the sample training service with uvicorn.

On 127.0.0.1 (the default) the bearer token in $PROGRAMLOGIC_SERVICE_TOKEN is optional;
on any other address it is needed. Requests must name the service in Host: on loopback
localhost, 127.0.0.1 or [::1]; elsewhere the address or an --allowed-host (needed on
0.0.0.0 or ::). SIGTERM or Ctrl-C cancels the runs, which resume at the next start; what
cannot be interrupted gets --shutdown-grace seconds, then the process ends (128 + the
signal). A second service on the same data directory refuses to start.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import threading
from pathlib import Path
from types import FrameType

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before anything imports TensorFlow

import uvicorn

from samples.service.app import LOOPBACK_HOSTS, allowed_hosts, create_app
from samples.service.runs import DataDirectoryError
from samples.service.training import load_training

TOKEN_VARIABLE = "PROGRAMLOGIC_SERVICE_TOKEN"

logger = logging.getLogger("samples.service")


def prepare_process() -> None:
    """Load what training needs and tune the garbage collector, before serving.

    A full collection holds the GIL and stalls the event loop (0.4-1 s were measured
    walking TensorFlow's and Keras's objects on a loaded machine): loaded first and
    frozen, those are out of its sight, and full collections come 10 times rarer.
    """
    load_training()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m samples.service", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("runs/service"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="a name clients reach the service by (in Host); repeatable",
    )  # fmt: skip
    parser.add_argument("--max-running", type=int, default=4, metavar="N")
    parser.add_argument("--shutdown-grace", type=float, default=5.0, metavar="SECONDS")
    arguments = parser.parse_args(argv)
    token = os.environ.get(TOKEN_VARIABLE) or None
    hosts = allowed_hosts(arguments.host, arguments.allowed_host)
    if token is None and hosts[: len(LOOPBACK_HOSTS)] != list(LOOPBACK_HOSTS):
        parser.error(f"listening on {arguments.host} needs a token in ${TOKEN_VARIABLE}")
    if not hosts:
        parser.error(
            f"listening on {arguments.host} needs --allowed-host NAME: the names clients use"
        )
    if arguments.max_running < 1 or arguments.shutdown_grace < 0:
        parser.error("--max-running must be at least 1, --shutdown-grace not negative")
    try:  # before loading anything: a refusal is quick
        app = create_app(
            arguments.data_dir, token=token, allowed_hosts=hosts, max_running=arguments.max_running
        )
    except ValueError as error:  # what create_app checks beyond the above: the token
        parser.error(f"${TOKEN_VARIABLE}: {error}")
    except DataDirectoryError as error:
        parser.exit(2, f"{parser.prog}: {error}\n")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    prepare_process()
    # Open event streams get a second at a stop; then the runs are cancelled.
    grace = min(1.0, arguments.shutdown_grace)
    config = uvicorn.Config(
        app, arguments.host, arguments.port, log_level="info", timeout_graceful_shutdown=grace
    )
    _GracefulServer(config, arguments.shutdown_grace).run()


class _GracefulServer(uvicorn.Server):
    """uvicorn's server, ended ``grace`` seconds after the first stop signal at the latest."""

    def __init__(self, config: uvicorn.Config, grace: float) -> None:
        super().__init__(config)
        self.grace, self.timer = grace, None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.timer is None:
            self.timer = threading.Timer(self.grace, self._end, (sig,))
            self.timer.daemon = True
            self.timer.start()

    def _end(self, sig: int) -> None:
        logger.warning("still stopping %.1f s after signal %d: ending the process", self.grace, sig)
        logging.shutdown()
        os._exit(128 + sig)


if __name__ == "__main__":
    main()
