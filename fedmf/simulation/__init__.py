"""Simulation layer (programs): client timers, synthetic federated data and training drivers."""
