"""The read engine (docs/architecture.md §5): Rust, in the crate engine/, installed by its own
distribution ``qstate-engine`` (which ``qstate[server]`` requires) as the extension module
``qstate_engine``. qstate imports it from here, as ``qstate._engine``; its types are in
``_engine.pyi`` beside this file."""

from qstate_engine import Engine, decode_value, float_json

__all__ = ["Engine", "decode_value", "float_json"]
