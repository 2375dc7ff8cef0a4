"""The controller daemon: gRPC services, job table, scheduler, durable state."""
