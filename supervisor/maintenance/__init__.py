"""The supervisor's background services: the lease reaper, the health check, the HTTP endpoint."""
