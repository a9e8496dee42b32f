"""Live runtime: the mechanisms that run gshare's policies with real processes (docs/DESIGN.md §5).

Nothing here decides: decisions come from ``gshare.policy``; this package never imports
``gshare.sim``. One folder per process: ``control/`` and ``gateway/`` run in the server process
(``server``), ``node/`` once per node (the node agent and the instance template), ``instance/``
in every instance process; ``tokens/`` is the time-token protocol between instances and their
node's agent; ``messages`` the typed contract between agent and controller; ``client`` the
HTTP client.
"""
