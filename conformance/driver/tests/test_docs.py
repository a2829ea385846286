"""One home per fact: the deviation ids of the driver are the rows of conformance/README.md's table."""

from __future__ import annotations

import re
from pathlib import Path

from kvshm_conf.deviations import DEVIATIONS
from kvshm_conf.topologies import lost_ids


def test_deviation_ids_match_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    ids = re.findall(r"(?m)^\| (D[0-9]+) \|", readme)
    assert sorted(ids) == sorted(DEVIATIONS)


def test_lost_ids_header() -> None:
    assert lost_ids("80-80,95-97") == {80, 95, 96, 97}
    assert lost_ids("unknown-5,7-8") == {7, 8}
    assert lost_ids("") == set()
