"""turboinfer: take a trained model and make it answer fast."""

__version__ = "0.1.0"
