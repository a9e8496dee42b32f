"""Generative functions in an instance: the handler contract (``contract``), the built-in causal
LM (``causal_lm``, its byte tokenizer ``tokenizer`` and decoding ``sampling``) and the
iteration-level batching engine (``engine``). The guide is docs/generative.md."""
