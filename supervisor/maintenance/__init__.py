"""The supervisor's background services: the lease reaper, the health check, retention of
finished tasks, the HTTP endpoint."""
