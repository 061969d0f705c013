"""Tools for load tests and benchmarks: the torch-free load client."""
