"""h2spec's conformance cases (summerwind/h2spec: ``generic``, ``http2``, ``hpack``) as
in-house tests against both server backends; see docs/conformance.md."""
