"""What runs once per node: the node agent (``agent``, a Ray actor), the instance template
(``launcher``) and its one-off jobs (``tasks``), the shared-memory model store
(``model_store``) and the spatial partition of a device (``partition``)."""
