"""The control plane (runs in the server process): the reconcile loop (``loop``), the state
database (``state``) and the live profiler (``profiler``)."""
