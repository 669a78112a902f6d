"""What every test folder shares: free ports, polling with deadlines, real subprocesses with their logs,
`skiff serve` and router processes, ASGI apps on threads, and a real kube-apiserver with Skiff's CRDs.

Importable as `support` (pytest's `pythonpath` puts tests/ on sys.path)."""
