"""vLLM's gRPC service (``vllm.grpc.engine.VllmEngine``) on the HTTP port: see
:mod:`llmsim.api.grpc.routes` and docs/grpc.md."""
