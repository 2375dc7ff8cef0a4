"""The shared leaves every part may import, and which import no other part of burstctl.

``limits`` (the bounds every door checks), ``units`` (sizes and rates in text),
``channels`` (the credentials of a gRPC channel: TLS, client certificate, shared
secret) and ``files`` (durable files: atomic writes, unreadable files kept aside).
"""
