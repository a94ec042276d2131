"""The core layer: specs, builds, the builder and its watchdog, passes, ops, families, late compiles, listing by
replay, and the registry of what backends provide (``extensions``). It imports ``_config`` and ``_runtime``, never
a backend. Importing this package imports none of its modules.
"""
