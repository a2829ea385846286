"""kvshm's conformance driver: kvshm against the real Dynamo 1.6.1 ``LocalKvIndexer``.

Two checks, one summary table (``python -m kvshm_conf``, run by ``make conformance``):

* :mod:`kvshm_conf.differential`: seeded random event streams fed to kvshm's ``LocalIndexer`` (a private kvshmd)
  and to the reference ``kvshm_conformance.LocalIndexer`` (Dynamo's crate) side by side; every query's pair of
  answers is classified as identical bytes, the same state rebuilt by the reference consumer, a documented
  deviation (:mod:`kvshm_conf.deviations`), or a failure.
* :mod:`kvshm_conf.topologies`: the real deployments end to end through ``kvshmd serve --http`` and a consumer
  doing HTTP GETs as deepinfra's global indexer does; the recovered state must equal a consumer that saw every
  event live.

Traces (:mod:`kvshm_conf.ops`) are recorded with ``python -m kvshm_conf record`` and checked without Rust by the
Go package ``conformance/tracecheck``.
"""
