"""Process plumbing shared by the runtime's server and the router: child-process setup (logging, signals,
dying with the parent) and several worker processes on one port (SO_REUSEPORT sockets, prometheus-client's
multiprocess mode, sibling processes). Torch-free, so the router's slim image imports it."""
