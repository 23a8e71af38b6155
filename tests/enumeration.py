"""The exact enumeration of a generation run's uniforms, shared by the law tests
(test_generation_law.py tells how it works; test_custom_generate.py and
test_mlx.py run it through other entry points). Needs no torch.

Every threshold a verifier compares a uniform with is one of a few fractions when
every next-token distribution is made of halves; each uniform is replaced by the
midpoint of each cell between those fractions, weighted by the cell's length.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
from specaccept.generation import _loop

F = Fraction
HALVES = (F(0), F(1, 2), F(1))
BLOCK = (F(0), F(1, 4), F(1, 3), F(1, 2), F(1))


def cells(points: tuple[Fraction, ...]) -> list[tuple[float, Fraction]]:
    """The midpoint and length of each cell between consecutive ``points``."""
    return [(float((a + b) / 2), b - a) for a, b in itertools.pairwise(points)]


class Scripted:
    """The loop's randomness (``Randomness``), replaced: the uniform of each
    (request, step, role, index) comes from the request's row of a table."""

    generator = None

    def __init__(self, table: dict[tuple[int, int, str, int], list[float]]):
        self.table = table
        self.steps: dict[int, int] = {}

    def step(self, rows, emitted):
        rows = np.asarray(rows)
        steps = np.array([self.steps.get(int(b), 0) for b in rows])
        for b in rows:
            self.steps[int(b)] = self.steps.get(int(b), 0) + 1
        return rows, steps

    def value(self, b, step, role, i) -> float:
        column = self.table.get((int(step), role, int(i)))
        return 0.5 if column is None else column[int(b)]

    def draft_uniforms(self, keys, shape):
        rows, steps = keys
        return np.array(
            [
                [self.value(b, s, "draft", i) for i in range(shape[1])]
                for b, s in zip(rows, steps, strict=True)
            ]
        ).reshape(shape)

    def verify_uniforms(self, keys, shape):
        rows, steps = keys
        uniforms = np.array(
            [
                [self.value(b, s, "accept", i) for i in range(shape[1])]
                for b, s in zip(rows, steps, strict=True)
            ]
        ).reshape(shape)
        recovery = np.array(
            [self.value(b, s, "recovery", 0) for b, s in zip(rows, steps, strict=True)]
        )
        return uniforms, recovery

    def position_uniforms(self, keys, rows, positions):
        """Seeded deterministic drafts: position 0 is the step's recovery uniform
        (what plain decoding draws), a later position ``t`` its own column."""
        steps = keys[1]
        return np.array(
            [
                self.value(keys[0][r], steps[r], "recovery", 0)
                if t == 0
                else self.value(keys[0][r], steps[r], "position", t)
                for r, t in zip(rows, positions, strict=True)
            ]
        )


def scripted_rows(monkeypatch, prompts, coordinates):
    """One row per (prompt, combination of the ``coordinates``' cells), the loop's
    randomness replaced by the table of each row's uniforms: the rows, as
    ``(prompt index, combination)``."""
    combos = list(itertools.product(*[c[3] for c in coordinates]))
    rows = [(p, combo) for p in range(len(prompts)) for combo in combos]
    table = {
        (step, role, i): [combo[j][0] for _, combo in rows]
        for j, (step, role, i, _) in enumerate(coordinates)
    }
    scripted = Scripted(table)
    monkeypatch.setattr(_loop.Randomness, "of", classmethod(lambda cls, *a: scripted))
    return rows


def weighted_law(rows, outputs, count, length):
    """Each prompt's law of the first ``length`` tokens: every row's output weighted
    by the product of its cells' lengths."""
    laws: list[dict[tuple[int, ...], Fraction]] = [{} for _ in range(count)]
    for (p, combo), tokens in zip(rows, outputs, strict=True):
        weight = F(1)
        for _, cell in combo:
            weight *= cell
        key = tuple(tokens[:length])
        laws[p][key] = laws[p].get(key, F(0)) + weight
    return laws


def sequence_law(next_law, prompt: list[int], length: int) -> dict[tuple[int, ...], Fraction]:
    """The exact law of the next ``length`` tokens after ``prompt``, where
    ``next_law(prefix)`` is the exact next-token law (a list of fractions)."""
    out: dict[tuple[int, ...], Fraction] = {(): F(1)}
    for _ in range(length):
        grown = {}
        for seq, mass in out.items():
            for token, p in enumerate(next_law(prompt + list(seq))):
                if p:
                    grown[(*seq, token)] = mass * p
        out = grown
    return out


def chain_coordinates(accept_points, k=2):
    """A chain of ``k`` drafts, two steps: each step's draft, acceptance and
    recovery uniforms."""
    coords = []
    for step in (0, 1):
        coords += [(step, "draft", i, cells(HALVES)) for i in range(k)]
        coords += [(step, "accept", i, cells(accept_points)) for i in range(k)]
        coords.append((step, "recovery", 0, cells(HALVES)))
    return coords
