"""The Open Inference Protocol v2 (KServe v2 / Triton), shared by the two processes that speak
it: the gateway, which parses a request's header and forwards its body untouched behind a
small envelope, and the instance, which decodes the tensors and encodes the answer.

* ``header`` — the protocol's documents: the infer header (``parse_header``), the envelope
  (``wrap`` / ``unwrap``), ``OipError``, the handler's tensor specs;
* ``codec`` — tensors: JSON ``data`` and the binary extension ↔ numpy, the handler's input and
  outputs;
* ``grpc_messages`` — ``inference.ModelInferRequest`` / ``Response`` ↔ the same;
* ``payload`` — the instance's entry points ``decode_request`` / ``encode_response``.

The gateway's HTTP and gRPC front ends (``gateway.oip_http``, ``gateway.grpc_server``,
``gateway.oip_service``, ``gateway.triton_ext``) import from here; nothing here imports the
gateway.
"""
