"""The engine harnesses' ending: the step guard and the verdict."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvshm_testkit import IndexedSet, finish, run_steps


def test_run_steps_counts_the_rows_after_the_run() -> None:
    rows: list[int] = []
    assert run_steps(lambda: rows.extend([1, 2, 3]), rows) == (True, "3 steps")


def test_run_steps_says_what_ended_the_mode(capsys: pytest.CaptureFixture[str]) -> None:
    def boom() -> None:
        raise TimeoutError("engine: not within 60 s")

    ok, why = run_steps(boom, [])
    assert not ok
    assert why == "TimeoutError: engine: not within 60 s"
    assert "Traceback" in capsys.readouterr().err


def test_run_steps_cuts_a_long_reason() -> None:
    def boom() -> None:
        raise RuntimeError("x" * 1000)

    assert run_steps(boom, []) == (False, "RuntimeError: " + "x" * 300)


@pytest.mark.parametrize(("misses", "code"), [([], 0), (["kvshm shared: +2 -0"], 1)])
def test_finish_writes_prints_and_exits(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        misses: list[str], code: int) -> None:
    assert finish(tmp_path, "| a |\n|---|", "make x: 1 rows", misses) == code
    assert (tmp_path / "table.md").read_text() == "| a |\n|---|\n"
    out = capsys.readouterr().out
    assert "| a |" in out and "make x: 1 rows" in out
    assert ("  miss: kvshm shared: +2 -0" in out) == bool(misses)


def test_indexed_set_against_a_set() -> None:
    rng = random.Random(7)
    s, model = IndexedSet(), set[int]()
    for _ in range(5000):
        x = rng.randrange(64)
        if rng.random() < 0.5:
            s.add(x)
            model.add(x)
        else:
            s.discard(x)
            model.discard(x)
        assert len(s) == len(model) and sorted(s.items) == sorted(model)
        assert all(s.items[s.pos[y]] == y for y in model)
    assert (3 in s) == (3 in model)
    if s:
        assert s.choice(rng) in model
    s.clear()
    assert not s
    with pytest.raises(IndexError):
        s.choice(rng)


def test_indexed_set_choice_draws_as_random_choice() -> None:
    """A generator's seeded stream must not change when it picks through the set instead of the list."""
    s = IndexedSet()
    for x in range(10, 30):
        s.add(x)
    a, b = random.Random(3), random.Random(3)
    assert [s.choice(a) for _ in range(50)] == [b.choice(s.items) for _ in range(50)]
