"""Dependency-free contracts shared by the trainer side and the service.

Both `trainer_hooks` (installed into training images) and `monitor` (the service) import
this package, so it must only ever use the standard library.

- `metrics`: canonical metric names; `wire`: the ingest wire format; `spool`: the client's spool;
- `trainer_keys`: trainer key -> canonical name, once per trainer family (adapters and importers);
- `directive`: the directive's wire shape, its one parser and the default LLDS lambda.
"""
