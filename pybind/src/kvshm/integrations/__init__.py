"""Engine integrations: :mod:`kvshm.integrations.vllm` (a vLLM KV-event publisher plugin) and
:mod:`kvshm.integrations.trtllm` (a drop-in for TensorRT-LLM's KV-event ZMQ publisher)."""
