"""The runtime layer: processes and the host. It imports only ``buildops._config``, never the core or a backend.

``state`` (the layer's process-wide state, and what a forked child and a test's reset drop of it), ``forking``
(what a forked child forgets), ``patching`` (temporary patches of third-party functions), ``hooks``
(what the layers above ask to run at shutdown and reset), ``gil`` (the switch interval while builds run),
``node`` (claims shared by a node's processes), ``gpu`` (worker streams and the memory gate), ``pools`` (worker
processes). Importing this package imports none of them.
"""
