"""Live runtime: the mechanisms that run gshare's policies with real processes (docs/DESIGN.md §5).

Nothing here decides: decisions come from ``gshare.policy``; this package never imports
``gshare.sim``. Modules: ``tokens_uds`` (per-device time-token server and instance client over a
Unix domain socket), and the serving stack built on it (models, model store, partitions, node
agent, instances, controller, gateway).
"""
