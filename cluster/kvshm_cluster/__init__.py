"""The cluster judge: N nodes in network namespaces, each with its own ``kvshmd serve`` and seeded
engine-like producers, M real routers (Dynamo 1.6.1's standalone indexer) in their own namespaces over TCP, faults
injected, every router's ``/dump`` judged against every producer's own model of its cache. docs/deploy.md says why."""
