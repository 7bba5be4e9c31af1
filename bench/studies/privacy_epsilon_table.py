"""The epsilon table of the docs' privacy guide: programlogic.privacy next to dp-accounting
called directly.

Prints two Markdown tables: epsilon after 100/500/1000 rounds for a few (N, k, z)
settings, ours and dp-accounting's (each asked for once, so computed from scratch, with
how long it took),
and the cost of one ``GaussianMechanism.epsilon`` call by RDP and PLD at 100/1000/10000
rounds, cold and cached.

    PYTHONPATH=. python bench/studies/privacy_epsilon_table.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import dp_accounting

from programlogic.privacy import GaussianMechanism

ROUNDS = (100, 500, 1000)
SETTINGS = [
    GaussianMechanism(1.0, 3400, 100),
    GaussianMechanism(1.0, 3400, 100, accountant="pld"),
    GaussianMechanism(1.0, 3400, 100, sampling="uniform"),
    GaussianMechanism(1.0, 3400, 100, sampling="fixed"),
    GaussianMechanism(0.8, 1000, 50),
    GaussianMechanism(0.8, 1000, 50, sampling="uniform"),
    GaussianMechanism(0.5, 3400, 100),
]

COST_DELTA = 1e-6
"""The cost table's delta, which the epsilon table never asks for: ``epsilon`` caches by
(mechanism, rounds, delta), so the cost table's first call of each is cold."""


def delta_for(mechanism: GaussianMechanism) -> float:
    """The table's delta: 1 / N**1.1."""
    return mechanism.num_clients**-1.1


def direct(mechanism: GaussianMechanism, rounds: int, delta: float) -> float:
    """Epsilon from dp-accounting alone: one round's event composed ``rounds`` times."""
    gaussian = dp_accounting.GaussianDpEvent(mechanism.noise_multiplier)
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    n, k = mechanism.num_clients, mechanism.clients_per_round
    if mechanism.sampling == "poisson":
        event = dp_accounting.PoissonSampledDpEvent(k / n, gaussian)
    elif mechanism.sampling == "uniform":
        event = dp_accounting.SampledWithoutReplacementDpEvent(n, k, gaussian)
        relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    else:
        event = gaussian
    if mechanism.accountant == "pld":
        accountant = dp_accounting.pld.PLDAccountant(neighboring_relation=relation)
    else:
        accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(event, rounds)
    return accountant.get_epsilon(delta)


def timed(compute: Callable[[], float]) -> tuple[float, float]:
    """``compute()`` and the seconds it took."""
    start = time.perf_counter()
    value = compute()
    return value, time.perf_counter() - start


def epsilon_table() -> None:
    print(
        "| N | k | z | sampling (adjacency) | accountant | rounds | delta | epsilon (ours) "
        "| epsilon (dp-accounting) | ours, s | dp-accounting, s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mechanism in SETTINGS:
        delta = delta_for(mechanism)
        for rounds in ROUNDS:
            ours, ours_s = timed(lambda: mechanism.epsilon(rounds, delta))  # noqa: B023
            theirs, theirs_s = timed(lambda: direct(mechanism, rounds, delta))  # noqa: B023
            print(
                f"| {mechanism.num_clients} | {mechanism.clients_per_round} "
                f"| {mechanism.noise_multiplier} | {mechanism.sampling} ({mechanism.adjacency}) "
                f"| {mechanism.accountant} | {rounds} | {delta:.3g} | {ours:.4f} | {theirs:.4f} "
                f"| {ours_s:.3f} | {theirs_s:.3f} |",
                flush=True,
            )


def cost_table() -> None:
    print("| accountant | rounds | cold, s | cached, s |")
    print("|---|---|---|---|")
    for accountant in ("rdp", "pld"):
        mechanism = GaussianMechanism(1.0, 3400, 100, accountant=accountant)
        for rounds in (100, 1000, 10000):
            _, cold = timed(lambda: mechanism.epsilon(rounds, COST_DELTA))  # noqa: B023
            _, cached = timed(lambda: mechanism.epsilon(rounds, COST_DELTA))  # noqa: B023
            print(f"| {accountant} | {rounds} | {cold:.3f} | {cached:.6f} |", flush=True)


if __name__ == "__main__":
    epsilon_table()
    print()
    cost_table()
