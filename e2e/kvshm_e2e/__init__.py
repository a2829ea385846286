"""make e2e: a real vLLM engine through its whole life, judged by a real router (e2e/README.md).

Modules by concern (processes, HTTP, the shared kvshmd and tables come from ``kvshm_testkit``): :mod:`.engine`
(the tiny model and the vLLM OpenAI server), :mod:`.judges` (Dynamo 1.6.1's standalone indexer, kvshmd's
``/kv_recover``, the wire recorder), :mod:`.truth` (vLLM's own BlockPool, written by the ``kvshm_e2e_truth`` plugin),
:mod:`.scenarios` (the lifecycle steps per publisher and daemon mode), :mod:`.table` (rows, goals, the printed
table).
"""
