"""Client side of lldmon: measure likelihood displacement inside training jobs and stream it.

Installed into training images, so it never imports `monitor`, fastapi, sqlalchemy or dash, and
imports torch/trl/verl lazily inside the modules that need them.
"""
