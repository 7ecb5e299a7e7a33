"""Dependency-free contracts shared by the trainer side and the service.

Both `trainer_hooks` (installed into training images) and `monitor` (the service) import
this package, so it must only ever use the standard library.
"""
