from __future__ import annotations

import pytest

from kvshm_testkit import ExtraMissing, extra_missing, extra_missing_keyed, markdown_table


@pytest.mark.parametrize(("got", "truth", "want", "text"), [
    (set(), set(), (0, 0), "exact"),
    ({1, 2}, {1, 2}, (0, 0), "exact"),
    ({1, 2, 3}, {1, 2}, (1, 0), "+1 -0"),
    ({1}, {1, 2, 4}, (0, 2), "+0 -2"),
    ({5, 6}, {1}, (2, 1), "+2 -1"),
])
def test_extra_missing(got: set[int], truth: set[int], want: tuple[int, int], text: str) -> None:
    r = extra_missing(got, truth)
    assert r == want and str(r) == text and r.exact == (want == (0, 0))


def test_extra_missing_keyed_counts_unknown_streams_as_extra() -> None:
    truth = {(1, 0): frozenset({1, 2}), (1, 1): frozenset({3})}
    got = {(1, 0): {1, 2, 9}, (2, 0): {7, 8}}
    assert extra_missing_keyed(got, truth) == ExtraMissing(extra=3, missing=1)
    assert extra_missing_keyed(truth, truth).exact


def test_markdown_table_plain_and_padded() -> None:
    rows = [["a", "1"], ["bbb", "22"]]
    assert markdown_table(["k", "v"], rows) == "| k | v |\n|---|---|\n| a | 1 |\n| bbb | 22 |"
    assert markdown_table(["k", "v"], rows, pad=True) == (
        "| k   | v  |\n|-----|----|\n| a   | 1  |\n| bbb | 22 |")


def test_markdown_table_rejects_a_ragged_row() -> None:
    with pytest.raises(ValueError, match="2 cells"):
        markdown_table(["a", "b", "c"], [["x", "y"]])
