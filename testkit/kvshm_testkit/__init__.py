"""kvshm_testkit: what every kvshm test harness shares (e2e, cluster, bench, the conformance driver, the soak).

* :mod:`.procs`: :class:`Proc` (a child in its own process group, log or JSON-line pipes), :func:`wait_until`
  and :class:`Timeout` (every wait bounded), :func:`kill_live`, /proc readings.
* :mod:`.net`: :func:`free_port`, :func:`http_get` / :func:`http_post` (a :class:`Response`, never an exception
  for a peer's failure), :func:`get_json`.
* :mod:`.daemon`: :class:`Kvshmd`, a ``kvshmd serve`` started with its flags and health-checked.
* :mod:`.recover`: :func:`serve_kv_recover`, the engine-served ``/kv_recover`` (the baseline).
* :mod:`.judge`: :func:`extra_missing`, the extra/missing judge.
* :mod:`.table`: :func:`markdown_table`.
* :mod:`.report`: :func:`run_steps` and :func:`finish`, how an engine harness runs its modes and ends.
* :mod:`.indexedset`: :class:`IndexedSet`, the O(1) set a seeded workload generator picks from.

The contract (what is stable, what each piece promises) is testkit/README.md.
"""

from .daemon import Kvshmd
from .indexedset import IndexedSet
from .judge import ExtraMissing, extra_missing, extra_missing_keyed
from .net import HTTPStatusError, Response, free_port, get_json, http_get, http_post, request
from .procs import LIVE, Proc, Timeout, cpu_seconds, kill_live, proc_state, rss_bytes, wait_until
from .recover import EventsSource, serve_kv_recover
from .report import finish, run_steps
from .table import markdown_table

__all__ = [
    "LIVE",
    "EventsSource",
    "ExtraMissing",
    "HTTPStatusError",
    "IndexedSet",
    "Kvshmd",
    "Proc",
    "Response",
    "Timeout",
    "cpu_seconds",
    "extra_missing",
    "extra_missing_keyed",
    "finish",
    "free_port",
    "get_json",
    "http_get",
    "http_post",
    "kill_live",
    "markdown_table",
    "proc_state",
    "request",
    "rss_bytes",
    "run_steps",
    "serve_kv_recover",
    "wait_until",
]
