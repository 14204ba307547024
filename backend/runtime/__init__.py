"""The worker process's side, torch-free: how our processes are started and ended, the one writer of events,
the stop listener and the Hub-kernels switch. Used by the jobs and the libraries they compose; the clients
reach process argv and environment through backend.api.launch."""
