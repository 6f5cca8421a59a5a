"""fedforge: federated learning research simulator."""
__version__ = "0.1.0"
