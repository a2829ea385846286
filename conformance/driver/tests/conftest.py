"""The driver's tests run from conformance/driver (``make conformance``), with kvshm and kvshm_conformance installed."""
