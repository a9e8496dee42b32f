"""What runs in an instance process: the frontend (``server``: batching, tokens, the model),
its wire protocol with the gateway (``protocol``) and the model handlers (``models``)."""
