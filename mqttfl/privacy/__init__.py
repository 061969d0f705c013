"""Differential privacy for uploads: the mechanisms (clipping and Gaussian noise) and the
accountant (Google's dp-accounting), for the run's ``[privacy]`` table."""
