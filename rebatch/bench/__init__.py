"""rebatch's benchmarks: torch_impl against the per-row baseline, the copy limit and the JAX reference."""
