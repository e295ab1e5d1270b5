"""Integrations of ``torch_impl`` into trainers; each imports its trainer only when called."""
